#include "tdc/comm/collectives.h"
#include "tdc/libtorch_compat.h"
#include "tdc/comm/op_paths.h"
#include "tdc/comm/testing.h"
#include "tdc/core/cpu_block_cache.h"
#include "tdc/core/wrapper_tensor.h"

#include <cstdio>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checks.h"
#include "internal.h"
#include "ring_order.h"

namespace tdc::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
      return "SUM";
    case ReduceOp::AVG:
      return "AVG";
    case ReduceOp::MAX:
      return "MAX";
    case ReduceOp::MIN:
      return "MIN";
  }
  return "?";
}

// ------------------------------------------------------------------------------------- Work
Work::Work(c10::intrusive_ptr<c10d::Work> work, std::function<void()> then)
    : work_(std::move(work)), then_(std::move(then)) {}

Work::Work(Work&& other) noexcept : work_(std::move(other.work_)), then_(std::move(other.then_)) {
  other.then_ = nullptr;
}

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    this->~Work();  // an overwritten pending Work is finished first, as on destruction
    new (this) Work(std::move(other));
  }
  return *this;
}

Work::~Work() {
  if (done()) return;
  try {
    wait();
  } catch (const std::exception& e) {
    // A destructor cannot throw; the caller dropped the Work, so this is the only place to say it.
    std::fprintf(stderr, "tdc::comm::Work: collective dropped without wait() failed: %s\n", e.what());
  }
}

void Work::wait() {
  // Always Work::wait(): getFuture()->wait() then result() raced on some Gloo ranks.
  if (work_) {
    auto w = std::move(work_);
    work_.reset();
    w->wait();
  }
  if (then_) {
    auto f = std::move(then_);
    then_ = nullptr;
    f();
  }
}

namespace detail {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case ReduceOp::AVG:
      return c10d::ReduceOp(c10d::ReduceOp::AVG);
    case ReduceOp::MAX:
      return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case ReduceOp::MIN:
      return c10d::ReduceOp(c10d::ReduceOp::MIN);
  }
  throw std::invalid_argument("unknown ReduceOp");
}

// [Note: backend aliases] Tensors are handed to the backend as autograd-free aliases
// (variable_data: same storage, own version counter). Backends write outputs with copy_ on
// their own threads, where grad mode is on: on a leaf that requires grad that would throw, and
// Gloo's allgather would bump the version counter once per chunk. tdc bumps the caller's
// counter exactly once per written output instead (what any in-place op does).
at::Tensor backend_view(const at::Tensor& t) { return t.variable_data(); }

void bump_version(const at::Tensor& t) {
  if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}

// A contiguous buffer to hand the backend for `t`, and how to publish its result into `t`.
struct Staged {
  at::Tensor buf;
  at::Tensor target;
  bool copy_back;
  void publish() const {
    if (copy_back) backend_view(target).copy_(buf);
    bump_version(target);
  }
};
Staged stage(const at::Tensor& t) {
  if (t.is_contiguous()) return {backend_view(t), t, false};
  return {backend_view(t).contiguous(), t, true};
}

void record(const std::optional<OpKind>& kind, int64_t bytes) {
  if (kind) CommDebugMode::record(*kind, bytes);
}

// [Note: which ops ran natively]: `op` ran on g's backend natively or as tdc's emulation.
void record_path(const ProcessGroup& g, const char* op, bool native) {
  record_op_path(g.backend_name(), op, native ? OpPath::Native : OpPath::Emulated);
}
// An AVG reduction: the backend's own or tdc's SUM / size.
void record_avg(const ProcessGroup& g, ReduceOp op, bool emulated) {
  if (op == ReduceOp::AVG) record_path(g, "AVG", !emulated);
}

Work finish(c10::intrusive_ptr<c10d::Work> w, std::function<void()> then, bool async_op) {
  Work work(std::move(w), std::move(then));
  if (!async_op) work.wait();
  return work;
}

