"""Run a pipeline CSV in PyTorch's own runtime and compare its gradients (issue 32).

    PY tools/pytorch_run_csv.py PATH STAGES MICROBATCHES [full|split] [loop|v] [RANKS]

PY is a Python with PyPI's torch (.venv-torch: 2.15, .venv-torch25: 2.5.1).
PATH is a compute_comms CSV (PyTorch's own dump, or ztrain's csv.dump with
format "compute_comms" for 2.15 or "2.5" for 2.5.1). RANKS (default 2) gloo
processes on this machine load it into torch's _PipelineScheduleRuntime
(_load_csv(format="compute_comms")) with STAGES stand-in stages (Linear 8x8
+ tanh each, stage s on rank s % RANKS, or V: ranks r and 2 RANKS - 1 - r),
run one step of MICROBATCHES micro-batches (mse loss, unscaled), and compare
every stage's gradients with one process's backward of the summed losses.
"split": the file's B is input-only, a W follows (torch 2.5's
use_full_backward=False; 2.15 reads its I and W). Exits non-zero when a
gradient differs by more than 1e-6.
"""
import inspect
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as S

D, MB = 8, 2


def model(n):
    torch.manual_seed(0)
    return [torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Tanh()) for _ in range(n)]


def loss_fn(out, tgt):
    return torch.nn.functional.mse_loss(out, tgt)


def work(rank, path, n, m, full, v, p, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=p)
    torch.manual_seed(1)
    x, y = torch.randn(m * MB, D), torch.randn(m * MB, D)
    ref = model(n)
    sum(loss_fn(torch.nn.Sequential(*ref)(xi), yi) for xi, yi in zip(x.chunk(m), y.chunk(m))).backward()
    where = {s: ((s if s < p else 2 * p - 1 - s) if v else s % p) for s in range(n)}
    mods = model(n)
    mine = [s for s in range(n) if where[s] == rank]
    stages = [PipelineStage(mods[s], s, n, torch.device("cpu"), input_args=torch.empty(MB, D)) for s in mine]
    params = inspect.signature(S.PipelineScheduleMulti.__init__).parameters
    kw = {"loss_fn": loss_fn}
    for k, val in (("stage_index_to_group_rank", where), ("use_full_backward", full), ("scale_grads", False)):
        if k in params:
            kw[k] = val
    rt = S._PipelineScheduleRuntime(stages, m, **kw)
    rt.stage_index_to_group_rank = where
    for st in stages:
        st.stage_index_to_group_rank = where
    rt._load_csv(path, format="compute_comms")
    args = (x,) if where[0] == rank else ()
    rt.step(*args, **({"target": y} if where[n - 1] == rank else {}))
    worst = max((a.grad - b.grad).abs().max().item()
                for s in mine for a, b in zip(mods[s].parameters(), ref[s].parameters()))
    print("rank %d stages %s: max |grad - one process's| = %.3g" % (rank, mine, worst), flush=True)
    dist.destroy_process_group()
    if worst > 1e-6:
        raise SystemExit(1)


if __name__ == "__main__":
    a = sys.argv[1:]
    path, n, m = a[0], int(a[1]), int(a[2])
    full = (a[3] if len(a) > 3 else "full") == "full"
    v = (a[4] if len(a) > 4 else "loop") == "v"
    p = int(a[5]) if len(a) > 5 else 2
    mp.spawn(work, args=(path, n, m, full, v, p, 29500 + os.getpid() % 1000), nprocs=p)
    print("torch %s ran %s: every stage's gradients within 1e-6 of one process's" % (torch.__version__, path))
