// Unit tests of tdc::comm: process groups, the backend registry and plug-ins, every collective
// against a single-process ground truth (world sizes 2, 3, 4; f32, f64, bf16, f16), the
// emulations, the cross-rank argument checks, differentiable collectives and CommDebugMode.
//
// Inputs are built from the rank alone (small integers, so sums are exact in every dtype), which
// lets every rank compute the expected result of the whole group locally, in float64.
#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <set>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>

#include "tdc/comm/backend_registry.h"
#include "tdc/comm/argument_checks.h"
#include "tdc/comm/collectives.h"
#include "tdc/comm/testing.h"
#include "tdc/comm/debug_mode.h"
#include "tdc/comm/functional.h"
#include "tdc/comm/op_paths.h"
#include "tdc/comm/process_group.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/subtests.h"
#include "tdc/libtorch_compat.h"

namespace {

using tdc::conformance::assert_close;
using tdc::conformance::Tolerance;

using namespace tdc::comm;
using tdc::harness::ctx;
using tdc::harness::Params;
using ::testing::HasSubstr;

const std::vector<tdc::harness::ParamValue> kDtypes{std::string("f32"), std::string("f64"), std::string("bf16"),
                                                    std::string("f16")};
at::ScalarType dtype_of(const std::string& s) {
  if (s == "f32") return at::kFloat;
  if (s == "f64") return at::kDouble;
  if (s == "bf16") return at::kBFloat16;
  return at::kHalf;
}

// Rank r's input: small integers in [-6, 6], different on every rank; float64, cast by callers.
at::Tensor input_of(int rank, at::IntArrayRef shape, int salt = 0) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return ((at::arange(numel, at::kDouble) * 3 + rank * 7 + salt * 5).remainder(13) - 6).view(shape);
}

// A collective's result against the fp64 reference cast to its dtype: same dtype, within a tolerance
// fitting the dtype's rounding (exact where the result is an exact small integer).
::testing::AssertionResult close_in_dtype(const at::Tensor& t, const at::Tensor& expected) {
  const auto dt = t.scalar_type();
  const double tol = dt == at::kBFloat16 ? 1e-2 : dt == at::kHalf ? 1e-3 : dt == at::kFloat ? 1e-6 : 1e-12;
  return assert_close(t, expected, Tolerance{tol, tol});
}

at::Tensor reduce_f64(const std::vector<at::Tensor>& xs, ReduceOp op) {
  at::Tensor stacked = at::stack(xs);
  switch (op) {
    case ReduceOp::SUM:
      return stacked.sum(0);
    case ReduceOp::AVG:
      return stacked.mean(0);
    case ReduceOp::MAX:
      return std::get<0>(stacked.max(0));
    case ReduceOp::MIN:
      return std::get<0>(stacked.min(0));
  }
  return {};
}
ReduceOp op_of(const std::string& s) {
  return s == "SUM" ? ReduceOp::SUM : s == "AVG" ? ReduceOp::AVG : s == "MAX" ? ReduceOp::MAX : ReduceOp::MIN;
}

