// validate_comms: the checks of [Note: schedule validation] (schedule_ir.h) on lowered lists.
//
// Every rank's list is replayed. SEND and RECV are posts (isend/irecv): they never block. A compute
// action whose input comes from another rank blocks until the RECV it needs has been matched with
// the peer's SEND. Posting is never undone, so which rank moves first does not change the outcome:
// each sweep advances every rank as far as it can, and a sweep in which no rank moves is a
// deadlock. The k-th SEND from one rank to another is compared with the k-th RECV the other posts
// from it as soon as both exist.
#include <algorithm>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "tdc/pipelining/schedule_ir.h"

namespace tdc::pipelining {

namespace {

using Key = std::tuple<int, ActionType, int>;  // (stage, type, microbatch) of a leaf action

Key key(int stage, ActionType type, const std::optional<int>& mb) { return {stage, type, mb.value_or(-1)}; }
Key key(const Action& a) { return key(a.stage, a.type, a.microbatch); }

bool is_send(ActionType t) { return t == ActionType::SendF || t == ActionType::SendB; }
bool is_recv(ActionType t) { return t == ActionType::RecvF || t == ActionType::RecvB; }
bool is_forward_message(ActionType t) { return t == ActionType::SendF || t == ActionType::RecvF; }

// The stage at the other end of a SEND or RECV: forward messages go to stage + 1, backward ones to
// stage - 1.
int peer_stage(const Action& a) {
  const bool up = a.type == ActionType::SendF || a.type == ActionType::RecvB;
  return up ? a.stage + 1 : a.stage - 1;
}

struct Posted {
  Action action;
  size_t step;
};

// The messages from one rank to another, in issue order on each side.
struct Channel {
  std::vector<Posted> sends, recvs;
  size_t matched = 0;
};

// Why a compute action cannot run yet: it waits for `peer` to post `send`.
struct Wait {
  int peer;
  Action send;
};

struct RankState {
  size_t pc = 0;
  std::set<Key> computed;                 // leaves run on this rank
  std::map<Key, size_t> recv_index;       // posted RECV -> its index in the channel from its peer
  std::set<int> unsharded, uses_unshard;  // FSDP stage state; stages this list ever UNSHARDs
  std::map<int, int> backwards;           // stage -> B and W run (REDUCE_GRAD follows the last)
  std::map<int, int> backwards_in_list;   // stage -> B and W in the whole list (0: forward only)
  std::optional<Wait> waiting;
};

class Replay {
 public:
  Replay(const ActionLists& lists, const StageToRank& stage_to_rank, int num_stages, int n_microbatches)
      : lists_(lists), stage_to_rank_(stage_to_rank), num_stages_(num_stages), n_microbatches_(n_microbatches) {}

  void run() {
    for (const auto& [rank, list] : lists_) check_static(rank, list);
    while (!finished()) {
      bool moved = false;
      for (const auto& [rank, list] : lists_)
        while (ranks_[rank].pc < list.size() && advance(rank)) moved = true;
      if (!moved) deadlock();
    }
    check_all_matched();
  }

 private:
  const ActionLists& lists_;
  const StageToRank& stage_to_rank_;
  int num_stages_, n_microbatches_;
  std::map<int, RankState> ranks_;
  std::map<std::pair<int, int>, Channel> channels_;  // (src, dst)

  [[noreturn]] void fail(int rank, size_t step, const Action& a, const std::string& why) const {
    throw ScheduleError(
        fmt::format("validate_comms: rank {}, step {} ({}): {}\n{}", rank, step, a.str(), why, format_lists(lists_)));
  }

  int rank_of(int rank, size_t step, const Action& a, int stage) const {
    auto it = stage_to_rank_.find(stage);
    if (it == stage_to_rank_.end())
      fail(rank, step, a, fmt::format("stage {} has no rank in the stage -> rank map", stage));
    return it->second;
  }

  // Per action, what needs no replay: ranges, placement, the peer of each message.
  void check_static(int rank, const std::vector<Action>& list) {
    RankState& st = ranks_[rank];
    for (size_t step = 0; step < list.size(); ++step) {
      const Action& a = list[step];
      for (const Action& leaf : a.leaves()) {
        check_leaf(rank, step, leaf);
        if (leaf.type == ActionType::FullBackward || leaf.type == ActionType::BackwardWeight)
          ++st.backwards_in_list[leaf.stage];
      }
      if (a.type == ActionType::Unshard) st.uses_unshard.insert(a.stage);
      if (is_send(a.type) || is_recv(a.type)) {
        const int peer = rank_of(rank, step, a, peer_stage(a));
        if (peer == rank)
          fail(rank, step, a, fmt::format("stage {} is on this rank too: no message to itself", peer_stage(a)));
        if (!lists_.contains(peer)) fail(rank, step, a, fmt::format("its peer rank {} has no action list", peer));
      }
    }
  }