std::string avg_error(const char* op, const ProcessGroup& g, const at::Tensor& t) {
  if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) return "";
  return fmt::format(
      "{} on {}: ReduceOp AVG needs a floating-point tensor, got {} (an integer average would "
      "truncate; use SUM and divide)",
      op, group_label(g), describe(t));
}

// Shapes accepted for the "big" side of all-gather / reduce-scatter, as torch.distributed does:
// concatenated along dim 0 ([n*d0, ...]) or stacked ([n, d0, ...]).
std::string size_error(const char* op, const ProcessGroup& g, const char* big_name, const at::Tensor& big,
                       const char* small_name, const at::Tensor& small) {
  if (big.scalar_type() != small.scalar_type()) {
    return fmt::format("{} on {}: {} is {} but {} is {}; dtypes must match", op, group_label(g), big_name,
                       describe(big), small_name, describe(small));
  }
  std::vector<int64_t> cat(small.sizes().begin(), small.sizes().end());
  if (cat.empty()) cat.push_back(1);
  cat[0] *= g.size();
  std::vector<int64_t> stacked{g.size()};
  stacked.insert(stacked.end(), small.sizes().begin(), small.sizes().end());
  if (big.sizes().vec() == cat || big.sizes().vec() == stacked) return "";
  return fmt::format("{} on {}: {} is {}, expected {}[{}] (group size {} x {} {})", op, group_label(g), big_name,
                     describe(big), describe(big).substr(0, describe(big).find('[')), fmt::join(cat, ", "), g.size(),
                     small_name, describe(small));
}

}  // namespace

// An all-gather's own block of the output from the rank's input, unless the input already is that
// block (an in-place all-gather, as FSDP1's flat parameter and FSDP2's all-gather input are).
void copy_own_block(at::Tensor own, const at::Tensor& in) {
  if (own.data_ptr() != in.data_ptr()) own.copy_(in);
}

// [Note: a two-rank gather sends its input as it is] An all-to-all takes one contiguous input
// whose k-th block goes to rank k, so a gather by all-to-all repeats its input n times: a copy of
// n times the input before anything moves, and the backend's copy of the rank's own block after.
// With two ranks the blocks can be uneven instead: each rank sends nothing to itself and its whole
// input, unrepeated, to its peer, and receives the peer's input straight into the peer's block of
// the output (the output of the all-to-all is that block alone); the rank's own block is one copy
// here, none when the input already is that block. The same bytes land in the same places. FSDP2's step at world 2 spent a third of its copy
// time in the repeat (docs/bench/README.md, "A two-rank gather without the repeat").
c10::intrusive_ptr<c10d::Work> start_gather_by_alltoall(const ProcessGroup& g, at::Tensor& out_flat,
                                                        const at::Tensor& in_flat) {
  c10d::AllToAllOptions opts;
  opts.timeout = g.options().timeout;
  if (g.size() == 2) {
    const int64_t n = in_flat.numel();
    const int me = g.rank(), peer = 1 - me;
    copy_own_block(out_flat.narrow(0, me * n, n), in_flat);
    at::Tensor from_peer = out_flat.narrow(0, peer * n, n);
    at::Tensor to_peer = in_flat;
    std::vector<int64_t> splits(2, 0);
    splits[peer] = n;
    std::vector<int64_t> in_splits = splits;
    return g.backend().alltoall_base(from_peer, to_peer, splits, in_splits, opts);
  }
  at::Tensor repeated = in_flat.repeat({g.size()});
  std::vector<int64_t> even;
  return g.backend().alltoall_base(out_flat, repeated, even, even, opts);
}

namespace {
// [Note: a small collective rides with its check] (checks.cpp): the gathered blocks of every
// rank's `in_flat` from what rode, as start_gather_by_alltoall leaves them.
void gather_ridden(const ProcessGroup& g, const Ridden& ridden, at::Tensor& out_flat, const at::Tensor& in_flat) {
  const int64_t k = in_flat.numel();
  for (int src = 0; src < g.size(); ++src) {
    at::Tensor block = out_flat.narrow(0, src * k, k);
    if (src == g.rank()) {
      copy_own_block(block, in_flat);
    } else {
      ridden.copy_from(src, block);
    }
  }
}
// What a collective that gathers `in_flat` offers to the check: the input itself, to every rank.
Ride ride_gather(bool offered, const at::Tensor& in_flat) {
  if (!offered) return {};
  return {[in_flat](int) { return in_flat; }};
}
}  // namespace

