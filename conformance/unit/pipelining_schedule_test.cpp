// The pipeline schedule IR (tdc/pipelining/schedule_ir.h) against PyTorch 2.13's schedules.py:
//   - every case of pp_schedules.json (tools/pipelining/pp_schedules.py, run by CTest with the
//     venv's PyTorch before this suite): compute orders, lowered lists and stage maps string for
//     string, 1F1B against the order PyTorch executes (its pipeline_order is wrong on the last rank),
//     rejections with PyTorch's messages;
//   - the text form of actions: round trips and rejections;
//   - validate_comms on hand-written broken schedules, and on every lowered list of both sides.
// Pure functions, one process: plain TESTs.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <set>
#include <sstream>

#include "tdc/conformance/pytorch_goldens.h"
#include "tdc/pipelining/schedule_ir.h"

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using namespace tdc::pipelining;

// ------------------------------------------------------------------ helpers

// Computed by the venv's PyTorch on this machine ([Note: goldens are computed where they are checked]).
const json& goldens() { return tdc::conformance::pytorch_goldens("pp_schedules.json"); }

using Strings = std::vector<std::string>;  // "." = idle step

Strings strs(const std::vector<std::optional<Action>>& actions) {
  Strings out;
  for (const auto& a : actions) out.push_back(a ? a->str() : ".");
  return out;
}
Strings strs(const std::vector<Action>& actions) {
  return strs(std::vector<std::optional<Action>>(actions.begin(), actions.end()));
}

Strings strs(const json& list) {
  Strings out;
  for (const auto& a : list) out.push_back(a.is_null() ? "." : a.get<std::string>());
  return out;
}

std::string joined(const Strings& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : " ") + x;
  return out;
}

// Equal lists, else the first differing position and both lists.
::testing::AssertionResult same_list(const Strings& tdc, const Strings& torch) {
  if (tdc == torch) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < tdc.size() && i < torch.size() && tdc[i] == torch[i]) ++i;
  auto at = [&](const Strings& s) { return i < s.size() ? s[i] : std::string("(end)"); };
  return ::testing::AssertionFailure() << fmt::format(
             "first difference at position {}: tdc {} vs PyTorch {} (lengths {} and {})\n  tdc:     {}\n  PyTorch: {}",
             i, at(tdc), at(torch), tdc.size(), torch.size(), joined(tdc), joined(torch));
}

// Only the F and B of one rank, without the stage: the form of the golden's "trace".
Strings forward_backward(const std::vector<std::optional<Action>>& actions) {
  Strings out;
  for (const auto& a : actions)
    if (a && (a->type == ActionType::Forward || a->type == ActionType::FullBackward))
      out.push_back(fmt::format("{}{}", to_string(a->type), *a->microbatch));
  return out;
}

// PyTorch's lowered lists, parsed back (each string must round trip).
ActionLists parse_lists(const json& per_rank) {
  ActionLists out;
  for (const auto& [rank, list] : per_rank.items()) {
    for (const auto& s : list) {
      std::optional<Action> a = parse_action(s.get<std::string>());
      EXPECT_TRUE(a && a->str() == s.get<std::string>()) << s;
      if (a) out[std::stoi(rank)].push_back(*a);
    }
  }
  return out;
}

StageToRank stage_map(const json& j) {
  StageToRank out;
  for (const auto& [stage, rank] : j.items()) out[std::stoi(stage)] = rank.get<int>();
  return out;
}

std::string case_name(const json& c) {
  return fmt::format("{} pp={} stages_per_rank={} n_microbatches={}", c["schedule"].get<std::string>(),
                     c["pp"].get<int>(), c["stages_per_rank"].get<int>(), c["n_microbatches"].get<int>());
}

ScheduleShape shape_of(const json& c) {
  return {c["pp"].get<int>(), c["stages_per_rank"].get<int>(), c["n_microbatches"].get<int>()};
}

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception thrown";
  return "";
}

