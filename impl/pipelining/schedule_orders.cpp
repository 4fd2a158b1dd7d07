// The compute-only orders of the five seed schedules (schedules.py: the _get_pipeline_order and
// _calculate_single_rank_operations of each class), bubbles included. Integer arithmetic only;
// docs/design/pipelining.md §3 describes each shape.
#include <algorithm>
#include <array>
#include <cctype>
#include <functional>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "tdc/pipelining/schedule_ir.h"

namespace tdc::pipelining {

namespace {

using Slots = std::vector<std::optional<Action>>;

constexpr std::array<std::pair<ScheduleKind, std::string_view>, 5> kNames = {{
    {ScheduleKind::GPipe, "ScheduleGPipe"},
    {ScheduleKind::OneFOneB, "Schedule1F1B"},
    {ScheduleKind::Interleaved1F1B, "ScheduleInterleaved1F1B"},
    {ScheduleKind::LoopedBFS, "ScheduleLoopedBFS"},
    {ScheduleKind::InterleavedZeroBubble, "ScheduleInterleavedZeroBubble"},
}};

std::string lower_case(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

void add_idle(Slots& slots, int n) { slots.insert(slots.end(), std::max(n, 0), std::nullopt); }

void add(Slots& slots, int stage, ActionType type, int mb) { slots.push_back(Action{stage, type, mb, {}}); }

void check_shape(ScheduleKind kind, const ScheduleShape& shape) {
  if (shape.pp < 1)
    throw std::invalid_argument(fmt::format("{}: pp must be at least 1, got {}", schedule_name(kind), shape.pp));
  if (shape.n_microbatches < 1)
    throw std::invalid_argument(
        fmt::format("{}: n_microbatches must be at least 1, got {}", schedule_name(kind), shape.n_microbatches));
  if (shape.stages_per_rank < 1)
    throw std::invalid_argument(
        fmt::format("{}: stages_per_rank must be at least 1, got {}", schedule_name(kind), shape.stages_per_rank));
  if (is_single_stage(kind) && shape.stages_per_rank != 1)
    throw std::invalid_argument(fmt::format("{} runs exactly one stage per rank, got stages_per_rank {}",
                                            schedule_name(kind), shape.stages_per_rank));
}

// ------------------------------------------------------------------ single stage

// Fill, a drain gap of three steps per hop to the last rank, then drain.
Slots gpipe_rank(int rank, int pp, int n) {
  Slots slots;
  add_idle(slots, rank);
  for (int mb = 0; mb < n; ++mb) add(slots, rank, ActionType::Forward, mb);
  add_idle(slots, 3 * (pp - 1 - rank));
  for (int mb = 0; mb < n; ++mb) add(slots, rank, ActionType::FullBackward, mb);
  return slots;
}

// PyTorch's bubble layout (warmup, a gap of two steps per hop, F/B pairs, then "idle, B" pairs),
// with the forward counter starting at 0 on every rank. PyTorch's list starts it at 1 on the last
// rank (`1F1 1B0 ... 1F8`); what its _step_microbatches runs there is F0 B0 F1 B1 ..., and that is
// this list.
Slots one_f_one_b_rank(int rank, int pp, int n) {
  Slots slots;
  add_idle(slots, rank);
  const int warmup = pp - 1 - rank;
  int fwd = 0, bwd = 0;
  for (; fwd < warmup; ++fwd) add(slots, rank, ActionType::Forward, fwd);
  add_idle(slots, 2 * warmup);
  for (; fwd < n; ++fwd, ++bwd) {
    add(slots, rank, ActionType::Forward, fwd);
    add(slots, rank, ActionType::FullBackward, bwd);
  }
  for (; bwd < n; ++bwd) {
    add_idle(slots, 1);
    add(slots, rank, ActionType::FullBackward, bwd);
  }
  return slots;
}

// ------------------------------------------------------------------ several stages per rank

// Every forward of each local stage in ascending order, a gap of two steps per hop, then every
// backward of each local stage in descending order, microbatches descending too.
Slots looped_bfs_rank(int rank, int pp, int local_stages, int n) {
  Slots slots;
  add_idle(slots, rank);
  for (int l = 0; l < local_stages; ++l)
    for (int mb = 0; mb < n; ++mb) add(slots, l * pp + rank, ActionType::Forward, mb);
  add_idle(slots, 2 * (pp - 1 - rank));
  for (int l = local_stages - 1; l >= 0; --l)
    for (int mb = n - 1; mb >= 0; --mb) add(slots, l * pp + rank, ActionType::FullBackward, mb);
  return slots;
}

// The shared skeleton of Interleaved1F1B and InterleavedZeroBubble (schedules.py's
// _get_1f1b_rank_ops): warmup forwards, a gap, "F then B/I" steps, then cooldown backwards. Each
// stage counts its own microbatches. With zero bubble, from step `rank` of the steady phase on,
// each backward is followed by the W of the oldest backward still without one.
struct Interleaved {
  int rank, pp, local_stages, n, mb_per_round, warmup;
  bool zero_bubble;

  int forward_stage(int op) const { return ((op / mb_per_round) % local_stages) * pp + rank; }
  int backward_stage(int op) const {
    return (local_stages - 1 - ((op - warmup) / mb_per_round) % local_stages) * pp + rank;
  }

  Slots build() const {
    std::map<int, int> fwd_mb, bwd_mb, weight_mb;  // per stage: the next microbatch
    std::vector<int> backward_ops;                 // the steps whose backward still may need a W
    size_t weights_done = 0;
    const ActionType backward = zero_bubble ? ActionType::BackwardInput : ActionType::FullBackward;
    const int steady = local_stages * n - warmup;
    auto add_weight = [&](Slots& slots) {
      int stage = backward_stage(backward_ops[weights_done++]);
      add(slots, stage, ActionType::BackwardWeight, weight_mb[stage]++);
    };
    Slots slots;
    add_idle(slots, rank);
    for (int op = 0; op < warmup + steady + warmup; ++op) {
      if (op < warmup + steady) {
        int stage = forward_stage(op);
        add(slots, stage, ActionType::Forward, fwd_mb[stage]++);
        // Only after a warmup step: with no warmup at all there is no gap either (as in PyTorch).
        if (op == warmup - 1) add_idle(slots, post_warmup_gap());
        if (op < warmup) continue;
      } else if (!zero_bubble) {
        add_idle(slots, 1);
      }
      int stage = backward_stage(op);
      add(slots, stage, backward, bwd_mb[stage]++);
      backward_ops.push_back(op);
      if (zero_bubble && op - warmup >= rank) add_weight(slots);
    }
    while (zero_bubble && weights_done < backward_ops.size()) add_weight(slots);
    return slots;
  }

  // Steps until the first backward can arrive: 1F1B waits for it to travel down and back up;
  // zero bubble starts its steady phase one step per hop after the last rank.
  int post_warmup_gap() const {
    if (zero_bubble) return pp - rank - 1;
    return (local_stages * pp + 2 * (pp - 1 - rank)) - (warmup + rank);
  }
};

// Rounds of microbatches as PyTorch's interleaved schedules require them; throws their ValueError.
int microbatches_per_round(ScheduleKind kind, int pp, int n) {
  const int rounds = std::max(1, n / pp);
  if (n % rounds != 0) {
    std::string_view who = kind == ScheduleKind::Interleaved1F1B ? "Interleaved 1F1B" : "Zero bubble";
    throw std::invalid_argument(
        fmt::format("{} requires the number of microbatches to be a multiple of the number "
                    "of rounds ({}), but got {}.",
                    who, rounds, n));
  }
  return n / rounds;
}

Slots interleaved_rank(ScheduleKind kind, int rank, const ScheduleShape& shape, int mb_per_round) {
  const bool zb = kind == ScheduleKind::InterleavedZeroBubble;
  const int L = shape.stages_per_rank, pp = shape.pp, n = shape.n_microbatches;
  const int warmup = std::min((L - 1) * mb_per_round + (zb ? 1 : 2) * (pp - 1 - rank), n * L);
  return Interleaved{rank, pp, L, n, mb_per_round, warmup, zb}.build();
}

// ScheduleInterleavedZeroBubble._add_bubbles_to_actions: replays all ranks one step at a time and
// idles a rank whose next action's dependency was not seen in an earlier step. As in PyTorch the
// backward check looks for B (never in this schedule), so only forwards wait.
bool needs_bubble(const Action& a, int num_stages, const std::set<std::tuple<int, ActionType, int>>& seen) {
  const int mb = a.microbatch.value_or(-1);
  if (a.type == ActionType::Forward) return a.stage != 0 && !seen.contains({a.stage - 1, ActionType::Forward, mb});
  if (a.type == ActionType::FullBackward) {
    if (a.stage == num_stages - 1) return !seen.contains({a.stage, ActionType::Forward, mb});
    return !seen.contains({a.stage + 1, ActionType::FullBackward, mb});
  }
  return false;
}

ComputeOrder add_bubbles(const ComputeOrder& order, int num_stages) {
  std::set<std::tuple<int, ActionType, int>> seen;
  std::map<int, size_t> next;
  ComputeOrder out;
  for (const auto& [rank, slots] : order) out[rank];
  for (bool busy = true; busy;) {
    busy = false;
    bool moved = false;
    std::set<std::tuple<int, ActionType, int>> seen_this_step;
    for (const auto& [rank, slots] : order) {
      size_t& i = next[rank];
      if (i >= slots.size()) continue;
      busy = true;
      const auto& a = slots[i];
      if (a && needs_bubble(*a, num_stages, seen)) {
        out[rank].push_back(std::nullopt);
        continue;
      }
      if (a && a->microbatch) seen_this_step.insert({a->stage, a->type, *a->microbatch});
      out[rank].push_back(a);
      ++i;
      moved = true;
    }
    if (busy && !moved) throw std::logic_error("add_bubbles: no rank can take its next step:\n" + format_order(order));
    seen.insert(seen_this_step.begin(), seen_this_step.end());
  }
  return out;
}

}  // namespace

std::string_view schedule_name(ScheduleKind kind) {
  for (const auto& [k, name] : kNames)
    if (k == kind) return name;
  throw std::invalid_argument(fmt::format("ScheduleKind {} is not a known schedule", static_cast<int>(kind)));
}

ScheduleKind schedule_kind(std::string_view name) {
  const std::string wanted = lower_case(name);
  std::string known;
  for (const auto& [kind, full] : kNames) {
    const std::string_view bare = full.substr(std::string_view("Schedule").size());
    if (wanted == lower_case(full) || wanted == lower_case(bare)) return kind;
    known += fmt::format("{}'{}'", known.empty() ? "" : ", ", bare);
  }
  throw std::invalid_argument(
      fmt::format("Unknown schedule name '{}'. The valid options are [{}] (case-insensitive, "
                  "with or without the 'Schedule' prefix)",
                  name, known));
}

bool is_single_stage(ScheduleKind kind) { return kind == ScheduleKind::GPipe || kind == ScheduleKind::OneFOneB; }

StageToRank loop_placement(int pp, int num_stages) {
  if (pp < 1) throw std::invalid_argument(fmt::format("loop_placement: pp must be at least 1, got {}", pp));
  StageToRank map;
  for (int s = 0; s < num_stages; ++s) map[s] = s % pp;
  return map;
}

ComputeOrder compute_order(ScheduleKind kind, const ScheduleShape& shape) {
  check_shape(kind, shape);
  const int pp = shape.pp, n = shape.n_microbatches;
  if (kind == ScheduleKind::OneFOneB && n < shape.num_stages())
    throw std::invalid_argument(
        fmt::format("Number of microbatches ({}) must be greater than or equal to the number "
                    "of stages ({}).",
                    n, shape.num_stages()));
  int mb_per_round = 0;
  if (kind == ScheduleKind::Interleaved1F1B || kind == ScheduleKind::InterleavedZeroBubble)
    mb_per_round = microbatches_per_round(kind, pp, n);
  ComputeOrder order;
  for (int rank = 0; rank < pp; ++rank) {
    switch (kind) {
      case ScheduleKind::GPipe:
        order[rank] = gpipe_rank(rank, pp, n);
        break;
      case ScheduleKind::OneFOneB:
        order[rank] = one_f_one_b_rank(rank, pp, n);
        break;
      case ScheduleKind::LoopedBFS:
        order[rank] = looped_bfs_rank(rank, pp, shape.stages_per_rank, n);
        break;
      case ScheduleKind::Interleaved1F1B:
      case ScheduleKind::InterleavedZeroBubble:
        order[rank] = interleaved_rank(kind, rank, shape, mb_per_round);
        break;
    }
  }
  if (kind == ScheduleKind::InterleavedZeroBubble) order = add_bubbles(order, shape.num_stages());
  return order;
}

}  // namespace tdc::pipelining