// [Note: gathers by all-to-all] (backend_registry.h): a small SUM or AVG all-reduce as an
// all-gather of the inputs and a local sum in the order of Gloo's ring.
Work all_reduce_by_alltoall(const ProcessGroup& g, const Staged& s, bool emulate_avg, bool async_op,
                            const std::optional<Ridden>& ridden) {
  record_path(g, "all_reduce", false);
  const int n = g.size();
  at::Tensor mine = s.buf.view({s.buf.numel()});
  at::Tensor everyone = core::empty_reusing({n * mine.numel()}, mine.options());
  c10::intrusive_ptr<c10d::Work> w;
  if (ridden) {
    gather_ridden(g, *ridden, everyone, mine);
  } else {
    w = start_gather_by_alltoall(g, everyone, mine);
  }
  return finish(
      std::move(w),
      [s, mine, everyone, emulate_avg, n] {
        sum_in_ring_order(mine, everyone.view({n, -1}).unbind(0));
        if (emulate_avg) mine.div_(n);  // AVG = SUM / size, as after Gloo's own all-reduce
        s.publish();
      },
      async_op);
}

Work all_reduce(at::Tensor& tensor, ReduceOp op, const GroupPtr& group, bool async_op,
                std::optional<OpKind> record_as) {
  const ProcessGroup& g = *resolve(group);
  const std::string err = op == ReduceOp::AVG ? avg_error("all_reduce", g, tensor) : "";
  Staged s = stage(tensor);
  const bool by_alltoall = err.empty() && g.all_reduce_by_alltoall(op, s.buf);
  auto ridden = agree(g, {.op = Coll::AllReduce, .tensor = tensor, .reduce = op, .local_error = err},
                      ride_gather(by_alltoall, s.buf.view({s.buf.numel()})));
  record(record_as, tensor.nbytes());
  const bool emulate_avg = op == ReduceOp::AVG && !g.native_avg();
  record_avg(g, op, emulate_avg);
  if (by_alltoall) return all_reduce_by_alltoall(g, s, emulate_avg, async_op, ridden);
  record_path(g, "all_reduce", true);
  std::vector<at::Tensor> v{s.buf};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(emulate_avg ? ReduceOp::SUM : op);
  opts.timeout = g.options().timeout;
  auto w = g.backend().allreduce(v, opts);
  const int n = g.size();
  return finish(
      std::move(w),
      [s, emulate_avg, n] {
        if (emulate_avg) s.buf.div_(n);  // AVG = SUM / size (Gloo has no AVG)
        s.publish();
      },
      async_op);
}

// [Note: a large all-gather by sends and receives] (backend_registry.h): every rank sends its
// input to each other rank and receives theirs straight into the output's chunks, all posted at
// once; its own chunk is a local copy. One Work waits for all the messages, even after one failed.
Work all_gather_by_p2p(ProcessGroup& g, const Staged& s, const at::Tensor& in_flat, const at::Tensor& out_flat,
                       bool async_op) {
  const int n = g.size(), me = g.rank();
  const int tag = g.next_collective_tag();
  const int64_t k = in_flat.numel();
  auto works = std::make_shared<std::vector<c10::intrusive_ptr<c10d::Work>>>();
  for (int d = 1; d < n; ++d) {
    std::vector<at::Tensor> to_send{in_flat};
    works->push_back(g.backend().send(to_send, (me + d) % n, tag));
    const int from = (me - d + n) % n;
    std::vector<at::Tensor> into{out_flat.narrow(0, from * k, k)};
    works->push_back(g.backend().recv(into, from, tag));
  }
  copy_own_block(out_flat.narrow(0, me * k, k), in_flat);
  record_path(g, "all_gather_into_tensor", false);
  return finish(
      {},
      [works, s, in_flat] {
        std::exception_ptr failed;
        for (auto& w : *works) {
          try {
            w->wait();
          } catch (...) {
            if (!failed) failed = std::current_exception();
          }
        }
        works->clear();
        if (failed) std::rethrow_exception(failed);
        s.publish();
      },
      async_op);
}

