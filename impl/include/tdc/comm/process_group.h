// Process groups over c10d backends (Gloo on CPU, NCCL on CUDA, plug-ins), and the default
// ("world") group of the calling rank. The default group is per thread, so thread-launched
// ranks each have their own.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tdc/comm/reduce_op.h"

namespace tdc::comm {

struct GroupOptions {
  std::string backend = "gloo";     // registry name
  std::string device_type = "cpu";  // device the group's tensors live on
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  std::string name;  // for messages; default "world" / "group<k>"
};

class ProcessGroup {
 public:
  // Collective: every rank in [0, size) must call it with the same store and options.
  static std::shared_ptr<ProcessGroup> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                              const GroupOptions& options, std::vector<int> global_ranks = {});

  int rank() const { return rank_; }  // rank inside this group
  int size() const { return size_; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  int global_rank(int group_rank) const { return global_ranks_.at(group_rank); }
  const std::string& name() const { return options_.name; }
  const std::string& backend_name() const { return options_.backend; }
  const std::string& device_type() const { return options_.device_type; }
  const GroupOptions& options() const { return options_; }
  c10d::Backend& backend() const { return *backend_; }
  const c10::intrusive_ptr<c10d::Backend>& backend_ptr() const { return backend_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

  // What the backend does natively; everything else is emulated by tdc::comm (visibly: see
  // docs/architecture.md, "Emulations", and [Note: native ops or emulation]).
  bool native_avg() const { return native_avg_; }
  // Unset until the first reduce-scatter tells, for a backend that did not declare it.
  std::optional<bool> native_reduce_scatter() const { return native_reduce_scatter_; }
  // What the first reduce-scatter found out (collectives.cpp).
  void learned_native_reduce_scatter(bool native) { native_reduce_scatter_ = native; }
  // [Note: a reduce-scatter by all-to-all, in the ring's order] (backend_registry.h): whether a
  // SUM or AVG reduce-scatter of this group runs as all-to-all plus a local sum.
  bool reduce_scatter_by_alltoall(ReduceOp op) const {
    return alltoall_reduce_scatter_ && size_ >= 2 && (op == ReduceOp::SUM || op == ReduceOp::AVG);
  }
  // Inputs of at least this many bytes per rank are large: large all-gathers go by sends and
  // receives, small all-reduces by all-to-all (the Notes below).
  static constexpr int64_t kSmallInputBytes = 64 * 1024;
  // [Note: a large all-gather by sends and receives] (backend_registry.h): whether an all-gather
  // of `input_bytes` per rank runs as sends and receives on this group.
  bool all_gather_by_p2p(int64_t input_bytes) const {
    return p2p_all_gather_ && size_ >= 3 && input_bytes >= kSmallInputBytes;
  }
  // [Note: gathers by all-to-all] (backend_registry.h): whether an all-gather of `input_bytes`
  // per rank, or an all-reduce of `t`, runs as one all-to-all on this group.
  bool all_gather_by_alltoall(int64_t input_bytes) const {
    return alltoall_gathers_ && size_ >= 2 && input_bytes > 0 && !all_gather_by_p2p(input_bytes);
  }
  bool all_reduce_by_alltoall(ReduceOp op, const at::Tensor& t) const;
  // Point-to-point tags from here up belong to tdc::comm's collectives (send / recv refuse them).
  static constexpr uint32_t kCollectiveTagBase = 1u << 30;
  // The tag of this group's next collective made of sends and receives: the same on every rank.
  int next_collective_tag();
  // Use tdc's emulations of AVG and reduce-scatter on this group even where the backend has them
  // natively (tests of the emulations; a backend whose native op misbehaves).
  void use_emulations() {
    native_avg_ = false;
    native_reduce_scatter_ = false;
  }

  ProcessGroup(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> backend, int rank, int size,
               GroupOptions options, std::vector<int> global_ranks);

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  int rank_, size_;
  GroupOptions options_;
  std::vector<int> global_ranks_;
  bool native_avg_ = false;
  std::optional<bool> native_reduce_scatter_;
  bool alltoall_reduce_scatter_ = false;
  bool p2p_all_gather_ = false;
  bool alltoall_gathers_ = false;
  std::atomic<uint32_t> collective_tags_{0};
};
using GroupPtr = std::shared_ptr<ProcessGroup>;

// ---------------------------------------------------------------- the default group (per thread)
// Creates the world group for this rank and makes it the default. `store` is shared by all ranks.
GroupPtr init_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                            const GroupOptions& options = {});
bool is_initialized();
GroupPtr default_group();  // throws std::logic_error naming the missing init_process_group
void destroy_process_group();

// A group over `ranks` (global ranks, any order, no duplicates) made from the world's store.
// Group ranks follow the sorted global ranks (as torch.distributed.new_group). Only members take
// part and get a group; non-members get nullptr and need not call it. Members must create their
// groups in the same order. Options left at their defaults (backend "gloo", device "cpu", 300 s)
// inherit the world's backend, device and timeout, so sub-groups of an NCCL or plug-in world use
// that backend too.
GroupPtr new_group(const std::vector<int>& ranks, const GroupOptions& options = {});

// `group` itself, or the default group when null.
const GroupPtr& resolve(const GroupPtr& group);

}  // namespace tdc::comm