// One collective, checked against the local ground truth. `op` names the collective (and its
// reduce op); `g` is the group it runs on, `emulated` a group of the same ranks that uses tdc's
// emulations for AVG and reduce-scatter.
void check_collective(const std::string& op, at::ScalarType dt, const GroupPtr& g, const GroupPtr& emulated) {
  const int n = g->size(), r = g->rank();
  std::vector<at::Tensor> all;
  for (int k = 0; k < n; ++k) all.push_back(input_of(k, {2 * n, 3}));
  const at::Tensor mine = all[r].to(dt);
  auto suffix = [&](const std::string& prefix) { return op.substr(prefix.size()); };

  if (op.rfind("all_reduce_", 0) == 0) {
    ReduceOp rop = op_of(suffix("all_reduce_"));
    at::Tensor t = mine.clone();
    all_reduce(t, rop, g);
    EXPECT_TRUE(close_in_dtype(t, reduce_f64(all, rop).to(dt))) << op;
    // Non-contiguous in place: a transposed view is reduced and written back through the view.
    at::Tensor base = mine.t().contiguous();
    at::Tensor view = base.t();
    ASSERT_FALSE(view.is_contiguous());
    all_reduce(view, rop, g);
    EXPECT_TRUE(close_in_dtype(base.t(), reduce_f64(all, rop).to(dt))) << op + " (non-contiguous)";
  } else if (op == "all_gather_into_tensor") {
    at::Tensor out = at::empty({n * mine.size(0), 3}, mine.options());
    all_gather_into_tensor(out, mine, g);
    EXPECT_TRUE(close_in_dtype(out, at::cat(all).to(dt))) << op;
    // Stacked output form and a non-contiguous input.
    at::Tensor stacked = at::empty({n, mine.size(1), mine.size(0)}, mine.options());
    all_gather_into_tensor(stacked, mine.t(), g);
    std::vector<at::Tensor> ts;
    for (auto& x : all) ts.push_back(x.t());
    EXPECT_TRUE(close_in_dtype(stacked, at::stack(ts).to(dt))) << op + " (stacked, non-contiguous input)";
  } else if (op.rfind("reduce_scatter_", 0) == 0) {
    const bool emu = op.rfind("reduce_scatter_emulated_", 0) == 0;
    ReduceOp rop = op_of(suffix(emu ? "reduce_scatter_emulated_" : "reduce_scatter_"));
    at::Tensor out = at::empty({2, 3}, mine.options());
    reduce_scatter_tensor(out, mine, rop, emu ? emulated : g);
    EXPECT_TRUE(close_in_dtype(out, reduce_f64(all, rop).chunk(n)[r].to(dt))) << op;
  } else if (op == "all_to_all_even") {
    at::Tensor out = at::empty_like(mine);
    all_to_all_single(out, mine, {}, {}, g);
    std::vector<at::Tensor> parts;
    for (int k = 0; k < n; ++k) parts.push_back(all[k].chunk(n)[r]);
    EXPECT_TRUE(close_in_dtype(out, at::cat(parts).to(dt))) << op;
  } else if (op == "all_to_all_uneven") {
    // Rank k sends (k + j) % 3 rows to rank j.
    auto rows = [](int from, int to) -> int64_t { return (from + to) % 3; };
    std::vector<int64_t> in_splits, out_splits;
    for (int j = 0; j < n; ++j) in_splits.push_back(rows(r, j)), out_splits.push_back(rows(j, r));
    auto input_rows = [&](int k) {
      int64_t s = 0;
      for (int j = 0; j < n; ++j) s += rows(k, j);
      return s;
    };
    auto input_of_rank = [&](int k) { return input_of(k, {input_rows(k), 3}, 1); };
    int64_t total_out = 0;
    for (int64_t s : out_splits) total_out += s;
    at::Tensor out = at::empty({total_out, 3}, mine.options());
    all_to_all_single(out, input_of_rank(r).to(dt), out_splits, in_splits, g);
    std::vector<at::Tensor> parts;
    for (int k = 0; k < n; ++k) {
      int64_t offset = 0;
      for (int j = 0; j < r; ++j) offset += rows(k, j);
      parts.push_back(input_of_rank(k).narrow(0, offset, rows(k, r)));
    }
    EXPECT_TRUE(close_in_dtype(out, at::cat(parts).to(dt))) << op;
  } else if (op == "broadcast") {
    const int src = n - 1;
    at::Tensor t = mine.clone();
    broadcast(t, src, g);
    EXPECT_TRUE(close_in_dtype(t, all[src].to(dt))) << op;
  } else if (op == "send_recv") {
    // A ring: everyone sends to the next rank and receives from the previous one. The sends are
    // kept pending (Work) so that the blocking receives cannot deadlock.
    Work sent = send(mine, (r + 1) % n, g);
    at::Tensor got = at::empty_like(mine);
    recv(got, (r + n - 1) % n, g).wait();
    sent.wait();
    EXPECT_TRUE(close_in_dtype(got, all[(r + n - 1) % n].to(dt))) << op;
  } else if (op == "async") {
    // Several collectives in flight at once, waited in reverse order; AVG's emulation step runs in
    // wait().
    at::Tensor a = mine.clone(), b = mine.clone();
    at::Tensor gathered = at::empty({n * mine.size(0), 3}, mine.options());
    Work wa = all_reduce(a, ReduceOp::AVG, g, true);
    Work wb = all_reduce(b, ReduceOp::MAX, g, true);
    Work wg = all_gather_into_tensor(gathered, mine, g, true);
    wg.wait();
    wb.wait();
    wa.wait();
    wa.wait();  // waiting twice is a no-op
    EXPECT_TRUE(wa.done());
    EXPECT_TRUE(close_in_dtype(a, reduce_f64(all, ReduceOp::AVG).to(dt))) << "async AVG";
    EXPECT_TRUE(close_in_dtype(b, reduce_f64(all, ReduceOp::MAX).to(dt))) << "async MAX";
    EXPECT_TRUE(close_in_dtype(gathered, at::cat(all).to(dt))) << "async all_gather";
  } else if (op == "barrier") {
    barrier(g);
  } else {
    FAIL() << "unknown op " << op;
  }
}