Work all_gather_into_tensor(at::Tensor& output, const at::Tensor& input, const GroupPtr& group, bool async_op,
                            std::optional<OpKind> record_as) {
  ProcessGroup& g = *resolve(group);
  const std::string err = size_error("all_gather_into_tensor", g, "output", output, "input", input);
  at::Tensor in = backend_view(input).contiguous();
  at::Tensor in_flat = in.view({in.numel()});
  const auto bytes = static_cast<int64_t>(in_flat.nbytes());
  const bool by_alltoall = !g.all_gather_by_p2p(bytes) && g.all_gather_by_alltoall(bytes);
  auto ridden =
      agree(g, {.op = Coll::AllGather, .tensor = input, .local_error = err}, ride_gather(by_alltoall, in_flat));
  record(record_as, input.nbytes());
  Staged s = stage(output);
  AT_ASSERT(s.buf.numel() == in.numel() * g.size());
  at::Tensor out_flat = s.buf.view({g.size() * std::max<int64_t>(in.numel(), 0)});
  if (g.all_gather_by_p2p(bytes)) return all_gather_by_p2p(g, s, in_flat, out_flat, async_op);
  if (by_alltoall) {
    record_path(g, "all_gather_into_tensor", false);
    if (ridden) {
      gather_ridden(g, *ridden, out_flat, in_flat);
      return finish(
          {}, [s] { s.publish(); }, async_op);
    }
    return finish(
        start_gather_by_alltoall(g, out_flat, in_flat), [s] { s.publish(); }, async_op);
  }
  c10d::AllgatherOptions opts;
  opts.timeout = g.options().timeout;
  record_path(g, "all_gather_into_tensor", true);
  auto w = g.backend()._allgather_base(out_flat, in_flat, opts);
  return finish(
      std::move(w), [s, in] { s.publish(); }, async_op);
}

// The emulated reduce-scatter's local reduction into `out` for a backend without a native one:
// rows[0] op rows[1] op ..., left to right.
void reduce_in_rank_order(at::Tensor out, at::TensorList rows, ReduceOp op) {
  const auto n = static_cast<int64_t>(rows.size());
  if (op == ReduceOp::MAX || op == ReduceOp::MIN) {
    const at::Tensor stacked = at::stack(rows);
    out.copy_(std::get<0>(op == ReduceOp::MAX ? stacked.max(0) : stacked.min(0)));
    return;
  }
  if (n == 1) {
    out.copy_(rows[0]);
  } else {
    at::add_out(out, rows[0], rows[1]);
  }
  for (int64_t k = 2; k < n; ++k) out.add_(rows[k]);
  if (op == ReduceOp::AVG) out.div_(n);
}