// "rank: actions" lines in text form, e.g. {{0, "0F0 0SEND_F0"}, {1, "1RECV_F0 1F0"}}.
ActionLists lists(const std::map<int, std::string>& text) {
  ActionLists out;
  for (const auto& [rank, line] : text) {
    std::istringstream in(line);
    for (std::string s; in >> s;) out[rank].push_back(*parse_action(s));
  }
  return out;
}

const std::vector<ScheduleKind> kAllKinds = {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B,
                                             ScheduleKind::LoopedBFS, ScheduleKind::InterleavedZeroBubble};

// The golden's matrix, regenerated: every case must be there, none twice.
std::set<std::string> expected_matrix() {
  std::set<std::string> out;
  for (ScheduleKind kind : kAllKinds)
    for (int pp : {2, 4})
      for (int spr : is_single_stage(kind) ? std::vector<int>{1} : std::vector<int>{1, 2})
        for (int n : {pp, 2 * pp, 3, 5, 8})
          out.insert(fmt::format("{} pp={} stages_per_rank={} n_microbatches={}", schedule_name(kind), pp, spr, n));
  return out;
}

// ------------------------------------------------------------------ (a) the golden matrix

// GPipe and 1F1B: PyTorch stores add_reduce_grad of its list, and runs its own loop (the trace).
void compare_single(ScheduleKind kind, const ScheduleShape& shape, const ComputeOrder& order, const json& c) {
  for (const auto& [rank, actions] : order) {
    SCOPED_TRACE(fmt::format("rank {}", rank));
    const std::string r = std::to_string(rank);
    EXPECT_TRUE(same_list(forward_backward(actions), strs(c["trace"][r])));
    const Strings stored = strs(add_reduce_grad(actions, shape.n_microbatches));
    if (kind == ScheduleKind::OneFOneB && rank == shape.pp - 1) {
      // PyTorch's list for the last rank starts at F1 (docs/design/pipelining.md §3); when
      // this fails, upstream fixed it and the list can be compared like the others.
      EXPECT_EQ(strs(c["compute"][r]).front(), fmt::format("{}F1", rank));
      EXPECT_FALSE(same_list(stored, strs(c["compute"][r])));
    } else {
      EXPECT_TRUE(same_list(stored, strs(c["compute"][r])));
    }
  }
  EXPECT_EQ(loop_placement(shape.pp, shape.num_stages()), stage_map(c["stage_to_rank"]));
  // PyTorch does not lower single-stage schedules; tdc's orders (1F1B's included) lower to valid lists.
  validate_comms(lower(order, shape.n_microbatches), loop_placement(shape.pp, shape.num_stages()), shape.num_stages(),
                 shape.n_microbatches);
}

void compare_multi(const ScheduleShape& shape, const ComputeOrder& order, const json& c) {
  const ActionLists lowered = lower(order, shape.n_microbatches);
  for (const auto& [rank, actions] : order) {
    SCOPED_TRACE(fmt::format("rank {}", rank));
    const std::string r = std::to_string(rank);
    EXPECT_TRUE(same_list(strs(actions), strs(c["compute"][r]))) << "compute order";
    EXPECT_TRUE(same_list(strs(lowered.at(rank)), strs(c["lowered"][r]))) << "lowered";
  }
  EXPECT_EQ(order.size(), c["compute"].size());
  EXPECT_EQ(lowered.size(), c["lowered"].size());
  const StageToRank map = validate_compute(order, shape.pp, shape.num_stages(), shape.n_microbatches);
  EXPECT_EQ(map, stage_map(c["stage_to_rank"]));
  EXPECT_EQ(map, loop_placement(shape.pp, shape.num_stages()));
  validate_comms(lowered, map, shape.num_stages(), shape.n_microbatches);
  validate_comms(parse_lists(c["lowered"]), map, shape.num_stages(), shape.n_microbatches);
}