std::vector<tdc::harness::ParamValue> collective_names() {
  std::vector<tdc::harness::ParamValue> ops;
  for (const char* rop : {"SUM", "AVG", "MAX", "MIN"}) {
    ops.push_back(std::string("all_reduce_") + rop);
    ops.push_back(std::string("reduce_scatter_") + rop);
    ops.push_back(std::string("reduce_scatter_emulated_") + rop);
  }
  for (const char* op : {"all_gather_into_tensor", "all_to_all_even", "all_to_all_uneven", "broadcast", "send_recv",
                         "async", "barrier"}) {
    ops.push_back(std::string(op));
  }
  return ops;
}

void run_collectives() {
  GroupPtr world = tdc::conformance::world();
  std::vector<int> everyone(world->size());
  for (int k = 0; k < world->size(); ++k) everyone[k] = k;
  GroupPtr emulated = new_group(everyone);
  emulated->use_emulations();
  if (world->backend_name() == "gloo") {
    EXPECT_FALSE(world->native_avg());  // Gloo has no AVG
    // Declared by the registry: native where Gloo's honours the op ([Note: Gloo's reduce-scatter honours the op]).
    EXPECT_EQ(world->native_reduce_scatter(), std::optional<bool>(tdc::compat::kGlooReduceScatterHonoursOp));
  }
  EXPECT_EQ(emulated->native_reduce_scatter(), std::optional<bool>(false));
  tdc::harness::subtests({{"dtype", kDtypes}, {"op", collective_names()}}, [&](const Params& p) {
    check_collective(p.get<std::string>("op"), dtype_of(p.get<std::string>("dtype")), world, emulated);
  });
}

TDC_DIST_SUITE(CommTest, .world_size = 4);

TDC_DIST_TEST(CommTest, CollectivesWorldSize2, .world_size = 2) { run_collectives(); }
TDC_DIST_TEST(CommTest, CollectivesWorldSize3, .world_size = 3) { run_collectives(); }
TDC_DIST_TEST(CommTest, CollectivesWorldSize4, .world_size = 4) { run_collectives(); }

// ------------------------------------------------------------------ differentiable collectives
// Rank r computes loss_r = sum(y_r * w_r) with a rank-specific weight w_r, so the gradient of
// x_r gathers contributions from every rank's loss; the expectation is derived on one process.
void check_functional(const std::string& fn, at::ScalarType dt, int64_t dim, const GroupPtr& g) {
  const int n = g->size(), r = g->rank();
  std::vector<at::Tensor> xs;
  for (int k = 0; k < n; ++k) xs.push_back(input_of(k, {12, 12}));
  at::Tensor x = xs[r].to(dt).requires_grad_();
  at::Tensor y, expected_y, expected_grad;
  auto weight = [&](int k, at::IntArrayRef shape) { return input_of(k, shape, 2); };
  if (fn == "all_gather_tensor") {
    y = functional::all_gather_tensor(x, dim, g);
    expected_y = at::cat(xs, dim);
    std::vector<at::Tensor> w;
    for (int k = 0; k < n; ++k) w.push_back(weight(k, expected_y.sizes()).chunk(n, dim)[r]);
    expected_grad = at::stack(w).sum(0);
  } else if (fn == "reduce_scatter_tensor_SUM" || fn == "reduce_scatter_tensor_AVG") {
    const bool avg = fn.back() == 'G';
    y = functional::reduce_scatter_tensor(x, avg ? ReduceOp::AVG : ReduceOp::SUM, dim, g);
    at::Tensor reduced = at::stack(xs).sum(0) / (avg ? n : 1);
    expected_y = reduced.chunk(n, dim)[r];
    std::vector<at::Tensor> w;
    for (int k = 0; k < n; ++k) w.push_back(weight(k, expected_y.sizes()) / (avg ? n : 1));
    expected_grad = at::cat(w, dim);
  } else {
    y = functional::all_reduce(x, ReduceOp::SUM, g);
    expected_y = at::stack(xs).sum(0);
    std::vector<at::Tensor> w;
    for (int k = 0; k < n; ++k) w.push_back(weight(k, expected_y.sizes()));
    expected_grad = at::stack(w).sum(0);
  }
  EXPECT_TRUE(close_in_dtype(y, expected_y.to(dt))) << fn + " forward";
  (y * weight(r, y.sizes()).to(dt)).sum().backward();
  ASSERT_TRUE(x.grad().defined()) << fn;
  EXPECT_TRUE(close_in_dtype(x.grad(), expected_grad.to(dt))) << fn + " gradient";
}