// Emulation (backends without a native reduce-scatter that honours the op, and SUM / AVG where
// the all-to-all is cheaper: [Note: a reduce-scatter by all-to-all, in the ring's order]): one
// all-to-all moves chunk r of every rank to rank r (bandwidth-optimal, like a ring
// reduce-scatter), then the n received chunks are reduced locally: in the ring's order where
// that is why it runs, else in rank order.
Work reduce_scatter_by_emulation(const ProcessGroup& g, const Staged& s, const at::Tensor& in, ReduceOp op,
                                 const std::optional<Ridden>& ridden, bool async_op) {
  const int n = g.size();
  const int64_t chunk = in.numel() / n;
  record_path(g, "reduce_scatter_tensor", false);
  record_avg(g, op, true);
  const bool ring_order = g.reduce_scatter_by_alltoall(op);
  // [Note: a two-rank reduce-scatter moves the peer's chunk only] With two ranks and the ring's
  // order (a sum of two rows, which does not depend on which row is which), each rank sends its
  // peer's chunk and receives its own from the peer; its own contribution is read where it is, in
  // `in`. An even all-to-all would first copy that chunk into the received rows (Gloo's alltoall
  // copies a rank's own block): half of `in` copied per reduce-scatter, which FSDP2's step at
  // world 2 paid on every block (docs/bench/README.md). `in` is read when the work is waited on,
  // as every collective's input may be until then.
  const bool pairwise = ring_order && n == 2 && !ridden;
  const int me = g.rank(), peer = 1 - me;
  at::Tensor received = core::empty_reusing(pairwise ? at::IntArrayRef{chunk} : in.sizes(), in.options());
  c10::intrusive_ptr<c10d::Work> w;
  c10d::AllToAllOptions opts;
  opts.timeout = g.options().timeout;
  if (ridden) {  // [Note: a small collective rides with its check] (checks.cpp)
    for (int src = 0; src < n; ++src) {
      at::Tensor row = received.narrow(0, src * chunk, chunk);
      if (src == me) {
        row.copy_(in.narrow(0, src * chunk, chunk));
      } else {
        ridden->copy_from(src, row);
      }
    }
  }
  std::vector<at::Tensor> rows;  // rank k's contribution to this rank's chunk, k = 0 .. n-1
  if (pairwise) {
    std::vector<int64_t> out_splits(2, 0);
    out_splits[peer] = chunk;
    // Two vectors: c10d's Gloo work may move from each (one vector passed as both failed Gloo's checks).
    std::vector<int64_t> in_splits = out_splits;
    at::Tensor to_peer = in.narrow(0, peer * chunk, chunk);
    w = g.backend().alltoall_base(received, to_peer, out_splits, in_splits, opts);
    rows.resize(2);
    rows[me] = in.narrow(0, me * chunk, chunk);
    rows[peer] = received;
  } else {
    if (!ridden) {
      std::vector<int64_t> even;
      at::Tensor to_all = in;
      w = g.backend().alltoall_base(received, to_all, even, even, opts);
    }
    rows = received.view({n, -1}).unbind(0);
  }
  return finish(
      std::move(w),
      [s, rows, op, ring_order, me] {
        at::Tensor out = s.buf.view({s.buf.numel()});
        if (ring_order) {
          reduce_in_ring_order(out, rows, op, me);
        } else {
          reduce_in_rank_order(out, rows, op);
        }
        s.publish();
      },
      async_op);
}

Work reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op, const GroupPtr& group,
                           bool async_op, std::optional<OpKind> record_as) {
  ProcessGroup& g = *resolve(group);
  std::string err = size_error("reduce_scatter_tensor", g, "input", input, "output", output);
  if (err.empty() && op == ReduceOp::AVG) err = avg_error("reduce_scatter_tensor", g, input);
  const int n = g.size();
  at::Tensor in = backend_view(input).contiguous().view({input.numel()});
  // Each rank's chunk r goes to rank r: what rides with the check when the op goes by all-to-all.
  const bool by_alltoall = err.empty() && g.reduce_scatter_by_alltoall(op);
  const int64_t chunk = in.numel() / n;
  Ride ride;
  if (by_alltoall) ride.payload = [in, chunk](int dst) { return in.narrow(0, dst * chunk, chunk); };
  auto ridden = agree(g, {.op = Coll::ReduceScatter, .tensor = input, .reduce = op, .local_error = err}, ride);
  record(record_as, input.nbytes());
  Staged s = stage(output);
  at::Tensor out_flat = s.buf.view({s.buf.numel()});
  const bool emulate_avg = op == ReduceOp::AVG && !g.native_avg();

  if (!by_alltoall && g.native_reduce_scatter().value_or(true)) {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(emulate_avg ? ReduceOp::SUM : op);
    opts.timeout = g.options().timeout;
    c10::intrusive_ptr<c10d::Work> w;
    try {
      w = g.backend()._reduce_scatter_base(out_flat, in, opts);
    } catch (const c10::Error& e) {
      // [Note: native ops or emulation]: an undeclared backend without the op refuses it the way
      // c10d's Backend base does, on every rank alike; anything else is the backend's error.
      if (g.native_reduce_scatter().has_value() || !compat::is_reduce_scatter_refusal(e.what_without_backtrace()))
        throw;
      g.learned_native_reduce_scatter(false);
    }
    if (w) {
      g.learned_native_reduce_scatter(true);
      record_path(g, "reduce_scatter_tensor", true);
      record_avg(g, op, emulate_avg);
      return finish(
          std::move(w),
          [s, in, emulate_avg, n] {
            if (emulate_avg) s.buf.div_(n);
            s.publish();
          },
          async_op);
    }
  }
  return reduce_scatter_by_emulation(g, s, in, op, ridden, async_op);
}

}  // namespace detail