TEST(PipelineScheduleGolden, EveryCaseMatchesPyTorch) {
  const json& cases = goldens()["cases"];
  ASSERT_TRUE(cases.is_array());
  ASSERT_GT(cases.size(), 0u) << "pp_schedules.json has no cases";
  std::set<std::string> seen;
  std::map<std::string, int> constructed, rejected;
  for (const json& c : cases) {
    const std::string name = case_name(c);
    SCOPED_TRACE(name);
    EXPECT_TRUE(seen.insert(name).second) << "case twice in the golden";
    const ScheduleKind kind = schedule_kind(c["schedule"].get<std::string>());
    const ScheduleShape shape = shape_of(c);
    if (!c["error"].is_null()) {
      EXPECT_EQ(message_of<std::invalid_argument>([&] { compute_order(kind, shape); }), c["error"].get<std::string>());
      ++rejected[c["schedule"].get<std::string>()];
      continue;
    }
    const ComputeOrder order = compute_order(kind, shape);
    EXPECT_NO_THROW(is_single_stage(kind) ? compare_single(kind, shape, order, c) : compare_multi(shape, order, c));
    ++constructed[c["schedule"].get<std::string>()];
  }
  const std::set<std::string> matrix = expected_matrix();
  for (const auto& name : matrix) EXPECT_TRUE(seen.contains(name)) << "the golden lacks the case " << name;
  for (const auto& name : seen)
    EXPECT_TRUE(matrix.contains(name)) << "the golden has a case outside the matrix: " << name;
  for (ScheduleKind kind : kAllKinds)
    EXPECT_GT(constructed[std::string(schedule_name(kind))], 0) << schedule_name(kind) << " has no constructed case";
  int n_constructed = 0, n_rejected = 0;
  for (const auto& [k, n] : constructed) n_constructed += n;
  for (const auto& [k, n] : rejected) n_rejected += n;
  EXPECT_EQ(n_constructed + n_rejected, static_cast<int>(cases.size()));
  // 1F1B pp=4 n=3; Interleaved1F1B and InterleavedZeroBubble pp=2 n=5 with 1 and 2 stages per rank.
  EXPECT_EQ(n_rejected, 5);
  std::cout << fmt::format("[ golden   ] {} cases compared with torch {}: {} constructed, {} rejected\n", cases.size(),
                           goldens()["torch"].get<std::string>(), n_constructed, n_rejected);
}

// PyTorch's defer_pp_recv moves each RECV to just before its consumer, which on a few shapes puts
// a pair's receives in another order than the peer's sends (docs/design/pipelining.md §4.4).
// The golden says which lists keep the order (checked in Python); validate_comms must refuse
// exactly the others, naming the mismatched pair.
TEST(PipelineScheduleGolden, DeferredRecvListsThatBreakThePairOrderAreRefused) {
  if (!goldens().value("defer_pp_recv", true))
    GTEST_SKIP() << "the oracle, PyTorch " << goldens()["torch_version"].get<std::string>()
                 << ", has no defer_pp_recv (it arrived in 2.13): no deferred lists to check";
  int checked = 0, refused = 0;
  for (const json& c : goldens()["cases"]) {
    if (!c.contains("lowered_defer_recv")) continue;
    SCOPED_TRACE(case_name(c));
    const ScheduleShape shape = shape_of(c);
    const ActionLists deferred = parse_lists(c["lowered_defer_recv"]);
    auto check = [&] {
      validate_comms(deferred, stage_map(c["stage_to_rank"]), shape.num_stages(), shape.n_microbatches);
    };
    ++checked;
    if (c["defer_recv_fifo_ok"].get<bool>()) {
      EXPECT_NO_THROW(check());
    } else {
      EXPECT_THAT(message_of<ScheduleError>(check), HasSubstr("does not match"));
      ++refused;
    }
  }
  EXPECT_GT(checked, 0) << "the golden has no lowered_defer_recv lists";
  EXPECT_GT(refused, 0) << "no deferred list breaks the pair order any more: the test checks nothing";
  std::cout << fmt::format("[ golden   ] {} defer_pp_recv lists checked, {} refused for their pair order\n", checked,
                           refused);
}

