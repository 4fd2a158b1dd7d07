// Which collectives each backend ran natively and which tdc::comm emulated, since the last reset:
// what a run's results say per backend (results.json "reports" -> "comm_ops").
#pragma once

#include <map>
#include <set>
#include <string>

namespace tdc::comm {

// [Note: which ops ran natively] Every collective of tdc::comm records, per backend name, the op
// the caller asked for ("all_reduce", "reduce_scatter_tensor", ...) and whether the backend ran
// it natively or tdc emulated it ([Note: native ops or emulation], backend_registry.h). A
// reduction with AVG records "AVG" too: native when the backend averaged, emulated when tdc
// summed and divided. tdc's own argument checks ([Note: cross-rank argument checks], comm/checks.cpp) are not
// recorded: they are tdc's, not the caller's. The record is per process: a forked or spawned rank
// starts with its own; thread ranks share one, so the harness resets it once per test before
// the rank threads start ([Note: rank reports], harness.h).
enum class OpPath { Native, Emulated };

// Thread-safe. `op` is one of the op names above.
void record_op_path(const std::string& backend, const char* op, OpPath path);

// "BACKEND.native" -> ops, "BACKEND.emulated" -> ops, for what ran since the last reset.
std::map<std::string, std::set<std::string>> op_paths();
void reset_op_paths();

}  // namespace tdc::comm