// ------------------------------------------------------------------------------ public API
namespace {
// [Note: wrapper tensors] (tdc/core/wrapper_tensor.h): an in-place collective on a wrapper runs on
// each part; one Work waits for all of them and then bumps the wrapper's own version counter.
template <class Fn>
Work on_each_part(const at::Tensor& wrapper, bool async_op, Fn&& fn) {
  auto works = std::make_shared<std::vector<Work>>();
  for (at::Tensor part : core::parts_of(wrapper)) works->push_back(fn(part));
  return detail::finish(
      {},
      [works, wrapper] {
        for (auto& w : *works) w.wait();
        detail::bump_version(wrapper);
      },
      async_op);
}
// The collectives that read one tensor and write another take no wrapper: which part would be
// sent where is the caller's decision (FSDP2 copies a wrapper into a plain buffer first).
void refuse_wrapper(const char* op, const char* what, const at::Tensor& t) {
  if (core::is_wrapper(t)) {
    throw std::invalid_argument(fmt::format(
        "{}: the {} is a wrapper tensor of {} parts; pass a plain tensor (copy the wrapper into one, or call {} on "
        "each part)",
        op, what, core::parts_of(t).size(), op));
  }
}
}  // namespace

Work all_reduce(at::Tensor& tensor, ReduceOp op, const GroupPtr& group, bool async_op) {
  if (core::is_wrapper(tensor)) {
    return on_each_part(tensor, async_op, [&](at::Tensor& part) { return all_reduce(part, op, group, true); });
  }
  return detail::all_reduce(tensor, op, group, async_op, OpKind::AllReduce);
}

namespace {
thread_local AllGatherPatch t_all_gather_patch;
thread_local ReduceScatterPatch t_reduce_scatter_patch;
}  // namespace

PatchAllGather::PatchAllGather(AllGatherPatch fn) : previous_(std::move(t_all_gather_patch)) {
  t_all_gather_patch = std::move(fn);
}
PatchAllGather::~PatchAllGather() { t_all_gather_patch = std::move(previous_); }
PatchReduceScatter::PatchReduceScatter(ReduceScatterPatch fn) : previous_(std::move(t_reduce_scatter_patch)) {
  t_reduce_scatter_patch = std::move(fn);
}
PatchReduceScatter::~PatchReduceScatter() { t_reduce_scatter_patch = std::move(previous_); }

Work all_gather_into_tensor(at::Tensor& output, const at::Tensor& input, const GroupPtr& group, bool async_op) {
  refuse_wrapper("all_gather_into_tensor", "output", output);
  refuse_wrapper("all_gather_into_tensor", "input", input);
  auto original = [&] { return detail::all_gather_into_tensor(output, input, group, async_op, OpKind::AllGatherBase); };
  if (t_all_gather_patch) return t_all_gather_patch(output, input, group, async_op, original);
  return original();
}