// Beyond the golden's matrix: every shape a schedule accepts lowers, and the lists pass validate_comms.
TEST(PipelineScheduleGolden, EveryAcceptedShapeLowersToValidLists) {
  int lowered = 0;
  for (ScheduleKind kind : kAllKinds) {
    for (int pp = 1; pp <= 5; ++pp) {
      for (int spr = 1; spr <= (is_single_stage(kind) ? 1 : 3); ++spr) {
        for (int n = 1; n <= 12; ++n) {
          const ScheduleShape shape{pp, spr, n};
          SCOPED_TRACE(fmt::format("{} pp={} stages_per_rank={} n_microbatches={}", schedule_name(kind), pp, spr, n));
          ComputeOrder order;
          try {
            order = compute_order(kind, shape);
          } catch (const std::invalid_argument&) {
            continue;
          }
          EXPECT_NO_THROW(
              validate_comms(lower(order, n), loop_placement(pp, shape.num_stages()), shape.num_stages(), n));
          ++lowered;
        }
      }
    }
  }
  EXPECT_GT(lowered, 400);
}

// The seed test's shape, spelled out (docs/design/pipelining.md §3), so a reader sees one list.
TEST(PipelineScheduleGolden, SeedShapeRankZero) {
  const auto order = compute_order(ScheduleKind::InterleavedZeroBubble, {2, 2, 8});
  const Strings zb = strs(order.at(0));
  EXPECT_EQ(joined(Strings(zb.begin(), zb.begin() + 15)), "0F0 0F1 2F0 . 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1");
  const auto bfs = compute_order(ScheduleKind::LoopedBFS, {2, 2, 8});
  EXPECT_EQ(joined(strs(bfs.at(0))),
            "0F0 0F1 0F2 0F3 0F4 0F5 0F6 0F7 2F0 2F1 2F2 2F3 2F4 2F5 2F6 2F7 . . "
            "2B7 2B6 2B5 2B4 2B3 2B2 2B1 2B0 0B7 0B6 0B5 0B4 0B3 0B2 0B1 0B0");
  const auto one_f_one_b = compute_order(ScheduleKind::OneFOneB, {4, 1, 4});
  EXPECT_EQ(joined(strs(one_f_one_b.at(3))), ". . . 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3");
}

// ------------------------------------------------------------------ (b) the text form

TEST(PipelineAction, RoundTrips) {
  for (std::string s : {"0F0", "12F34", "3SEND_B2", "1RECV_F0", "0SEND_F7", "2RECV_B1", "1UNSHARD", "0RESHARD",
                        "2REDUCE_GRAD", "0I3", "0W3", "5B0", "(0F3;3B1)OVERLAP_F_B"}) {
    std::optional<Action> a = parse_action(s);
    ASSERT_TRUE(a.has_value()) << s;
    EXPECT_EQ(a->str(), s);
  }
  const Action overlap = *parse_action(" (0F3;3B1)OVERLAP_F_B ");
  EXPECT_EQ(overlap.type, ActionType::OverlapFB);
  EXPECT_EQ(overlap.stage, -1);  // as PyTorch: the container has no stage of its own
  ASSERT_EQ(overlap.sub_actions.size(), 2u);
  EXPECT_EQ(overlap.sub_actions[1], (Action{3, ActionType::FullBackward, 1, {}}));
  EXPECT_TRUE(overlap.is_compute());
  EXPECT_FALSE(parse_action("1SEND_F0")->is_compute());
  EXPECT_EQ(parse_action("  2F1\t"), (Action{2, ActionType::Forward, 1, {}}));
}

TEST(PipelineAction, EmptyIsAnIdleStep) {
  EXPECT_EQ(parse_action(""), std::nullopt);
  EXPECT_EQ(parse_action("   "), std::nullopt);
}

TEST(PipelineAction, MalformedStringsAreRefusedByName) {
  for (std::string s : {"F0", "0X1", "0F1x", "-1F0", "0F", "1UNSHARD2", "(0F3;3B1)", "(0F3;)OVERLAP_F_B",
                        "(0F3;1SEND_F0)OVERLAP_F_B", "99999999999F0", "0F1 2F0"}) {
    const std::string msg = message_of<ScheduleError>([&] { parse_action(s); });
    EXPECT_THAT(msg, HasSubstr("Invalid action string: '" + s + "'")) << s;
  }
  EXPECT_THAT(message_of<ScheduleError>([] { parse_action("0F1x"); }), HasSubstr("trailing 'x'"));
}