TDC_DIST_TEST(CommTest, FunctionalCollectives, .world_size = 4) {
  GroupPtr world = tdc::conformance::world();
  tdc::harness::subtests({{"dtype", kDtypes},
                          {"fn",
                           {std::string("all_gather_tensor"), std::string("reduce_scatter_tensor_SUM"),
                            std::string("reduce_scatter_tensor_AVG"), std::string("all_reduce")}},
                          {"dim", {int64_t{0}, int64_t{1}}}},
                         [&](const Params& p) {
                           check_functional(p.get<std::string>("fn"), dtype_of(p.get<std::string>("dtype")),
                                            p.get<int64_t>("dim"), world);
                         });
}

TDC_DIST_TEST(CommTest, FunctionalCollectivesWorldSize3, .world_size = 3) {
  GroupPtr world = tdc::conformance::world();
  for (const char* fn : {"all_gather_tensor", "reduce_scatter_tensor_SUM", "all_reduce"}) {
    check_functional(fn, at::kFloat, 1, world);
  }
}

// ------------------------------------------------------------------ CommDebugMode
TDC_DIST_TEST(CommTest, CommDebugModeCountsEachCollectiveOnce, .world_size = 2) {
  GroupPtr world = tdc::conformance::world();
  const int n = world->size();
  at::Tensor t = at::ones({4, 2});  // 32 bytes
  at::Tensor gathered = at::empty({4 * n, 2});
  at::Tensor shard = at::empty({4 / n, 2});
  CommDebugMode outer;
  all_reduce(t);
  all_reduce(t, ReduceOp::AVG);  // emulated on Gloo (SUM + divide): still one allreduce_
  {
    CommDebugMode inner;
    all_gather_into_tensor(gathered, t);
    reduce_scatter_tensor(shard, t, ReduceOp::AVG);
    EXPECT_EQ(inner.get_comm_counts(),
              (std::map<std::string, int64_t>{{"c10d._allgather_base_", 1}, {"c10d._reduce_scatter_base_", 1}}));
    EXPECT_EQ(inner.get_comm_bytes().at("c10d._allgather_base_"), 32);
  }
  at::Tensor a2a = at::empty_like(t);
  all_to_all_single(a2a, t);
  broadcast(t, 0);
  barrier();
  {
    Work s = send(t, 1 - world->rank());
    at::Tensor got = at::empty_like(t);
    recv(got, 1 - world->rank());
  }
  at::Tensor x = at::ones({4, 2}, at::kDouble).requires_grad_();
  functional::all_gather_tensor(functional::all_reduce(x), 0).sum().backward();
  const std::map<std::string, int64_t> expected{
      {"c10d.allreduce_", 2},
      {"c10d._allgather_base_", 1},
      {"c10d._reduce_scatter_base_", 1},
      {"c10d.alltoall_base_", 1},
      {"c10d.broadcast_", 1},
      {"c10d.barrier", 1},
      {"c10d.send", 1},
      {"c10d.recv_", 1},
      // forward all_reduce + backward all_reduce; forward all-gather; backward reduce-scatter
      {"c10d_functional.all_reduce", 2},
      {"c10d_functional.all_gather_into_tensor", 1},
      {"c10d_functional.reduce_scatter_tensor", 1},
  };
  EXPECT_EQ(outer.get_comm_counts(), expected);
  EXPECT_EQ(outer.get_total_counts(), 13);
  EXPECT_EQ(outer.get_comm_bytes().at("c10d.allreduce_"), 64);
  EXPECT_EQ(outer.get_comm_bytes().at("c10d.recv_"), 0);
}