Work reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op, const GroupPtr& group,
                           bool async_op) {
  refuse_wrapper("reduce_scatter_tensor", "output", output);
  refuse_wrapper("reduce_scatter_tensor", "input", input);
  auto original = [&] {
    return detail::reduce_scatter_tensor(output, input, op, group, async_op, OpKind::ReduceScatterBase);
  };
  if (t_reduce_scatter_patch) return t_reduce_scatter_patch(output, input, op, group, async_op, original);
  return original();
}

Work all_to_all_single(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_split_sizes,
                       const std::vector<int64_t>& input_split_sizes, const GroupPtr& group, bool async_op) {
  refuse_wrapper("all_to_all_single", "output", output);
  refuse_wrapper("all_to_all_single", "input", input);
  using namespace detail;
  const ProcessGroup& g = *resolve(group);
  const int n = g.size();
  const std::string where = fmt::format("all_to_all_single on {}", group_label(g));
  // Validate one side's split sizes against its tensor; an empty list means an even split.
  auto splits_of = [&](const char* side, const at::Tensor& t, const std::vector<int64_t>& given,
                       std::vector<int64_t>& out) -> std::string {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    if (given.empty()) {
      if (rows % n != 0) {
        return fmt::format(
            "{}: {} {} has {} rows, not divisible by the group size {} (pass {} split "
            "sizes for an uneven split)",
            where, side, describe(t), rows, n, side);
      }
      out.assign(n, rows / n);
      return "";
    }
    if (static_cast<int>(given.size()) != n) {
      return fmt::format("{}: {} split sizes {} have {} entries, expected one per rank ({})", where, side, given,
                         given.size(), n);
    }
    int64_t sum = 0;
    for (int64_t v : given) {
      if (v < 0) return fmt::format("{}: {} split sizes {} contain a negative size", where, side, given);
      sum += v;
    }
    if (sum != rows) {
      return fmt::format("{}: {} split sizes {} sum to {}, but {} {} has {} rows", where, side, given, sum, side,
                         describe(t), rows);
    }
    out = given;
    return "";
  };
  std::vector<int64_t> in_splits, out_splits;
  std::string err;
  if (output.scalar_type() != input.scalar_type() || output.dim() != input.dim() ||
      (input.dim() > 1 && output.sizes().slice(1) != input.sizes().slice(1))) {
    err = fmt::format("{}: output {} and input {} must have the same dtype and trailing dims", where, describe(output),
                      describe(input));
  }
  if (err.empty()) err = splits_of("input", input, input_split_sizes, in_splits);
  if (err.empty()) err = splits_of("output", output, output_split_sizes, out_splits);
  std::vector<int64_t> both = in_splits;
  both.insert(both.end(), out_splits.begin(), out_splits.end());
  if (!err.empty()) both.assign(2 * n, -1);
  const bool uneven = !input_split_sizes.empty() || !output_split_sizes.empty();
  agree(g, {.op = Coll::AllToAll, .tensor = input, .ignore_dim0 = uneven, .splits = both, .local_error = err});
  CommDebugMode::record(OpKind::AllToAllBase, input.nbytes());
  at::Tensor in = backend_view(input).contiguous();
  Staged s = stage(output);
  // Gloo counts splits in rows of dim 0; empty lists mean even.
  std::vector<int64_t> osz = output_split_sizes, isz = input_split_sizes;
  c10d::AllToAllOptions opts;
  opts.timeout = g.options().timeout;
  record_path(g, "all_to_all_single", true);
  auto w = g.backend().alltoall_base(s.buf, in, osz, isz, opts);
  return detail::finish(
      std::move(w), [s, in] { s.publish(); }, async_op);
}

