// The pipeline schedule IR (torch/distributed/pipelining/schedules.py): actions in PyTorch's text
// form, the per-rank compute orders of the five seed schedules, the lowering passes that turn a
// compute-only order into the lists the runtime executes, and checks on both.
//
//   auto order = compute_order(ScheduleKind::Interleaved1F1B, {.pp = 2, .stages_per_rank = 2, .n_microbatches = 8});
//   ActionLists lists = lower(order, 8);        // UNSHARD/RESHARD, REDUCE_GRAD, SEND/RECV
//   validate_comms(lists, loop_placement(2, 4), 4, 8);   // FIFO per peer, matched, deadlock-free
//
// Every list here is identical, string for string, to what PyTorch 2.13 computes for the same
// schedule and shape (tests/golden: the venv's PyTorch generates them live). Where PyTorch's own
// list is wrong (Schedule1F1B's last rank, docs/pipelining.md) tdc's is the order PyTorch executes.
// Pure functions: no process group, no tensors.
#pragma once

#include <compare>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace tdc::pipelining {

// ------------------------------------------------------------------ actions

// PyTorch's _ComputationType; the text is what an action prints (`0F1`, `3SEND_B2`, `1UNSHARD`).
enum class ActionType {
  Forward,         // F
  BackwardInput,   // I  (zero bubble: gradient w.r.t. the stage's inputs)
  BackwardWeight,  // W  (zero bubble: gradient w.r.t. the stage's parameters)
  Unshard,         // UNSHARD
  Reshard,         // RESHARD
  SendF,           // SEND_F
  RecvF,           // RECV_F
  SendB,           // SEND_B
  RecvB,           // RECV_B
  FullBackward,    // B
  OverlapFB,       // OVERLAP_F_B (sub-actions; DualPipeV only, parsed and printed, never generated)
  ReduceGrad,      // REDUCE_GRAD
};
std::string_view to_string(ActionType type);

struct Action {
  int stage = 0;
  ActionType type = ActionType::Forward;
  std::optional<int> microbatch;    // none for UNSHARD / RESHARD / REDUCE_GRAD
  std::vector<Action> sub_actions;  // OVERLAP_F_B only

  bool is_compute() const;  // F, B, I, W, OVERLAP_F_B
  // Its sub-actions for OVERLAP_F_B, else itself.
  std::vector<Action> leaves() const;
  // PyTorch's repr: `<stage><TYPE>[<mb>]`, `(0F3;3B1)OVERLAP_F_B`.
  std::string str() const;
  friend bool operator==(const Action&, const Action&) = default;
  friend auto operator<=>(const Action& a, const Action& b) {
    return std::tie(a.stage, a.type, a.microbatch) <=> std::tie(b.stage, b.type, b.microbatch);
  }
};

// An action in text form; "" (after trimming blanks) is an idle slot (nullopt). Throws
// ScheduleError("Invalid action string: '<s>' ...") for anything PyTorch's regex would not take,
// including trailing garbage PyTorch silently ignores (`0F1x`).
std::optional<Action> parse_action(std::string_view text);

// rank -> compute-only list; nullopt marks an idle timestep (a bubble).
using ComputeOrder = std::map<int, std::vector<std::optional<Action>>>;
// rank -> the list the runtime executes (compute and communication, no bubbles).
using ActionLists = std::map<int, std::vector<Action>>;
using StageToRank = std::map<int, int>;

// Thrown for schedules that cannot be built or run: the message names the rank, the step and the
// action (and the peer, for communication).
struct ScheduleError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ------------------------------------------------------------------ schedules

enum class ScheduleKind { GPipe, OneFOneB, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble };
// "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleLoopedBFS",
// "ScheduleInterleavedZeroBubble".
std::string_view schedule_name(ScheduleKind kind);
// PyTorch's get_schedule_class: the class name, case-insensitive, with or without "Schedule"
// ("gpipe", "Interleaved1F1B"). Throws std::invalid_argument listing the known names.
ScheduleKind schedule_kind(std::string_view name);
bool is_single_stage(ScheduleKind kind);  // GPipe, 1F1B: exactly one stage per rank