// ------------------------------------------------------------------ lowering passes

TEST(PipelineLowering, UnshardReshardKeepsThreeStagesAhead) {
  std::vector<std::optional<Action>> compute;
  for (std::string s : {"0F0", "", "2F0", "4F0", "6F0", "0B0"}) compute.push_back(parse_action(s));
  EXPECT_EQ(joined(strs(add_unshard_reshard(compute))),
            "0UNSHARD 2UNSHARD 4UNSHARD 0F0 0RESHARD 6UNSHARD 2F0 2RESHARD 0UNSHARD 4F0 4RESHARD 6F0 6RESHARD 0B0 "
            "0RESHARD");  // what PyTorch's _add_unshard_reshard returns for this list
}

TEST(PipelineLowering, ReduceGradFollowsTheLastBackwardOrWeight) {
  std::vector<std::optional<Action>> compute;
  for (std::string s : {"0F0", "0F1", "", "0I0", "0B1", "0W0"}) compute.push_back(parse_action(s));
  EXPECT_EQ(joined(strs(add_reduce_grad(compute, 2))), "0F0 0F1 0I0 0B1 0W0 0REDUCE_GRAD");
}

TEST(PipelineLowering, SendRecvWithoutProgressNamesEveryBlockedRank) {
  const std::string msg = message_of<ScheduleError>([] {
    add_send_recv(lists({{0, "0B0 0F0"}, {1, "1F0 1B0"}}), loop_placement(2, 2), 2);
  });
  EXPECT_THAT(msg, HasSubstr("rank 0 at step 0: 0B0 waits for 0RECV_B0 or 1I0 or 1B0"));
  EXPECT_THAT(msg, HasSubstr("rank 1 at step 0: 1F0 waits for 1RECV_F0 or 0F0"));
}

TEST(PipelineLowering, ValidateComputeUsesPyTorchsMessages) {
  ComputeOrder buggy;  // PyTorch's Schedule1F1B list for the last of 2 ranks, n=2, and a correct rank 0
  for (std::string s : {"0F0", "0F1", "0B0", "0B1"}) buggy[0].push_back(parse_action(s));
  for (std::string s : {"", "1F1", "1B0", "1F2", "1B1"}) buggy[1].push_back(parse_action(s));
  EXPECT_THAT(
      message_of<ScheduleError>([&] { validate_compute(buggy, 2, 2, 2); }),
      HasSubstr("Rank 1, step 2: Running Full Backward for stage 1, microbatch 0 without first running Forward"));
  ComputeOrder unequal{{0, {parse_action("0F0"), parse_action("0I0")}}};
  EXPECT_EQ(message_of<ScheduleError>([&] { validate_compute(unequal, 1, 1, 1); }),
            "Invalid backward microbatches for stage 0: I and W must have equal counts,             but got I=1, W=0");
  EXPECT_EQ(message_of<ScheduleError>([&] { validate_compute(unequal, 2, 1, 1); }),
            "Schedule has incorrect number of ranks - expected 2, actual 1");
  ComputeOrder shared{{0, {parse_action("0F0")}}, {1, {parse_action("0B0")}}};
  EXPECT_THAT(message_of<ScheduleError>([&] { validate_compute(shared, 2, 1, 1); }),
              HasSubstr("Rank 1, step 0: Stage 0 is assigned to both rank 1 and rank 0"));
  ComputeOrder comms{{0, {parse_action("0F0"), parse_action("0SEND_F0"), parse_action("0B0")}}};
  EXPECT_EQ(message_of<ScheduleError>([&] { lower(comms, 1); }),
            "Expected compute-only schedule but found communication action '0SEND_F0' at rank 0, position 1. "
            "Communication actions (e.g. SEND_F, RECV_F, etc.) should not be present when format='compute_only'.");
}

// ------------------------------------------------------------------ (c) validate_comms refusals

// pp=2, one stage per rank, two microbatches, valid as written; each test breaks one thing.
const std::string kRank0 = "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1";
const std::string kRank1 = "1RECV_F0 1RECV_F1 1F0 1B0 1SEND_B0 1F1 1B1 1SEND_B1";

