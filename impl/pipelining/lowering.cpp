// Lowering a compute-only order to the lists the runtime executes, pass by pass as PyTorch's
// _PipelineScheduleRuntime._prepare_schedule_with_comms does (docs/design/pipelining.md §4):
// validate, UNSHARD/RESHARD, REDUCE_GRAD, SEND/RECV. No defer_pp_recv: PyTorch's version of it
// breaks the per-pair FIFO order ([Note: schedule validation] in schedule_ir.h).
#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "tdc/pipelining/schedule_ir.h"

namespace tdc::pipelining {

namespace {

// ------------------------------------------------------------------ 1. UNSHARD / RESHARD

// The first `count` distinct stages the actions from `from` on compute on. An OVERLAP_F_B adds all
// its stages at once, so the window may end one larger than `count` (as in PyTorch).
std::vector<int> next_stages(const std::vector<std::optional<Action>>& actions, size_t from, size_t count) {
  std::vector<int> window;
  auto add = [&](int stage) {
    if (std::find(window.begin(), window.end(), stage) == window.end()) window.push_back(stage);
  };
  for (size_t i = from; i < actions.size() && window.size() < count; ++i) {
    if (!actions[i]) continue;
    for (const Action& leaf : actions[i]->leaves()) add(leaf.stage);
  }
  return window;
}

// ------------------------------------------------------------------ 3. SEND / RECV

struct Comms {
  const StageToRank& stage_to_rank;
  int num_stages;

  int rank_of(int stage) const {
    auto it = stage_to_rank.find(stage);
    if (it == stage_to_rank.end())
      throw ScheduleError(fmt::format("add_send_recv: stage {} has no rank in the stage -> rank map", stage));
    return it->second;
  }

  // The stage whose rank receives what `a` produces, when that rank is another one.
  std::optional<int> consumer(const Action& a) const {
    if (a.type == ActionType::Forward && a.stage != num_stages - 1 && rank_of(a.stage + 1) != rank_of(a.stage))
      return a.stage + 1;
    if ((a.type == ActionType::BackwardInput || a.type == ActionType::FullBackward) && a.stage != 0 &&
        rank_of(a.stage - 1) != rank_of(a.stage))
      return a.stage - 1;
    return std::nullopt;
  }

  // What `a` waits for, as the two actions either of which in this rank's past makes it ready
  // (a RECV, or the producing compute on this rank); empty when it needs nothing.
  std::vector<Action> inputs(const Action& a) const {
    if (a.type == ActionType::Forward && a.stage != 0)
      return {{a.stage, ActionType::RecvF, a.microbatch, {}}, {a.stage - 1, ActionType::Forward, a.microbatch, {}}};
    if ((a.type == ActionType::BackwardInput || a.type == ActionType::FullBackward) && a.stage != num_stages - 1)
      return {{a.stage, ActionType::RecvB, a.microbatch, {}},
              {a.stage + 1, ActionType::BackwardInput, a.microbatch, {}},
              {a.stage + 1, ActionType::FullBackward, a.microbatch, {}}};
    return {};
  }

  bool ready(const Action& a, const std::set<Action>& done) const {
    for (const Action& leaf : a.leaves()) {
      auto in = inputs(leaf);
      if (!in.empty() && std::none_of(in.begin(), in.end(), [&](const Action& x) { return done.contains(x); }))
        return false;
    }
    return true;
  }
};

std::string blocked_heads(const std::map<int, std::vector<Action>>& pending, const std::map<int, size_t>& head,
                          const Comms& comms) {
  std::string out;
  for (const auto& [rank, actions] : pending) {
    if (head.at(rank) >= actions.size()) continue;
    const Action& a = actions[head.at(rank)];
    std::string wants;
    for (const Action& leaf : a.leaves())
      for (const Action& x : comms.inputs(leaf)) wants += (wants.empty() ? "" : " or ") + x.str();
    out += fmt::format("\n  rank {} at step {}: {} waits for {}", rank, head.at(rank), a.str(), wants);
  }
  return out;
}

// ------------------------------------------------------------------ validation

[[noreturn]] void fail_at(const ComputeOrder& order, const std::string& what) {
  throw ScheduleError(fmt::format("{}\n\nFull pipeline schedule:\n{}", what, format_order(order)));
}

// PyTorch's per-action checks of _validate_schedule, plus the range checks it leaves to KeyErrors.
struct ComputeChecker {
  const ComputeOrder& order;
  int num_stages, n_microbatches;
  std::map<int, std::map<ActionType, std::set<int>>> seen;  // stage -> F/B/I/W -> microbatches
  StageToRank stage_to_rank;