struct ScheduleShape {
  int pp = 1;               // ranks in the pipeline group
  int stages_per_rank = 1;  // must be 1 for single-stage schedules
  int n_microbatches = 1;
  int num_stages() const { return pp * stages_per_rank; }
};

// The compute-only order of every rank, bubbles included, as PyTorch's schedule computes it
// (before REDUCE_GRAD; for 1F1B the order PyTorch executes). Stage s lives on rank s % pp.
// Throws std::invalid_argument with PyTorch's message where its constructor refuses the shape
// (1F1B with n_microbatches < stages; Interleaved1F1B / InterleavedZeroBubble when the rounds do
// not divide n_microbatches) and naming the value for shapes no schedule takes (pp < 1, ...).
ComputeOrder compute_order(ScheduleKind kind, const ScheduleShape& shape);

// Stage s on rank s % pp ("loop" placement, generate_stage_to_rank_mapping).
StageToRank loop_placement(int pp, int num_stages);

// ------------------------------------------------------------------ lowering (in PyTorch's order)

// 1. UNSHARD/RESHARD: keep the next `max_active_stages` distinct stages unsharded (drops bubbles).
std::vector<Action> add_unshard_reshard(const std::vector<std::optional<Action>>& compute, int max_active_stages = 3);
// 2. REDUCE_GRAD right after a stage's n_microbatches-th B or W (drops bubbles).
std::vector<Action> add_reduce_grad(const std::vector<std::optional<Action>>& actions, int n_microbatches);
std::vector<Action> add_reduce_grad(const std::vector<Action>& actions, int n_microbatches);
// 3. SEND/RECV: sweeps over the ranks placing each rank's head action once its input is there;
// a send puts the peer's RECV in the peer's list at once. Throws ScheduleError naming every
// rank's blocked head action when no rank can progress.
ActionLists add_send_recv(const ActionLists& actions, const StageToRank& stage_to_rank, int num_stages);

// PyTorch's _validate_schedule on a compute-only order: every rank present, n_microbatches F per
// stage, B/I after F, W after I, #I == #W, #B + #I == n_microbatches, one rank per stage. Returns
// the stage -> rank map the actions imply. Throws ScheduleError with PyTorch's message.
StageToRank validate_compute(const ComputeOrder& order, int pp, int num_stages, int n_microbatches);

// validate_compute, then passes 1-3 (PyTorch's _prepare_schedule_with_comms, format compute_only).
ActionLists lower(const ComputeOrder& order, int n_microbatches);

// ------------------------------------------------------------------ tdc's schedule check

// [Note: schedule validation] What PyTorch does not check before running a lowered (or
// hand-written) schedule, checked here by simulating the ranks in lockstep:
//   - every SEND has its RECV on the peer and the other way round;
//   - per pair of ranks, the k-th SEND and the k-th RECV carry the same (stage, microbatch,
//     direction): p2p matches messages in issue order on one tag, and tensors of equal shape would
//     otherwise swap silently;
//   - a compute action finds its input received (posted RECV, or the neighbour stage on the same
//     rank already ran);
//   - no deadlock: a compute action waits for its RECV's SEND to be posted; if no rank can move,
//     the error names each blocked rank, its action and the peer it waits for;
//   - RESHARD only after UNSHARD, no UNSHARD twice, no compute on a stage that is not unsharded when
//     the stage's list uses UNSHARD at all;
//   - every stage of a rank's list lives on that rank;
//   - a SEND follows the compute that produces its tensor, and REDUCE_GRAD follows the stage's
//     n_microbatches-th backward (B or W) when the list has backwards for the stage at all (a
//     forward-only list may reduce: FSDP's final post-backward reshards).
// Throws ScheduleError naming the rank, the step, the action and the peer.
void validate_comms(const ActionLists& lists, const StageToRank& stage_to_rank, int num_stages, int n_microbatches);

// Text form of a whole schedule, one line per rank ("rank 0: 0F0 0F1 . 2F0 ..."), `.` = bubble.
std::string format_order(const ComputeOrder& order);
std::string format_lists(const ActionLists& lists);

}  // namespace tdc::pipelining