std::string comms_error(const std::map<int, std::string>& text) {
  return message_of<ScheduleError>([&] { validate_comms(lists(text), loop_placement(2, 2), 2, 2); });
}

TEST(PipelineValidateComms, TheBaseScheduleIsValid) {
  EXPECT_NO_THROW(validate_comms(lists({{0, kRank0}, {1, kRank1}}), loop_placement(2, 2), 2, 2));
}

TEST(PipelineValidateComms, SendsOutOfOrderOnOnePairAreRefused) {
  const std::string msg = comms_error({{0, "0F0 0F1 0SEND_F1 0SEND_F0 0RECV_B0 0B0 0RECV_B1 0B1"}, {1, kRank1}});
  EXPECT_THAT(msg, HasSubstr("message 0 from rank 0 to rank 1 does not match"));
  EXPECT_THAT(msg, HasSubstr("rank 0 sends 0SEND_F1 (step 2) while rank 1 receives 1RECV_F0 (step 0)"));
}

TEST(PipelineValidateComms, RecvWithoutSendIsRefused) {
  const std::string unmatched = comms_error(
      {{0, "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1"}, {1, "1RECV_F0 1RECV_F1 1F0 1B0 1SEND_B0 1F1 1B1"}});
  EXPECT_THAT(unmatched, HasSubstr("rank 0's 0RECV_B1 (step 6) from rank 1 has no SEND on rank 1"));
}

TEST(PipelineValidateComms, SendWithoutRecvIsRefused) {
  const std::string msg = comms_error({{0, "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0"}, {1, kRank1}});
  EXPECT_THAT(msg, HasSubstr("rank 1's 1SEND_B1 (step 7) to rank 0 has no RECV on rank 0"));
}

TEST(PipelineValidateComms, DeadlockNamesEveryBlockedRankAndItsPeer) {
  const std::string msg = comms_error({{0, "0F0 0F1 0RECV_B0 0B0 0SEND_F0 0SEND_F1 0RECV_B1 0B1"}, {1, kRank1}});
  EXPECT_THAT(msg, HasSubstr("deadlock"));
  EXPECT_THAT(msg,
              HasSubstr("rank 0 at step 3 (0B0) waits for rank 1 to post 1SEND_B0; it is blocked at step 2 (1F0)"));
  EXPECT_THAT(msg,
              HasSubstr("rank 1 at step 2 (1F0) waits for rank 0 to post 0SEND_F0; it is blocked at step 3 (0B0)"));
  const std::string finished = comms_error({{0, kRank0}, {1, "1RECV_F0 1RECV_F1 1F0 1B0 1F1 1B1"}});
  EXPECT_THAT(finished,
              HasSubstr("rank 0 at step 5 (0B0) waits for rank 1 to post 1SEND_B0; it has finished its list"));
}

TEST(PipelineValidateComms, ComputeWithoutItsRecvIsRefused) {
  const std::string msg = comms_error({{0, kRank0}, {1, "1F0 1RECV_F0 1RECV_F1 1B0 1SEND_B0 1F1 1B1 1SEND_B1"}});
  EXPECT_THAT(msg, HasSubstr("rank 1, step 0 (1F0): its input comes from rank 0 but no 1RECV_F0 was posted before it"));
}

TEST(PipelineValidateComms, ReshardWithoutUnshardIsRefused) {
  EXPECT_THAT(comms_error({{0, "0F0 0SEND_F0 0RESHARD"}, {1, kRank1}}),
              HasSubstr("rank 0, step 2 (0RESHARD): RESHARD of stage 0 without an UNSHARD before it"));
  EXPECT_THAT(comms_error({{0, "0UNSHARD 0F0 0SEND_F0 0RESHARD 0F1"}, {1, kRank1}}),
              HasSubstr("rank 0, step 4 (0F1): stage 0 is not unsharded here"));
  EXPECT_THAT(comms_error({{0, "0UNSHARD 0UNSHARD"}, {1, kRank1}}),
              HasSubstr("rank 0, step 1 (0UNSHARD): stage 0 is already unsharded"));
}

