// Backends by name. Built-ins: "gloo" (always), "nccl" (when LibTorch has CUDA).
// A plug-in is a shared library exporting
//
//   extern "C" void tdc_register_backends(tdc::comm::BackendRegistry& registry);
//
// which calls registry.add("name", factory) for each c10d::Backend it provides
// (see plugins/example_backend and docs/plugging-in.md).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tdc/comm/process_group.h"

namespace tdc::comm {

using BackendFactory = std::function<c10::intrusive_ptr<c10d::Backend>(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const GroupOptions& options)>;

// [Note: native ops or emulation] What a backend does natively. tdc uses a backend's own op
// whenever it has one and emulates only what it lacks (docs/plugging-in.md):
//  * reduce_scatter: _reduce_scatter_base honouring the ReduceOp. Unset (a plug-in that does not
//    say): tdc calls it at the first reduce-scatter of each group; c10d's own refusal of an op a
//    Backend does not override ("does not support _reduce_scatter_base") means no, and from then
//    on that group emulates it. Any other error is the backend's and fails the collective.
//  * avg: ReduceOp::AVG. c10d has no uniform refusal for a reduce op, so only a declaration says yes.
// Built-ins: nccl has both; gloo has no AVG, and its reduce-scatter honours the op from LibTorch
// 2.13 on ([Note: Gloo's reduce-scatter honours the op]).
struct BackendOps {
  std::optional<bool> reduce_scatter;
  bool avg = false;
  // [Note: a reduce-scatter by all-to-all, in the ring's order] The backend's all-to-all is
  // cheaper than its reduce-scatter, so tdc::comm reduce-scatters with SUM or AVG by all-to-all
  // (one exchange: chunk r of every rank goes to rank r) plus a local sum of the n received rows,
  // in the order of Gloo's ring all-reduce: for each block of that ring (ring_order.h) the sum
  // starts from the contribution of the rank before the block's owner and adds the others one at
  // a time, going down the ring. Gloo: its reduce-scatter is its all-reduce inside (it returns the
  // all-reduce's chunk and costs about what an all-reduce costs: every byte crosses twice); this
  // returns the same bits in a third to two thirds of the time (docs/bench/README.md, "Gloo's
  // reduce-scatter" and "A reduce-scatter by all-to-all at any world size"). At two ranks the order
  // is the one addition a + b. ReduceScatterByAllToAllTest checks the bits against Gloo's
  // all-reduce and its own reduce-scatter. A plug-in that sets it gets Gloo's summation order,
  // which is a valid order but maybe not its own reduce-scatter's.
  bool reduce_scatter_by_alltoall = false;
  // [Note: a large all-gather by sends and receives] The backend's send and recv are cheaper
  // than its all-gather over three or more ranks, so tdc::comm all-gathers an input of at least
  // ProcessGroup::kSmallInputBytes over such a group by posting, on every rank, one send of
  // its input and one receive into the output's chunk of each other rank, all at once, and copying
  // its own chunk locally: the same bytes as the native op, which moves data only. Gloo: its
  // all-gather is a ring, n - 1 exchanges one after the other, each handed to a worker thread and
  // copied out of Gloo's own buffer; the sends and receives are one round and land in the output
  // (docs/bench/README.md, "A large all-gather by sends and receives"). Two ranks, and smaller
  // inputs, keep the native op: measured, the exchange gained nothing there and small ones cost
  // more system time. The messages use tags from ProcessGroup::kCollectiveTagBase up, one per
  // all-gather and group in issue order (every rank issues a group's collectives in the same
  // order), so they never match a user's send or recv (whose tags tdc::comm keeps below it) nor
  // another all-gather in flight. AllGatherBySendRecvTest checks the bytes against the native op.
  bool all_gather_by_p2p = false;
  // [Note: gathers by all-to-all] The backend's all-to-all is its cheapest exchange, so
  // tdc::comm runs as one all-to-all of the input repeated n times (every rank sends its input to
  // every rank): every all-gather that does not go by sends and receives (above), every SUM or AVG
  // all-reduce of a floating-point or integer tensor under ProcessGroup::kSmallInputBytes (each
  // rank then sums the n gathered inputs itself, in the order of Gloo's ring all-reduce:
  // ring_order.h), and the exchange of tdc's argument checks. Gloo: its all-gather is a ring that
  // sends each rank's block as two messages per step, n - 1 steps one after the other, on a worker
  // thread that gathers into a buffer of its own and copies it out; its all-reduce is a ring of
  // at least 2 (n - 1) steps. The all-to-all sends one message to each peer, all at once: the
  // seed suite's system time fell by a fifth (docs/bench/suite_time.md, "Gathers by
  // all-to-all"). The all-gather moves data only, so its bytes are the native op's; the
  // all-reduce's sum is Gloo's own bit for bit. GatherByAllToAllTest checks both against Gloo's
  // own ops. An all-reduce of a large input keeps the native op: the all-to-all moves n / 2 times
  // the ring's bytes. A plug-in that sets it gets Gloo's summation order in small all-reduces.
  bool gather_by_alltoall = false;
};

class BackendRegistry {
 public:
  static BackendRegistry& instance();

  // Throws std::invalid_argument if `name` is already registered. `ops`: what it has natively.
  void add(const std::string& name, BackendFactory factory, BackendOps ops = {});
  // What `name` declared (a default BackendOps for an unknown name).
  BackendOps ops_of(const std::string& name) const;
  bool has(const std::string& name) const;
  std::vector<std::string> names() const;
  // Throws std::invalid_argument naming the unknown backend and the known ones.
  c10::intrusive_ptr<c10d::Backend> create(const std::string& name, const c10::intrusive_ptr<c10d::Store>& store,
                                           int rank, int size, const GroupOptions& options) const;

  // dlopen()s `path` and calls its tdc_register_backends. Idempotent per path. Throws
  // std::runtime_error naming the library when it cannot be opened or lacks the symbol.
  void load_plugin(const std::string& path);

 private:
  BackendRegistry();
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace tdc::comm

extern "C" {
// The symbol a plug-in exports.
using tdc_register_backends_fn = void (*)(tdc::comm::BackendRegistry&);
}
#define TDC_PLUGIN_REGISTER_SYMBOL "tdc_register_backends"