  void check_leaf(int rank, size_t step, const Action& a) const {
    if (a.stage < 0 || a.stage >= num_stages_)
      fail(rank, step, a, fmt::format("stage {} is outside [0, {})", a.stage, num_stages_));
    const int owner = rank_of(rank, step, a, a.stage);
    if (owner != rank)
      fail(rank, step, a, fmt::format("stage {} lives on rank {}, not on rank {}", a.stage, owner, rank));
    const bool whole_stage =
        a.type == ActionType::Unshard || a.type == ActionType::Reshard || a.type == ActionType::ReduceGrad;
    if (whole_stage != !a.microbatch.has_value())
      fail(rank, step, a, whole_stage ? "takes no microbatch" : "needs a microbatch");
    if (a.microbatch && (*a.microbatch < 0 || *a.microbatch >= n_microbatches_))
      fail(rank, step, a, fmt::format("microbatch {} is outside [0, {})", *a.microbatch, n_microbatches_));
    if ((is_send(a.type) || is_recv(a.type)) && (peer_stage(a) < 0 || peer_stage(a) >= num_stages_))
      fail(rank, step, a, fmt::format("its peer stage {} does not exist (stages [0, {}))", peer_stage(a), num_stages_));
  }

  bool finished() const {
    return std::all_of(lists_.begin(), lists_.end(),
                       [&](const auto& kv) { return ranks_.at(kv.first).pc >= kv.second.size(); });
  }

  // Runs rank's next action; false when it must wait for a peer.
  bool advance(int rank) {
    RankState& st = ranks_[rank];
    const size_t step = st.pc;
    const Action& a = lists_.at(rank)[step];
    st.waiting.reset();
    switch (a.type) {
      case ActionType::SendF:
      case ActionType::SendB:
        post_send(rank, step, a);
        break;
      case ActionType::RecvF:
      case ActionType::RecvB:
        post_recv(rank, step, a);
        break;
      case ActionType::Unshard:
        if (!st.unsharded.insert(a.stage).second)
          fail(rank, step, a, fmt::format("stage {} is already unsharded", a.stage));
        break;
      case ActionType::Reshard:
        if (!st.unsharded.erase(a.stage))
          fail(rank, step, a, fmt::format("RESHARD of stage {} without an UNSHARD before it", a.stage));
        break;
      case ActionType::ReduceGrad:
        // A forward-only list may hold REDUCE_GRAD (FSDP's final post-backward, which reshards:
        // PyTorch's seed test does this); with backwards, the reduction must come after all.
        if (st.backwards_in_list[a.stage] > 0 && st.backwards[a.stage] != n_microbatches_)
          fail(rank, step, a,
               fmt::format("stage {} has run {} of its {} backwards (B or W) so far", a.stage, st.backwards[a.stage],
                           n_microbatches_));
        break;
      default:
        if (!compute(rank, step, a)) return false;
    }
    ++st.pc;
    return true;
  }

  // A SEND carries what this rank computed: F for SEND_F, B or I for SEND_B.
  void post_send(int rank, size_t step, const Action& a) {
    const RankState& st = ranks_[rank];
    const bool produced = a.type == ActionType::SendF
                              ? st.computed.contains(key(a.stage, ActionType::Forward, a.microbatch))
                              : st.computed.contains(key(a.stage, ActionType::FullBackward, a.microbatch)) ||
                                    st.computed.contains(key(a.stage, ActionType::BackwardInput, a.microbatch));
    if (!produced) fail(rank, step, a, "sends a result this rank has not computed yet");
    const int peer = stage_to_rank_.at(peer_stage(a));
    Channel& ch = channels_[{rank, peer}];
    ch.sends.push_back({a, step});
    match(rank, peer, ch);
  }

  void post_recv(int rank, size_t step, const Action& a) {
    RankState& st = ranks_[rank];
    const int peer = stage_to_rank_.at(peer_stage(a));
    Channel& ch = channels_[{peer, rank}];
    if (!st.recv_index.emplace(key(a), ch.recvs.size()).second) fail(rank, step, a, "posted twice");
    ch.recvs.push_back({a, step});
    match(peer, rank, ch);
  }

  // p2p on one tag pairs the k-th send with the k-th receive between two ranks.
  void match(int src, int dst, Channel& ch) {
    for (; ch.matched < std::min(ch.sends.size(), ch.recvs.size()); ++ch.matched) {
      const Posted& s = ch.sends[ch.matched];
      const Posted& r = ch.recvs[ch.matched];
      const bool same = is_forward_message(s.action.type) == is_forward_message(r.action.type) &&
                        peer_stage(s.action) == r.action.stage && s.action.microbatch == r.action.microbatch;
      if (same) continue;
      throw ScheduleError(fmt::format(
          "validate_comms: message {} from rank {} to rank {} does not match: rank {} sends {} (step {}) while rank {} "
          "receives {} (step {}) in that position; sends and receives pair up in issue order, so the receiver "
          "would get the wrong tensor [Note: schedule validation]\n{}",
          ch.matched, src, dst, src, s.action.str(), s.step, dst, r.action.str(), r.step, format_lists(lists_)));
    }
  }