  void process(const Action& a, int rank, size_t step) {
    if (a.stage < 0 || a.stage >= num_stages)
      fail_at(order, fmt::format("Rank {}, step {}: {} names stage {}, outside [0, {})", rank, step, a.str(), a.stage,
                                 num_stages));
    if (a.microbatch && (*a.microbatch < 0 || *a.microbatch >= n_microbatches))
      fail_at(order, fmt::format("Rank {}, step {}: {} names microbatch {}, outside [0, {})", rank, step, a.str(),
                                 *a.microbatch, n_microbatches));
    const int mb = a.microbatch.value_or(-1);
    auto& stage = seen[a.stage];
    auto require = [&](ActionType before, std::string_view running, std::string_view first) {
      if (!stage[before].contains(mb))
        fail_at(order, fmt::format("Rank {}, step {}: Running {} for stage {}, microbatch {} without first running {}",
                                   rank, step, running, a.stage, mb, first));
    };
    if (a.type == ActionType::FullBackward) require(ActionType::Forward, "Full Backward", "Forward");
    if (a.type == ActionType::BackwardInput) require(ActionType::Forward, "Backward Input", "Forward");
    if (a.type == ActionType::BackwardWeight) require(ActionType::BackwardInput, "Backward Weight", "Backward Input");
    if (a.is_compute()) stage[a.type].insert(mb);
    auto [it, fresh] = stage_to_rank.emplace(a.stage, rank);
    if (!fresh && it->second != rank)
      fail_at(order, fmt::format("Rank {}, step {}: Stage {} is assigned to both rank {} and rank {}", rank, step,
                                 a.stage, rank, it->second));
  }