Work broadcast(at::Tensor& tensor, int src, const GroupPtr& group, bool async_op) {
  if (core::is_wrapper(tensor)) {
    return on_each_part(tensor, async_op, [&](at::Tensor& part) { return broadcast(part, src, group, true); });
  }
  using namespace detail;
  const ProcessGroup& g = *resolve(group);
  std::string err;
  if (src < 0 || src >= g.size()) {
    err = fmt::format("broadcast on {}: src {} is not a rank of the group [0, {})", group_label(g), src, g.size());
  }
  Staged s = stage(tensor);
  // The source's tensor rides with the check to every rank ([Note: a small collective rides with
  // its check], checks.cpp); the others send nothing.
  Ride ride;
  if (g.device_type() == "cpu") {
    ride.payload = [buf = s.buf, src, me = g.rank()](int) { return me == src ? buf : at::Tensor(); };
  }
  auto ridden = agree(g, {.op = Coll::Broadcast, .tensor = tensor, .root = src, .local_error = err}, ride);
  CommDebugMode::record(OpKind::Broadcast, tensor.nbytes());
  if (ridden) {
    if (g.rank() != src) ridden->copy_from(src, s.buf);
    record_path(g, "broadcast", false);
    return finish(
        {}, [s] { s.publish(); }, async_op);
  }
  std::vector<at::Tensor> v{s.buf};
  c10d::BroadcastOptions opts;
  opts.rootRank = src;
  opts.timeout = g.options().timeout;
  record_path(g, "broadcast", true);
  auto w = g.backend().broadcast(v, opts);
  return finish(
      std::move(w), [s] { s.publish(); }, async_op);
}

namespace {
void check_peer(const char* op, const char* what, int peer, const ProcessGroup& g) {
  if (peer < 0 || peer >= g.size() || peer == g.rank()) {
    throw std::invalid_argument(
        fmt::format("{} on {}: {} {} must be another rank of the group (this is "
                    "rank {})",
                    op, detail::group_label(g), what, peer, g.rank()));
  }
}
// [Note: a large all-gather by sends and receives]: tags from kCollectiveTagBase up are tdc's.
void check_tag(const char* op, int tag, const ProcessGroup& g) {
  if (tag < 0 || static_cast<uint32_t>(tag) >= ProcessGroup::kCollectiveTagBase) {
    throw std::invalid_argument(fmt::format("{} on {}: tag {} is not in [0, {}) (tags from {} up are tdc::comm's own)",
                                            op, detail::group_label(g), tag, ProcessGroup::kCollectiveTagBase,
                                            ProcessGroup::kCollectiveTagBase));
  }
}
}  // namespace

// Point-to-point ops have no cross-rank check: only two ranks take part and they may differ in
// what else they do. The returned Work is pending; dropping it waits (a plain statement
// `send(t, 1);` is therefore blocking, `auto w = send(t, 1);` overlaps).
Work send(const at::Tensor& tensor, int dst, const GroupPtr& group, int tag) {
  refuse_wrapper("send", "tensor", tensor);
  const ProcessGroup& g = *resolve(group);
  check_peer("send", "dst", dst, g);
  check_tag("send", tag, g);
  CommDebugMode::record(OpKind::Send, tensor.nbytes());
  std::vector<at::Tensor> v{detail::backend_view(tensor).contiguous()};
  detail::record_path(g, "send", true);
  auto w = g.backend().send(v, dst, tag);
  return Work(std::move(w), [v] {});  // keeps the contiguous copy alive until sent
}

Work recv(at::Tensor& tensor, int src, const GroupPtr& group, int tag) {
  refuse_wrapper("recv", "tensor", tensor);
  const ProcessGroup& g = *resolve(group);
  check_peer("recv", "src", src, g);
  check_tag("recv", tag, g);
  CommDebugMode::record(OpKind::Recv, 0);
  detail::Staged s = detail::stage(tensor);
  std::vector<at::Tensor> v{s.buf};
  detail::record_path(g, "recv", true);
  auto w = g.backend().recv(v, src, tag);
  return Work(std::move(w), [s] { s.publish(); });
}

void barrier(const GroupPtr& group) {
  const ProcessGroup& g = *resolve(group);
  detail::agree(g, {.op = detail::Coll::Barrier});
  CommDebugMode::record(OpKind::Barrier, 0);
  c10d::BarrierOptions opts;
  opts.timeout = g.options().timeout;
  detail::record_path(g, "barrier", true);
  g.backend().barrier(opts)->wait();
}

}  // namespace tdc::comm