// ------------------------------------------------------------------ argument checks
// Runs `fn` and expects every rank to throw a message containing all of `parts`.
template <class Fn>
void expect_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one containing '" << parts.front() << "'";
  } catch (const std::exception& e) {
    for (const auto& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

TDC_DIST_TEST(CommTest, MismatchedArgumentsAreReportedNotHung, .world_size = 4) {
  GroupPtr world = tdc::conformance::world();
  const int r = world->rank();
  ASSERT_TRUE(argument_checks());
  // Shape: rank 2 disagrees.
  expect_error(
      [&] {
        at::Tensor t = at::zeros({4, r == 2 ? 9 : 8});
        all_reduce(t);
      },
      {"all_reduce on group 'world' (size 4): ranks disagree on the tensor: rank 0 "
       "float32[4, 8], rank 2 float32[4, 9]"});
  // Dtype: rank 1 and 3 disagree.
  expect_error(
      [&] {
        at::Tensor t = at::zeros({3}, r % 2 ? at::kDouble : at::kFloat);
        broadcast(t, 0);
      },
      {"broadcast on group 'world' (size 4): ranks disagree on the tensor: rank 0 "
       "float32[3], rank 1 float64[3], rank 3 float64[3]"});
  // The collective itself.
  expect_error(
      [&] {
        at::Tensor t = at::zeros({2});
        if (r == 3)
          broadcast(t, 0);
        else
          all_reduce(t);
      },
      {"ranks disagree on the collective: rank 0 all_reduce, rank 3 broadcast"});
  expect_error(
      [&] {
        at::Tensor t = at::zeros({2});
        all_reduce(t, r == 1 ? ReduceOp::MAX : ReduceOp::SUM);
      },
      {"ranks disagree on the reduce op: rank 0 SUM, rank 1 MAX"});
  expect_error(
      [&] {
        at::Tensor t = at::zeros({2});
        broadcast(t, r == 0 ? 1 : 0);
      },
      {"ranks disagree on the source rank: rank 0 1, rank 1 0"});
  // Uneven all-to-all whose split sizes do not pair up.
  expect_error(
      [&] {
        at::Tensor in = at::zeros({4, 1}), out = at::zeros({r == 0 ? 5 : 4, 1});
        std::vector<int64_t> out_splits{1, 1, 1, 1};
        if (r == 0) out_splits[3] = 2;
        all_to_all_single(out, in, out_splits, {1, 1, 1, 1});
      },
      {"split sizes disagree: rank 3 sends 1 rows to rank 0, which expects 2"});
  // A rank whose own arguments are bad makes every rank fail, not hang.
  expect_error(
      [&] {
        at::Tensor out = at::empty({r == 1 ? 7 : 8, 3}), in = at::zeros({2, 3});
        all_gather_into_tensor(out, in);
      },
      {r == 1 ? "all_gather_into_tensor on group 'world' (size 4): output is float32[7, 3], "
                "expected float32[8, 3] (group size 4 x input float32[2, 3])"
              : "rank(s) 1 rejected their arguments"});
  expect_error(
      [&] {
        at::Tensor out = at::empty({2, 3}), in = at::zeros({7, 3});
        reduce_scatter_tensor(out, in);
      },
      {"reduce_scatter_tensor on group 'world' (size 4): input is float32[7, 3], expected "
       "float32[8, 3] (group size 4 x output float32[2, 3])"});
  expect_error(
      [&] {
        at::Tensor t = at::ones({2}, at::kLong);
        all_reduce(t, ReduceOp::AVG);
      },
      {"ReduceOp AVG needs a floating-point tensor, got int64[2]"});
  expect_error(
      [&] {
        at::Tensor t = at::ones({2});
        send(t, r);
      },
      {"dst", "must be another rank"});
  // The group still works after all of that.
  at::Tensor t = at::ones({2});
  all_reduce(t);
  EXPECT_TRUE(assert_close(t, at::full({2}, 4.0f), Tolerance{0, 0}));
  // Checks off (per thread): no fingerprint exchange; a local error still throws locally, on
  // every rank here since all pass the same bad output.
  set_argument_checks(false);
  EXPECT_FALSE(argument_checks());
  expect_error(
      [&] {
        at::Tensor out = at::empty({5}), in = at::zeros({2});
        all_gather_into_tensor(out, in);
      },
      {"output is float32[5], expected float32[8]"});
  all_reduce(t);
  EXPECT_TRUE(assert_close(t, at::full({2}, 16.0f), Tolerance{0, 0}));
  set_argument_checks(true);
  // TDC_COMM_CHECKS=0 sets the default of threads that have not chosen yet. setenv is not
  // thread-safe, so only where ranks are processes.
  if (ctx().launcher != tdc::harness::Launcher::Thread) {
    setenv("TDC_COMM_CHECKS", "0", 1);
    bool seen = true;
    std::thread([&] { seen = argument_checks(); }).join();
    unsetenv("TDC_COMM_CHECKS");
    EXPECT_FALSE(seen);
  }
}

// ------------------------------------------------------------------ groups
TDC_DIST_TEST(CommTest, ProcessGroups, .world_size = 4) {
  GroupPtr world = tdc::conformance::world();
  const int r = world->rank();
  EXPECT_EQ(world->name(), "world");
  EXPECT_EQ(default_group(), world);
  EXPECT_EQ(resolve(nullptr), world);
  // The default group belongs to the rank's thread: another thread has none.
  bool other_thread_initialized = true;
  std::string message;
  std::thread([&] {
    other_thread_initialized = is_initialized();
    try {
      default_group();
    } catch (const std::logic_error& e) {
      message = e.what();
    }
  }).join();
  EXPECT_FALSE(other_thread_initialized);
  EXPECT_THAT(message, HasSubstr("init_process_group"));
  expect_error([&] { init_process_group(ctx().store, r, 4); }, {"already has a default group"});

  // Sub-groups: members given out of order get sorted group ranks; non-members get nullptr.
  GroupPtr evens = new_group({2, 0});
  GroupPtr odds = new_group({1, 3});
  GroupPtr mine = r % 2 == 0 ? evens : odds;
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(r % 2 == 0 ? odds : evens, nullptr);
  EXPECT_EQ(mine->size(), 2);
  EXPECT_EQ(mine->rank(), r / 2);
  EXPECT_EQ(mine->global_ranks(), (std::vector<int>{r % 2, r % 2 + 2}));
  EXPECT_EQ(mine->backend_name(), world->backend_name());  // default options inherit the world's
  at::Tensor members = at::empty({2}, at::kLong);
  all_gather_into_tensor(members, at::full({1}, r, at::kLong), mine);
  EXPECT_EQ(members[0].item<int64_t>(), r % 2);
  EXPECT_EQ(members[1].item<int64_t>(), r % 2 + 2);
  // A second group over the same ranks gets its own store prefix and works independently.
  GroupOptions named;
  named.name = "again";
  GroupPtr again = r == 0 || r == 2 ? new_group({0, 2}, named) : nullptr;
  if (again) {
    EXPECT_EQ(again->name(), "again");
    at::Tensor t = at::full({1}, r, at::kFloat);
    all_reduce(t, ReduceOp::SUM, again);
    EXPECT_EQ(t.item<float>(), 2.0f);
  }
  // Size-1 groups work.
  GroupPtr self = new_group({r});
  ASSERT_NE(self, nullptr);
  at::Tensor t = at::full({3}, 5.0f);
  all_reduce(t, ReduceOp::AVG, self);
  EXPECT_TRUE(assert_close(t, at::full({3}, 5.0f), Tolerance{0, 0}));
  expect_error([&] { new_group({0, 4}); }, {"new_group: rank 4 is not in the world [0, 4)"});
  expect_error([&] { new_group({1, 1}); }, {"new_group: rank 1 appears twice"});

  // destroy, then a new world on the same store (its own key space).
  destroy_process_group();
  EXPECT_FALSE(is_initialized());
  GroupOptions opts;
  opts.backend = ctx().backend;
  GroupPtr world2 = init_process_group(ctx().store, r, 4, opts);
  at::Tensor s = at::full({1}, 1.0f);
  all_reduce(s);
  EXPECT_EQ(s.item<float>(), 4.0f);
  destroy_process_group();
}

// ------------------------------------------------------------------ registry and plug-ins
std::string build_dir() { return std::filesystem::canonical("/proc/self/exe").parent_path().string(); }

TDC_DIST_TEST(CommTest, BackendRegistryAndExamplePlugin, .world_size = 4) {
  GroupPtr world = tdc::conformance::world();
  const int r = world->rank();
  auto& registry = BackendRegistry::instance();
  EXPECT_TRUE(registry.has("gloo"));
  expect_error([&] { registry.create("no-such-backend", ctx().store, r, 4, {}); },
               {"unknown c10d backend 'no-such-backend'; known backends: ", "gloo"});
  expect_error([&] { registry.add("gloo", [](auto&&...) { return c10::intrusive_ptr<c10d::Backend>(); }); },
               {"backend 'gloo' is already registered"});
  const std::string missing = build_dir() + "/libdoes_not_exist.so";
  expect_error([&] { registry.load_plugin(missing); }, {"cannot load backend plug-in '" + missing + "'"});
  const std::string bad = build_dir() + "/libtdc_bad_plugin.so";
  expect_error([&] { registry.load_plugin(bad); },
               {"backend plug-in '" + bad + "' does not export extern \"C\" tdc_register_backends"});

  const std::string lib = build_dir() + "/libtdc_example_backend.so";
  registry.load_plugin(lib);
  registry.load_plugin(lib);  // idempotent
  ASSERT_TRUE(registry.has("example"));
  void* handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr) << dlerror();
  auto served = reinterpret_cast<int64_t (*)()>(dlsym(handle, "tdc_example_backend_ops_served"));
  ASSERT_NE(served, nullptr);

  GroupOptions opts;
  opts.backend = "example";
  opts.name = "example-world";
  GroupPtr ex = new_group({0, 1, 2, 3}, opts);
  EXPECT_EQ(ex->backend().getBackendName(), "example");
  EXPECT_FALSE(ex->native_reduce_scatter().has_value());  // undeclared: the first reduce-scatter tells
  // Checks off so that every op the backend serves is one of ours.
  set_argument_checks(false);
  const int64_t before = served();
  std::vector<at::Tensor> all;
  for (int k = 0; k < 4; ++k) all.push_back(input_of(k, {8, 2}).to(at::kFloat));
  at::Tensor t = all[r].clone();
  all_reduce(t, ReduceOp::AVG, ex);
  EXPECT_TRUE(close_in_dtype(t, reduce_f64(all, ReduceOp::AVG).to(at::kFloat))) << "example all_reduce AVG";
  at::Tensor gathered = at::empty({32, 2});
  all_gather_into_tensor(gathered, all[r], ex);
  EXPECT_TRUE(close_in_dtype(gathered, at::cat(all).to(at::kFloat))) << "example all_gather";
  at::Tensor shard = at::empty({2, 2});
  reduce_scatter_tensor(shard, all[r], ReduceOp::SUM, ex);  // refused by c10d's Backend: one alltoall_base
  EXPECT_TRUE(close_in_dtype(shard, reduce_f64(all, ReduceOp::SUM).chunk(4)[r].to(at::kFloat)))
      << "example reduce_scatter";
  EXPECT_EQ(ex->native_reduce_scatter(), std::optional<bool>(false));
  at::Tensor b = all[r].clone();
  broadcast(b, 2, ex);
  EXPECT_TRUE(close_in_dtype(b, all[2].to(at::kFloat))) << "example broadcast";
  barrier(ex);
  EXPECT_EQ(served() - before, 5);
  set_argument_checks(true);
  at::Tensor checked = at::ones({2});
  all_reduce(checked, ReduceOp::SUM, ex);  // with checks: fingerprint all-gather + the op
  EXPECT_EQ(served() - before, 7);
}

// [Note: native ops or emulation]: a plug-in's own reduce-scatter is the one that runs, so a
// wrong one shows in the results instead of being papered over by tdc's emulation.
TDC_DIST_TEST(CommTest, PluginsOwnReduceScatterIsUsed, .world_size = 4) {
  tdc::conformance::world();
  auto& registry = BackendRegistry::instance();
  const std::string lib = build_dir() + "/libtdc_example_backend.so";
  registry.load_plugin(lib);
  void* handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr) << dlerror();
  auto reduce_scatters = reinterpret_cast<int64_t (*)()>(dlsym(handle, "tdc_example_backend_reduce_scatters"));
  ASSERT_NE(reduce_scatters, nullptr);
  const int r = tdc::harness::ctx().rank;
  std::vector<at::Tensor> all;
  for (int k = 0; k < 4; ++k) all.push_back(input_of(k, {8, 2}).to(at::kFloat));
  const at::Tensor want = reduce_f64(all, ReduceOp::SUM).chunk(4)[r].to(at::kFloat);
  for (const std::string name : {"example_rs", "example_bad_rs"}) {
    SCOPED_TRACE(name);
    GroupOptions opts;
    opts.backend = name;
    opts.name = name;
    GroupPtr g = new_group({0, 1, 2, 3}, opts);
    EXPECT_FALSE(g->native_reduce_scatter().has_value());
    const int64_t before = reduce_scatters();
    at::Tensor shard = at::empty({2, 2});
    reduce_scatter_tensor(shard, all[r], ReduceOp::SUM, g);
    EXPECT_EQ(reduce_scatters() - before, 1) << "the plug-in's _reduce_scatter_base served it";
    EXPECT_EQ(g->native_reduce_scatter(), std::optional<bool>(true));
    // [Note: which ops ran natively]: what results.json's comm_ops will say for this backend.
    EXPECT_EQ(tdc::comm::op_paths()[name + ".native"], std::set<std::string>{"reduce_scatter_tensor"});
    EXPECT_EQ(tdc::comm::op_paths().count(name + ".emulated"), 0u);
    if (name == "example_rs") {
      EXPECT_TRUE(close_in_dtype(shard, want));
    } else {
      EXPECT_FALSE(close_in_dtype(shard, want)) << "the deliberately wrong reduce-scatter went unseen";
    }
  }
}