  // The per-stage totals; the odd spacing and the enum name are PyTorch's text.
  void check_counts() {
    for (int s = 0; s < num_stages; ++s) {
      auto& st = seen[s];
      const size_t f = st[ActionType::Forward].size(), b = st[ActionType::FullBackward].size();
      const size_t i = st[ActionType::BackwardInput].size(), w = st[ActionType::BackwardWeight].size();
      if (f != static_cast<size_t>(n_microbatches))
        throw ScheduleError(fmt::format("Got {} _ComputationType.FORWARD microbatches for stage {}, expected {}", f, s,
                                        n_microbatches));
      if (i != w)
        throw ScheduleError(
            fmt::format("Invalid backward microbatches for stage {}: I and W must have equal counts, "
                        "            but got I={}, W={}",
                        s, i, w));
      if (b + (i + w) / 2 != static_cast<size_t>(n_microbatches))
        throw ScheduleError(
            fmt::format("Invalid backward microbatches for stage {}: expected {} total backwards, "
                        "            but got B={}, I={}, W={}",
                        s, n_microbatches, b, i, w));
    }
  }
};

}  // namespace

std::vector<Action> add_unshard_reshard(const std::vector<std::optional<Action>>& compute, int max_active_stages) {
  if (max_active_stages < 1)
    throw std::invalid_argument(
        fmt::format("add_unshard_reshard: max_active_stages must be at least 1, got {}", max_active_stages));
  // PyTorch keeps the active stages in a Python set and iterates it to evict and to reshard at the
  // end: ascending for stage indices below the set's table size (8 at least), which std::set gives
  // for any index. The order only shows when several stages leave at once, which plain actions
  // never cause (one stage leaves the window per step); an OVERLAP_F_B window can.
  std::set<int> active;
  std::vector<Action> out;
  for (size_t i = 0; i < compute.size(); ++i) {
    if (!compute[i]) continue;
    const std::vector<int> window = next_stages(compute, i, static_cast<size_t>(max_active_stages));
    auto in_window = [&](int s) { return std::find(window.begin(), window.end(), s) != window.end(); };
    for (auto it = active.begin(); it != active.end();) {
      if (in_window(*it)) {
        ++it;
        continue;
      }
      out.push_back({*it, ActionType::Reshard, std::nullopt, {}});
      it = active.erase(it);
    }
    for (int s : window) {
      if (active.insert(s).second) out.push_back({s, ActionType::Unshard, std::nullopt, {}});
    }
    out.push_back(*compute[i]);
  }
  for (int s : active) out.push_back({s, ActionType::Reshard, std::nullopt, {}});
  return out;
}

std::vector<Action> add_reduce_grad(const std::vector<std::optional<Action>>& actions, int n_microbatches) {
  std::map<int, int> backwards;  // stage -> B and W seen: REDUCE_GRAD follows the last one
  std::vector<Action> out;
  for (const auto& a : actions) {
    if (!a) continue;
    out.push_back(*a);
    for (const Action& leaf : a->leaves()) {
      if (leaf.type != ActionType::FullBackward && leaf.type != ActionType::BackwardWeight) continue;
      if (++backwards[leaf.stage] == n_microbatches)
        out.push_back({leaf.stage, ActionType::ReduceGrad, std::nullopt, {}});
    }
  }
  return out;
}

std::vector<Action> add_reduce_grad(const std::vector<Action>& actions, int n_microbatches) {
  return add_reduce_grad(std::vector<std::optional<Action>>(actions.begin(), actions.end()), n_microbatches);
}

// Each sweep visits the ranks in ascending order and places at most one action per rank, so a
// RECV lands in the receiver's list at the moment its sender places the SEND: the receives are
// posted as early as possible and in the order the peer sends.
ActionLists add_send_recv(const ActionLists& actions, const StageToRank& stage_to_rank, int num_stages) {
  const Comms comms{stage_to_rank, num_stages};
  ActionLists out;
  std::map<int, std::set<Action>> done;  // per rank: placed actions (leaves, SENDs, RECVs)
  std::map<int, size_t> head;
  for (const auto& [rank, list] : actions) {
    out[rank];
    head[rank] = 0;
  }
  auto remaining = [&] {
    return std::any_of(actions.begin(), actions.end(),
                       [&](const auto& kv) { return head[kv.first] < kv.second.size(); });
  };
  while (remaining()) {
    bool progress = false;
    for (const auto& [rank, list] : actions) {
      if (head[rank] >= list.size() || !comms.ready(list[head[rank]], done[rank])) continue;
      const Action& a = list[head[rank]++];
      out[rank].push_back(a);
      for (const Action& leaf : a.leaves()) {
        done[rank].insert(leaf);
        std::optional<int> to = comms.consumer(leaf);
        if (!to) continue;
        const bool fwd = leaf.type == ActionType::Forward;
        Action send{leaf.stage, fwd ? ActionType::SendF : ActionType::SendB, leaf.microbatch, {}};
        Action recv{*to, fwd ? ActionType::RecvF : ActionType::RecvB, leaf.microbatch, {}};
        const int peer = comms.rank_of(*to);
        if (!out.contains(peer))
          throw ScheduleError(fmt::format("add_send_recv: rank {}'s {} sends to rank {}, which has no action list",
                                          rank, leaf.str(), peer));
        out[rank].push_back(send);
        done[rank].insert(send);
        out[peer].push_back(recv);
        done[peer].insert(recv);
      }
      progress = true;
    }
    if (!progress)
      throw ScheduleError(
          "Malformed compute schedule, can't schedule sends/recvs: no rank's next action has its input:" +
          blocked_heads(actions, head, comms));
  }
  return out;
}

StageToRank validate_compute(const ComputeOrder& order, int pp, int num_stages, int n_microbatches) {
  if (static_cast<int>(order.size()) != pp)
    throw ScheduleError(
        fmt::format("Schedule has incorrect number of ranks - expected {}, actual {}", pp, order.size()));
  for (int rank = 0; rank < pp; ++rank)
    if (!order.contains(rank)) throw ScheduleError(fmt::format("Schedule is missing actions for rank {}", rank));
  ComputeChecker checker{order, num_stages, n_microbatches, {}, {}};
  for (const auto& [rank, actions] : order) {
    for (size_t step = 0; step < actions.size(); ++step) {
      if (!actions[step]) continue;
      for (const Action& leaf : actions[step]->leaves()) checker.process(leaf, rank, step);
    }
  }
  checker.check_counts();
  return checker.stage_to_rank;
}

ActionLists lower(const ComputeOrder& order, int n_microbatches) {
  // The stages are those the actions name (PyTorch takes the count from its stage objects).
  int num_stages = 0;
  for (const auto& [rank, actions] : order)
    for (const auto& a : actions)
      if (a)
        for (const Action& leaf : a->leaves()) num_stages = std::max(num_stages, leaf.stage + 1);
  const StageToRank stage_to_rank = validate_compute(order, static_cast<int>(order.size()), num_stages, n_microbatches);
  for (const auto& [rank, actions] : order) {
    for (size_t i = 0; i < actions.size(); ++i) {
      if (actions[i] && !actions[i]->is_compute())
        throw ScheduleError(
            fmt::format("Expected compute-only schedule but found communication action '{}' at rank "
                        "{}, position {}. Communication actions (e.g. SEND_F, RECV_F, etc.) should "
                        "not be present when format='compute_only'.",
                        actions[i]->str(), rank, i));
    }
  }
  ActionLists per_rank;
  for (const auto& [rank, actions] : order)
    per_rank[rank] = add_reduce_grad(add_unshard_reshard(actions), n_microbatches);
  return add_send_recv(per_rank, stage_to_rank, num_stages);
}

}  // namespace tdc::pipelining
