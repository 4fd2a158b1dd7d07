// Where a process started by an external launcher sits in the world.
//
// [Note: ranks from an external launcher] torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; SLURM's
// srun sets SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID. tdc reads torchrun's names first and
// SLURM's where torchrun's are absent, so `srun tdc-cli run --launcher env` works as torchrun
// does (MASTER_ADDR and MASTER_PORT are still needed: SLURM has no rendezvous of its own). The
// env launcher (launcher.cpp) rendezvous with them, and `tdc run` writes the run's files on rank 0
// only ([Note: rank 0 writes the run], cli/run.cpp).
#pragma once

#include <optional>

namespace tdc::harness {

struct ExternalRank {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;  // LOCAL_RANK / SLURM_LOCALID, else the rank
};

// From the environment, or nullopt when neither launcher's rank variable is set. Throws
// std::invalid_argument naming the variable and its value when one is not an integer.
std::optional<ExternalRank> external_rank();

}  // namespace tdc::harness