TEST(PipelineValidateComms, StageOnTheWrongRankIsRefused) {
  EXPECT_THAT(comms_error({{0, "1F0 " + kRank0}, {1, kRank1}}),
              HasSubstr("rank 0, step 0 (1F0): stage 1 lives on rank 1, not on rank 0"));
}

TEST(PipelineValidateComms, SendBeforeItsComputeAndEarlyReduceGradAreRefused) {
  EXPECT_THAT(comms_error({{0, "0SEND_F0 0F0"}, {1, kRank1}}),
              HasSubstr("rank 0, step 0 (0SEND_F0): sends a result this rank has not computed yet"));
  EXPECT_THAT(comms_error({{0, "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0REDUCE_GRAD"}, {1, kRank1}}),
              HasSubstr("rank 0, step 6 (0REDUCE_GRAD): stage 0 has run 1 of its 2 backwards"));
}

// ------------------------------------------------------------------ (d) compute_order refusals

TEST(PipelineComputeOrder, RefusesWhatPyTorchRefusesWithItsMessage) {
  EXPECT_EQ(message_of<std::invalid_argument>([] {
              compute_order(ScheduleKind::OneFOneB, {4, 1, 3});
            }),
            "Number of microbatches (3) must be greater than or equal to the number of stages (4).");
  EXPECT_EQ(message_of<std::invalid_argument>([] {
              compute_order(ScheduleKind::Interleaved1F1B, {2, 2, 5});
            }),
            "Interleaved 1F1B requires the number of microbatches to be a multiple of the number of rounds (2), but "
            "got 5.");
  EXPECT_EQ(message_of<std::invalid_argument>([] {
              compute_order(ScheduleKind::InterleavedZeroBubble, {2, 1, 5});
            }),
            "Zero bubble requires the number of microbatches to be a multiple of the number of rounds (2), but got 5.");
}

TEST(PipelineComputeOrder, RefusesShapesNoScheduleTakesByValue) {
  EXPECT_THAT(message_of<std::invalid_argument>([] {
                compute_order(ScheduleKind::GPipe, {2, 2, 4});
              }),
              HasSubstr("ScheduleGPipe runs exactly one stage per rank, got stages_per_rank 2"));
  EXPECT_THAT(message_of<std::invalid_argument>([] {
                compute_order(ScheduleKind::OneFOneB, {2, 3, 4});
              }),
              HasSubstr("stages_per_rank 3"));
  EXPECT_THAT(message_of<std::invalid_argument>([] {
                compute_order(ScheduleKind::LoopedBFS, {0, 1, 4});
              }),
              HasSubstr("pp must be at least 1, got 0"));
  EXPECT_THAT(message_of<std::invalid_argument>([] {
                compute_order(ScheduleKind::Interleaved1F1B, {2, 1, 0});
              }),
              HasSubstr("n_microbatches must be at least 1, got 0"));
  EXPECT_THAT(message_of<std::invalid_argument>([] {
                compute_order(ScheduleKind::LoopedBFS, {2, 0, 4});
              }),
              HasSubstr("stages_per_rank must be at least 1, got 0"));
}

TEST(PipelineComputeOrder, ScheduleNamesAsGetScheduleClassTakesThem) {
  EXPECT_EQ(schedule_kind("gpipe"), ScheduleKind::GPipe);
  EXPECT_EQ(schedule_kind("Schedule1F1B"), ScheduleKind::OneFOneB);
  EXPECT_EQ(schedule_kind("INTERLEAVED1F1B"), ScheduleKind::Interleaved1F1B);
  EXPECT_EQ(schedule_kind("scheduleloopedbfs"), ScheduleKind::LoopedBFS);
  EXPECT_EQ(schedule_kind("InterleavedZeroBubble"), ScheduleKind::InterleavedZeroBubble);
  EXPECT_THAT(message_of<std::invalid_argument>([] { schedule_kind("ZBVZeroBubble"); }),
              HasSubstr("Unknown schedule name 'ZBVZeroBubble'"));
  for (ScheduleKind kind : kAllKinds) EXPECT_EQ(schedule_kind(schedule_name(kind)), kind);
}

}  // namespace