// [Note: which ops ran natively]: Gloo has no AVG, and tdc reduce-scatters SUM and
// AVG by all-to-all ([Note: a reduce-scatter by all-to-all, in the ring's order]), so an AVG reduce-scatter
// records both as emulated; MAX runs Gloo's own; a group told to use the emulations records every
// reduce-scatter as emulated; a reset forgets everything.
TDC_DIST_TEST(CommTest, OpPathsSayWhatRanNatively, .world_size = 2) {
  tdc::conformance::world();
  auto gloo_group = [](const std::string& name) {
    GroupOptions opts;
    opts.backend = "gloo";
    opts.name = name;
    return new_group({0, 1}, opts);
  };
  GroupPtr native = gloo_group("native"), emulating = gloo_group("emulating");
  emulating->use_emulations();
  auto ran = [](const std::string& key, const std::string& op) { return tdc::comm::op_paths()[key].count(op) == 1; };
  tdc::comm::reset_op_paths();
  at::Tensor in = at::ones({4}), out = at::empty({2});
  reduce_scatter_tensor(out, in, ReduceOp::AVG, native);
  EXPECT_TRUE(assert_close(out, at::ones({2}), Tolerance{0, 0}));
  EXPECT_TRUE(ran("gloo.emulated", "reduce_scatter_tensor")) << "two ranks: all-to-all and one addition";
  EXPECT_TRUE(ran("gloo.emulated", "AVG")) << "Gloo has no AVG: tdc sums and divides";
  EXPECT_FALSE(ran("gloo.native", "reduce_scatter_tensor"));
  reduce_scatter_tensor(out, in, ReduceOp::MAX, native);
  EXPECT_TRUE(assert_close(out, at::ones({2}), Tolerance{0, 0}));
  EXPECT_EQ(ran("gloo.native", "reduce_scatter_tensor"), tdc::compat::kGlooReduceScatterHonoursOp);
  tdc::comm::reset_op_paths();
  reduce_scatter_tensor(out, in, ReduceOp::MAX, emulating);
  EXPECT_TRUE(assert_close(out, at::ones({2}), Tolerance{0, 0}));
  EXPECT_TRUE(ran("gloo.emulated", "reduce_scatter_tensor"));
  EXPECT_FALSE(ran("gloo.native", "reduce_scatter_tensor"));
  EXPECT_FALSE(ran("gloo.native", "all_reduce"));
  all_reduce(in, ReduceOp::SUM, native);
  EXPECT_TRUE(ran("gloo.emulated", "all_reduce")) << "a small SUM is one all-to-all ([Note: gathers by all-to-all])";
  EXPECT_FALSE(ran("gloo.native", "all_reduce"));
  all_reduce(in, ReduceOp::MAX, native);
  EXPECT_TRUE(ran("gloo.native", "all_reduce"));
  tdc::comm::reset_op_paths();
  EXPECT_TRUE(tdc::comm::op_paths().empty());
}

