"""Writes pp_schedules.json: the per-rank action lists PyTorch's pipeline schedules compute, for
tdc's schedule IR suite (conformance/unit/pipelining_schedule_test.cpp) to compare string for string.

Run: .venv/bin/python tools/pipelining/pp_schedules.py --out FILE
CTest runs it before the suite (fixture tdc_goldens_pp_schedules).

No process group: the schedule classes only read a few attributes of their stages, so duck-typed
fake stages stand in for PipelineStage. Per case (schedule, pp, stages_per_rank, n_microbatches):
  compute        PyTorch's pipeline_order (rank -> action strings, null = idle step)
  lowered        pipeline_order_with_comms (multi-stage classes: they lower in the constructor)
  stage_to_rank  the stage -> rank map the schedule communicates with
  trace          GPipe and 1F1B: the F/B order their real _step_microbatches executes, recorded
                 by fake stages while every p2p helper is a no-op (Schedule1F1B's pipeline_order
                 is wrong on the last rank; the trace is what runs)
  error          str(exception) where the constructor refuses the shape, else null
  lowered_defer_recv, defer_recv_fifo_ok
                 multi-stage classes built with defer_pp_recv=True, and whether those lists keep
                 each pair of ranks' sends and receives in the same order (a few do not: tdc's
                 validate_comms must refuse exactly those)
"""
import inspect
import os
import sys
from contextlib import ExitStack
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fixtures", "golden"))

import torch  # noqa: E402
from torch.distributed.pipelining import schedules as S  # noqa: E402
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping  # noqa: E402

from golden_io import golden_args, oracle_info, write_goldens  # noqa: E402

SINGLE = ["ScheduleGPipe", "Schedule1F1B"]
MULTI = ["ScheduleInterleaved1F1B", "ScheduleLoopedBFS", "ScheduleInterleavedZeroBubble"]


class FakeStage:
    """What the schedule constructors and _step_microbatches touch on a stage; records F/B."""

    def __init__(self, stage_index, num_stages, pp):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_rank = stage_index % pp
        self.group_size = pp
        self.submod = None
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.stage_index_to_group_rank = generate_stage_to_rank_mapping(pp, num_stages)
        self.has_backward = False
        self.output_chunks = []
        self.events = []

    def forward_one_chunk(self, mb, *args, **kwargs):
        self.events.append(f"F{mb}")

    def backward_one_chunk(self, mb, *args, **kwargs):
        self.events.append(f"B{mb}")

    def get_fwd_recv_ops(self, mb):
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def perform_reduce_grad(self, *args, **kwargs):
        pass

    def clear_runtime_states(self):
        pass


def strs(order):
    return {str(rank): [None if a is None else str(a) for a in actions] for rank, actions in order.items()}


def same_order_per_pair(lists, stage_to_rank):
    """True when, for every (src, dst), the k-th SEND on src and the k-th RECV on dst are one message."""
    sent, received = {}, {}
    for rank, actions in lists.items():
        for a in actions:
            fwd = a.computation_type in (S.SEND_F, S.RECV_F)
            if a.computation_type in (S.SEND_F, S.SEND_B):
                dst = stage_to_rank[a.stage_index + (1 if fwd else -1)]
                sent.setdefault((rank, dst), []).append((fwd, a.stage_index, a.microbatch_index))
            elif a.computation_type in (S.RECV_F, S.RECV_B):
                src_stage = a.stage_index - (1 if fwd else -1)
                received.setdefault((stage_to_rank[src_stage], rank), []).append((fwd, src_stage, a.microbatch_index))
    return sent == received


def executed_order(cls, pp, n_mb):
    """rank -> the F/B events of cls._step_microbatches on that rank's fake stage."""
    trace = {}
    with ExitStack() as patches:
        patches.enter_context(mock.patch.object(S, "_batch_p2p", lambda ops, desc=None: []))
        patches.enter_context(mock.patch.object(S, "_sorted_batch_p2p", lambda ops, desc=None: {}))
        patches.enter_context(mock.patch.object(S, "_wait_batch_p2p", lambda work: None))
        for rank in range(pp):
            stage = FakeStage(rank, pp, pp)
            sched = cls(stage, n_mb)
            sched._initialize_stage = lambda *args, **kwargs: None
            sched._step_microbatches()
            trace[str(rank)] = stage.events
    return trace


# defer_pp_recv (PipelineScheduleMulti) arrived after 2.12: older releases get no deferred lists,
# and the golden says so (pipelining_schedule_test skips their checks with that reason).
DEFER_PP_RECV = "defer_pp_recv" in inspect.signature(S.ScheduleInterleaved1F1B.__init__).parameters


def run_case(name, pp, spr, n_mb):
    cls = getattr(S, name)
    num_stages = pp * spr
    case = {"schedule": name, "pp": pp, "stages_per_rank": spr, "n_microbatches": n_mb, "error": None}
    stages = [FakeStage(s, num_stages, pp) for s in range(0, num_stages, pp)]  # rank 0's
    try:
        sched = cls(stages[0], n_mb) if name in SINGLE else cls(stages, n_mb)
    except ValueError as e:
        case["error"] = str(e)
        return case
    case["compute"] = strs(sched.pipeline_order)
    if name in SINGLE:
        stage_to_rank = generate_stage_to_rank_mapping(pp, num_stages)
        case["trace"] = executed_order(cls, pp, n_mb)
    else:
        stage_to_rank = sched.stage_index_to_group_rank
        case["lowered"] = strs(sched.pipeline_order_with_comms)
        if DEFER_PP_RECV:
            deferred = cls(stages, n_mb, defer_pp_recv=True)
            case["lowered_defer_recv"] = strs(deferred.pipeline_order_with_comms)
            case["defer_recv_fifo_ok"] = same_order_per_pair(deferred.pipeline_order_with_comms,
                                                             deferred.stage_index_to_group_rank)
    case["stage_to_rank"] = {str(s): stage_to_rank[s] for s in sorted(stage_to_rank)}
    return case


def matrix():
    for name in SINGLE + MULTI:
        for pp in (2, 4):
            for spr in (1,) if name in SINGLE else (1, 2):
                for n_mb in dict.fromkeys((pp, 2 * pp, 3, 5, 8)):  # deduplicated, in order
                    yield name, pp, spr, n_mb


def main():
    args = golden_args(__doc__)
    cases = [run_case(*shape) for shape in matrix()]
    rejected = sum(c["error"] is not None for c in cases)
    info = oracle_info()
    write_goldens(args.out, {**info, "torch_version": torch.__version__, "defer_pp_recv": DEFER_PP_RECV,
                             "cases": cases})
    print(f"pp_schedules: {len(cases)} cases, {len(cases) - rejected} constructed, {rejected} rejected "
          f"(torch {torch.__version__}) -> {args.out}")


if __name__ == "__main__":
    main()