  // The input of a compute leaf from another rank: its RECV posted earlier here, matched by now.
  bool received(int rank, size_t step, const Action& a, ActionType recv_type, int from_stage) {
    RankState& st = ranks_[rank];
    const Action recv{a.stage, recv_type, a.microbatch, {}};
    const int peer = stage_to_rank_.at(from_stage);
    auto it = st.recv_index.find(key(recv));
    if (it == st.recv_index.end())
      fail(rank, step, a, fmt::format("its input comes from rank {} but no {} was posted before it", peer, recv.str()));
    if (it->second < channels_[{peer, rank}].matched) return true;
    const ActionType send_type = recv_type == ActionType::RecvF ? ActionType::SendF : ActionType::SendB;
    st.waiting = Wait{peer, Action{from_stage, send_type, a.microbatch, {}}};
    return false;
  }

  // The input of a compute leaf: false (with `waiting` set) when it must wait for a peer.
  bool input_ready(int rank, size_t step, const Action& a) {
    const RankState& st = ranks_[rank];
    auto need_local = [&](std::initializer_list<Key> any_of, std::string_view what) {
      if (std::none_of(any_of.begin(), any_of.end(), [&](const Key& k) { return st.computed.contains(k); }))
        fail(rank, step, a, fmt::format("runs before {} on this rank", what));
    };
    const int s = a.stage;
    const auto& mb = a.microbatch;
    if (a.type == ActionType::BackwardWeight) {
      need_local({key(s, ActionType::BackwardInput, mb)}, Action{s, ActionType::BackwardInput, mb, {}}.str());
      return true;
    }
    if (a.type == ActionType::Forward) {
      if (s == 0) return true;
      if (stage_to_rank_.at(s - 1) != rank) return received(rank, step, a, ActionType::RecvF, s - 1);
      need_local({key(s - 1, ActionType::Forward, mb)}, Action{s - 1, ActionType::Forward, mb, {}}.str());
      return true;
    }
    need_local({key(s, ActionType::Forward, mb)}, Action{s, ActionType::Forward, mb, {}}.str());  // B or I
    if (s == num_stages_ - 1) return true;
    if (stage_to_rank_.at(s + 1) != rank) return received(rank, step, a, ActionType::RecvB, s + 1);
    need_local({key(s + 1, ActionType::FullBackward, mb), key(s + 1, ActionType::BackwardInput, mb)},
               fmt::format("the backward (B or I) of stage {} microbatch {}", s + 1, mb.value_or(-1)));
    return true;
  }

  bool compute(int rank, size_t step, const Action& a) {
    RankState& st = ranks_[rank];
    const std::vector<Action> parts = a.leaves();
    for (const Action& leaf : parts) {
      if (st.uses_unshard.contains(leaf.stage) && !st.unsharded.contains(leaf.stage))
        fail(rank, step, a, fmt::format("stage {} is not unsharded here (its list UNSHARDs it elsewhere)", leaf.stage));
      if (st.computed.contains(key(leaf))) fail(rank, step, a, fmt::format("{} runs a second time", leaf.str()));
      if (!input_ready(rank, step, leaf)) return false;
    }
    for (const Action& leaf : parts) {
      st.computed.insert(key(leaf));
      if (leaf.type == ActionType::FullBackward || leaf.type == ActionType::BackwardWeight) ++st.backwards[leaf.stage];
    }
    return true;
  }

  [[noreturn]] void deadlock() const {
    std::string blocked;
    for (const auto& [rank, list] : lists_) {
      const RankState& st = ranks_.at(rank);
      if (st.pc >= list.size() || !st.waiting) continue;
      const Wait& w = *st.waiting;
      const RankState& peer = ranks_.at(w.peer);
      const std::string where =
          peer.pc >= lists_.at(w.peer).size()
              ? "it has finished its list without it"
              : fmt::format("it is blocked at step {} ({})", peer.pc, lists_.at(w.peer)[peer.pc].str());
      blocked += fmt::format("\n  rank {} at step {} ({}) waits for rank {} to post {}; {}", rank, st.pc,
                             list[st.pc].str(), w.peer, w.send.str(), where);
    }
    throw ScheduleError(
        fmt::format("validate_comms: deadlock, no rank can move:{}\n{}", blocked, format_lists(lists_)));
  }

  void check_all_matched() const {
    for (const auto& [pair, ch] : channels_) {
      const auto [src, dst] = pair;
      if (ch.sends.size() > ch.recvs.size()) {
        const Posted& s = ch.sends[ch.recvs.size()];
        throw ScheduleError(fmt::format("validate_comms: rank {}'s {} (step {}) to rank {} has no RECV on rank {}\n{}",
                                        src, s.action.str(), s.step, dst, dst, format_lists(lists_)));
      }
      if (ch.recvs.size() > ch.sends.size()) {
        const Posted& r = ch.recvs[ch.sends.size()];
        throw ScheduleError(
            fmt::format("validate_comms: rank {}'s {} (step {}) from rank {} has no SEND on rank {}\n{}", dst,
                        r.action.str(), r.step, src, src, format_lists(lists_)));
      }
    }
  }
};

}  // namespace

void validate_comms(const ActionLists& lists, const StageToRank& stage_to_rank, int num_stages, int n_microbatches) {
  Replay(lists, stage_to_rank, num_stages, n_microbatches).run();
}

}  // namespace tdc::pipelining