// Patch points (common_fsdp.py's patch_all_gather / patch_reduce_scatter): the newest patch sees every all_gather_into_tensor / reduce_scatter_tensor
// of this rank with the real op as call_original; destroying it restores the previous one.
TDC_DIST_TEST(CommTest, PatchPoints, .world_size = 2) {
  auto group = tdc::conformance::world();
  const int n = group->size();
  auto gather = [&] {
    at::Tensor in = at::full({2}, static_cast<float>(group->rank())), out = at::empty({2 * n});
    tdc::comm::all_gather_into_tensor(out, in, group);
    return out;
  };
  int outer = 0, inner = 0;
  {
    tdc::comm::PatchAllGather p1([&](at::Tensor&, const at::Tensor&, const tdc::comm::GroupPtr&, bool,
                                     const std::function<tdc::comm::Work()>& original) {
      ++outer;
      return original();
    });
    EXPECT_TRUE(assert_close(gather(), at::tensor({0.f, 0.f, 1.f, 1.f}), Tolerance{0, 0}));
    {
      tdc::comm::PatchAllGather p2([&](at::Tensor&, const at::Tensor&, const tdc::comm::GroupPtr&, bool,
                                       const std::function<tdc::comm::Work()>& original) {
        ++inner;
        return original();
      });
      gather();
      gather();
    }
    gather();
  }
  gather();
  EXPECT_EQ(outer, 2) << "the outer patch saw the calls before and after the inner one";
  EXPECT_EQ(inner, 2) << "the inner patch saw its two calls, the outer one did not";

  int rs = 0;
  tdc::comm::PatchReduceScatter p3([&](at::Tensor&, const at::Tensor&, tdc::comm::ReduceOp op,
                                       const tdc::comm::GroupPtr&, bool,
                                       const std::function<tdc::comm::Work()>& original) {
    EXPECT_EQ(op, tdc::comm::ReduceOp::SUM);
    ++rs;
    return original();
  });
  at::Tensor in = at::ones({2 * n}), out = at::empty({2});
  tdc::comm::reduce_scatter_tensor(out, in, tdc::comm::ReduceOp::SUM, group);
  EXPECT_EQ(rs, 1);
  EXPECT_TRUE(assert_close(out, at::full({2}, static_cast<float>(n)), Tolerance{0, 0}));
}

}  // namespace
