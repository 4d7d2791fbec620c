"""Dump PyTorch's own pipeline schedules as its pipelining CSV (issue 32, item 4).

Run with a Python that has torch (PyPI's wheel; no GPU and no process group
needed):

    .venv-torch/bin/python tools/pytorch_schedule_csv.py spec/fixtures/pytorch
    .venv-torch25/bin/python tools/pytorch_schedule_csv.py spec/fixtures/pytorch/2.5

For every schedule torch.distributed.pipelining exports -- GPipe, 1F1B,
Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV --
at p=2 and p=4 ranks it writes two files, as PyTorch's own _dump_csv writes
them (Python's csv.writer, CRLF rows):

    NAME_pP_mM.compute.csv   format="compute_only": F, B, I, W (and
                             OVERLAP_F_B) cells, per-stage REDUCE_GRAD
    NAME_pP_mM.comms.csv     format="compute_comms": PyTorch's
                             _prepare_schedule_with_comms of the same order
                             (its SEND/RECV, WAIT_* and REDUCE_GRAD)

The stages are stand-ins (the schedules only read their indices and group
sizes); single-stage schedules (GPipe, 1F1B) get their comms file by loading
their compute-only order (compute actions only: the runtime adds REDUCE_GRAD
itself) into a _PipelineScheduleRuntime, as a user would.
m: 2p for every schedule (DualPipeV needs m >= 2p; interleaved ones m % p == 0).

torch 2.5 (its pipelining as it was, told apart by _ComputationType having no
FULL_BACKWARD): its zero-bubble schedules write the input-gradient backward
as B (a W follows), its _dump_csv takes no format (the multi-stage schedules'
compute-only order), and its comms file is what _PipelineScheduleRuntime
lowers that order to (_load_actions: UNSHARD/RESHARD, SEND/RECV, no waits,
no REDUCE_GRAD), dumped by the runtime's _dump_csv. It has no ZB-V and no
DualPipeV, and its GPipe and 1F1B have no order to dump (their step is code);
it has ScheduleFlexibleInterleaved1F1B, dumped as flexible_interleaved_1f1b.
The VERSION file says what was made and what PyTorch refused or lacks.
"""
import csv
import os
import sys

import torch
from torch.distributed.pipelining import schedules as S
from torch.distributed.pipelining.stage import _PipelineStageBase


class Stage(_PipelineStageBase):
    """A stand-in stage: what the schedules' constructors read, nothing else."""

    def __init__(self, stage_index, num_stages, group_size, group_rank):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.group = None
        self.submod = torch.nn.Identity()
        self.stage_index_to_group_rank = {}

    def _create_grad_recv_info(self, *args, **kwargs):
        return None

    def _prepare_forward_infra(self, *args, **kwargs):
        return None

    def _prepare_backward_infra(self, *args, **kwargs):
        return None

    @property
    def is_first(self):
        return self.stage_index == 0

    @property
    def is_last(self):
        return self.stage_index == self.num_stages - 1


def stages_of(p, v, rank, style):
    n = p * v
    if style == "v":
        mine = [rank, 2 * p - 1 - rank]
    else:
        mine = [rank + c * p for c in range(v)]
    return [Stage(s, n, p, rank) for s in mine]


def write(path, order):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        for rank in sorted(order):
            w.writerow(order[rank])


# torch 2.5's pipelining: B is the input-gradient backward, _dump_csv has no format
OLD = not hasattr(S._ComputationType, "FULL_BACKWARD")

MULTI = [  # (file name, class name, chunks, placement)
    ("interleaved_1f1b", "ScheduleInterleaved1F1B", 2, "loop"),
    ("flexible_interleaved_1f1b", "ScheduleFlexibleInterleaved1F1B", 2, "loop"),
    ("looped_bfs", "ScheduleLoopedBFS", 2, "loop"),
    ("interleaved_zb", "ScheduleInterleavedZeroBubble", 2, "loop"),
    ("zbv", "ScheduleZBVZeroBubble", 2, "v"),
    ("dualpipev", "ScheduleDualPipeV", 2, "v"),
]
SINGLE = [("gpipe", "ScheduleGPipe"), ("1f1b", "Schedule1F1B")]


def dump_old(sched, stages, base):
    """torch 2.5: the compute-only order, and its runtime's lowering of it."""
    sched._dump_csv(base + ".compute.csv")
    n = stages[0].num_stages
    rt = S._PipelineScheduleRuntime(stages, sched._n_microbatches,
                                    stage_index_to_group_rank={s: s % sched.pp_group_size
                                                               for s in range(n)})
    rt._load_actions({r: list(acts) for r, acts in sched.pipeline_order.items()})
    rt._dump_csv(base + ".comms.csv")


def single(name, cls, p, m, notes, base):
    """GPipe, 1F1B: torch 2.15's order, and its comms file through the runtime."""
    if OLD:
        notes.append("%s p=%d m=%d: none, torch %s's %s has no pipeline_order (its step is code)"
                     % (name, p, m, torch.__version__, cls.__name__))
        return
    sched = cls(Stage(0, p, p, 0), m)
    write(base + ".compute.csv", sched.pipeline_order)
    # the runtime takes compute actions only (it adds its REDUCE_GRAD and waits)
    order = {r: [a for a in acts if a is None or a.is_compute_op]
             for r, acts in sched.pipeline_order.items()}
    rt = S._PipelineScheduleRuntime([Stage(0, p, p, 0)], m)
    rt.pipeline_order = order
    try:
        rt._prepare_schedule_with_comms(order)
    except (AssertionError, ValueError) as e:
        # PyTorch refuses its own order (Schedule1F1B's IR is off by one on the last rank)
        notes.append("%s p=%d m=%d: no comms file, PyTorch refuses its own order: %s"
                     % (name, p, m, str(e).splitlines()[0]))
        return
    rt._dump_csv(base + ".comms.csv", format="compute_comms")


def main(out):
    os.makedirs(out, exist_ok=True)
    notes = []
    for p in (2, 4):
        m = 2 * p
        for name, cname in SINGLE:
            single(name, getattr(S, cname), p, m, notes, os.path.join(out, "%s_p%d_m%d" % (name, p, m)))
        for name, cname, v, style in MULTI:
            cls = getattr(S, cname, None)
            if cls is None:
                if p == 2:
                    notes.append("%s: none, torch %s has no %s" % (name, torch.__version__, cname))
                continue
            stages = stages_of(p, v, 0, style)
            sched = cls(stages, m)
            base = os.path.join(out, "%s_p%d_m%d" % (name, p, m))
            if OLD:
                dump_old(sched, stages, base)
                continue
            sched._dump_csv(base + ".compute.csv", format="compute_only")
            sched._dump_csv(base + ".comms.csv", format="compute_comms")
    with open(os.path.join(out, "VERSION"), "w") as f:
        f.write("torch %s (tools/pytorch_schedule_csv.py)\n" % torch.__version__)
        for n in notes:
            f.write(n + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "spec/fixtures/pytorch")
