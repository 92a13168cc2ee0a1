"""A small data-parallel transformer training job with injectable faults, profiled on every rank.

It is the ground truth for the diagnosis tools: run it with a known fault, then check that the analyser finds
the faulty rank and the right category. Launch it with torchrun (gloo on CPU, NCCL on GPU)::

    python -m torch.distributed.run --standalone --nproc-per-node 4 -m gpufleet.diagnose.workload \\
        --fault slow-rank:2 --out DIR

or from Python with :func:`run_workload`. Each rank writes ``DIR/rank-{r}.json.gz`` (a Kineto Chrome trace of
the active steps) and ``DIR/steps-rank-{r}.json`` (wall time of every step); rank 0 writes ``DIR/fault.json``.
See docs/diagnose_workload.md for what every fault looks like in the traces.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function
from torch.utils.data import DataLoader

from gpufleet.diagnose import faults
from gpufleet.diagnose.faults import Fault, parse_fault
from gpufleet.diagnose.monitor import StepMonitor
from gpufleet.diagnose.workload_parts import (
    Block,
    Hung,
    MomentumSGD,
    SlowCollate,
    SyntheticTokens,
    TinyLM,
    arm_hang,
    export_trace,
    free_port,
    rank_profiler,
    start_rank,
    throttled,
)
from gpufleet.errors import DiagnoseError

__all__ = [
    "COMM_WAIT",
    "FAMILIES",
    "SECTIONS",
    "Block",
    "MomentumSGD",
    "SlowCollate",
    "SyntheticTokens",
    "TinyLM",
    "allreduce_grads",
    "export_trace",
    "free_port",
    "main",
    "make_buckets",
    "run_workload",
    "throttled",
    "train",
]

#: the record_function names that mark the sections of a step in the trace
SECTIONS = ("gpufleet::forward", "gpufleet::backward", "gpufleet::allreduce", "gpufleet::optimizer")
#: nested in every gpufleet::allreduce, once per bucket: this rank waiting for its all-reduce to finish
COMM_WAIT = "gpufleet::comm_wait"
#: the shapes of training job the workload can run (``--family``); ``lm`` is this module's, the others torch DDP's
FAMILIES = ("lm", "lm-ddp", "cnn-ddp", "lm-accum")


# ---- gradient sync --------------------------------------------------------------------------------------------------
def make_buckets(params: list[nn.Parameter], n: int) -> list[list[nn.Parameter]]:
    """Split the parameters, in order, into ``min(n, len(params))`` buckets of roughly equal element count."""
    n = max(1, min(n, len(params)))
    cum, acc = [], 0
    for p in params:
        acc += p.numel()
        cum.append(acc)
    cuts = [0]
    for k in range(1, n):
        i = next(j for j, c in enumerate(cum) if c >= acc * k / n) + 1  # cut after the param crossing k/n
        cuts.append(min(max(i, cuts[-1] + 1), len(params) - (n - k)))  # non-empty, and room for the rest
    cuts.append(len(params))
    return [params[a:b] for a, b in itertools.pairwise(cuts)]


def allreduce_grads(buckets: list[list[nn.Parameter]], world: int, delay: float = 0.0) -> None:
    """Average gradients over ranks: one flattened ``dist.all_reduce`` per bucket, ``delay`` s of stall first."""
    for bucket in buckets:
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        faults.sleep(delay / len(buckets))  # slow-collective: this rank reaches every collective late
        work = dist.all_reduce(flat, async_op=True)
        with record_function(COMM_WAIT):  # time blocked on peers: visible, not an unexplained gap
            work.wait()
        flat /= world
        off = 0
        for p in bucket:
            p.grad.copy_(flat[off : off + p.numel()].view_as(p.grad))
            off += p.numel()


# ---- the run --------------------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The workload's command line."""
    ap = argparse.ArgumentParser(prog="python -m gpufleet.diagnose.workload", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for rank-{r}.json.gz traces and fault.json")
    ap.add_argument(
        "--family",
        choices=FAMILIES,
        default="lm",
        help="lm: explicit bucketed all-reduce with gpufleet:: sections; lm-ddp, cnn-ddp, lm-accum: torch DDP, "
        "no sections (docs/diagnose_workload.md)",
    )
    ap.add_argument(
        "--fault", default="none", help=f"KIND:RANK[:MAGNITUDE] or none; KIND in {', '.join(faults.FAULTS)}"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=8, help="active (profiled) steps")
    ap.add_argument("--wait", type=int, default=1, help="profiler schedule: steps skipped before warm-up")
    ap.add_argument("--warmup", type=int, default=2, help="profiler schedule: warm-up steps (recorded, discarded)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--buckets", type=int, default=2, help="all-reduce buckets per step")
    ap.add_argument("--bucket-mb", type=float, default=0.25, help="DDP families: the reducer's bucket_cap_mb")
    ap.add_argument("--accum", type=int, default=2, help="lm-accum: micro-batches per step (all but the last no_sync)")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (0: load on the main thread)")
    ap.add_argument("--pause-every", type=int, default=3, help="python-pause: pause on every k-th step")
    ap.add_argument("--hang-step", type=int, default=None, help="hang: step at which the rank hangs (default: mid)")
    ap.add_argument("--timeout", type=float, default=300.0, help="collective timeout, s")
    ap.add_argument("--hang-timeout", type=float, default=3.0, help="hang: collective timeout once training runs, s")
    ap.add_argument("--no-profile", action="store_true", help="run without the profiler (for overhead benches)")
    # not --monitor: torchrun's own parser would take it for an abbreviation of its --monitor-interval
    ap.add_argument("--timings", type=Path, default=None, help="time sections with StepMonitor into this CSV/Parquet")
    ap.add_argument("--timings-every", type=int, default=4, help="StepMonitor gathers and writes every N steps")
    return ap.parse_args(argv)


def _maybe_section(mon: StepMonitor | None, name: str) -> Any:
    """The monitor's section ``name``, or a no-op context when there is no monitor."""
    return mon.section(name) if mon is not None else _NULL


class _Null:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _Null()


def _build(args: argparse.Namespace, fault: Fault, rank: int, dev: torch.device) -> tuple[Any, ...]:
    """The model (with this rank's compute faults applied), its optimiser, gradient buckets and data loader."""
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = TinyLM(args.vocab, args.hidden, args.layers, args.heads, args.seq).to(dev)
    if fault.on(rank, "slow-rank"):
        for blk in model.blocks:
            blk.throttle = fault.magnitude
    if fault.on(rank, "sync"):
        for blk in model.blocks:
            blk.syncs = round(fault.magnitude)
    params = [p for p in model.parameters() if p.requires_grad]
    total = args.wait + args.warmup + args.steps
    data = SyntheticTokens(args.batch * total, args.seq, args.vocab, args.seed * 7919 + rank)
    delay = fault.magnitude if fault.on(rank, "slow-data") else 0.0
    loader = DataLoader(data, batch_size=args.batch, num_workers=args.workers, collate_fn=SlowCollate(delay))
    return model, MomentumSGD(params), make_buckets(params, args.buckets), loader


def train(args: argparse.Namespace) -> int:
    """Run the workload on this rank; returns the process exit status."""
    torch.set_num_threads(1)
    run = start_rank(args)
    fault, rank, world, dev, out = run.fault, run.rank, run.world, run.dev, run.out
    total, hang_step, pause_steps = run.total, run.hang_step, run.pause_steps
    model, opt, buckets, loader = _build(args, fault, rank, dev)
    arm_hang(args, fault)
    comm_delay = fault.magnitude if fault.on(rank, "slow-collective") else 0.0
    mon = StepMonitor(every=args.timings_every, out=args.timings) if args.timings is not None else None
    prof = rank_profiler(args, run)
    step_s: list[float] = []
    mon_s: list[float] = []
    if not args.no_profile:
        prof.start()
    try:
        it = iter(loader)
        for i in range(total):
            t0 = time.perf_counter()
            if fault.on(rank, "host-before"):
                faults.python_pause(fault.magnitude)  # un-annotated input work: no op runs
            with _maybe_section(mon, "data"):
                x, y = next(it)
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            with _maybe_section(mon, "forward"), record_function("gpufleet::forward"):
                loss = F.cross_entropy(model(x).reshape(-1, args.vocab), y.reshape(-1))
            if fault.on(rank, "python-pause") and i in pause_steps:
                faults.python_pause(fault.magnitude)  # between sections: no op is running
            with _maybe_section(mon, "backward"), record_function("gpufleet::backward"):
                opt.zero_grad()
                loss.backward()
            if fault.on(rank, "hang") and i == hang_step:
                faults.sleep(fault.magnitude)  # stuck before the collective; the others wait inside it
                raise Hung
            with _maybe_section(mon, "allreduce"), record_function("gpufleet::allreduce"):
                allreduce_grads(buckets, world, comm_delay)
            with _maybe_section(mon, "optimizer"), record_function("gpufleet::optimizer"):
                opt.step()
            if fault.on(rank, "host-after"):
                faults.python_pause(fault.magnitude)  # after the optimizer, before the step closes: no op runs
            if mon is not None:
                t1 = time.perf_counter()
                mon.step()
                mon_s.append(time.perf_counter() - t1)  # the monitor's own cost, gathers included
            step_s.append(time.perf_counter() - t0)  # before prof.step(), which may export the trace
            if not args.no_profile:
                prof.step()
    except Hung:
        pass
    except (RuntimeError, dist.DistError) as e:  # a peer hung: our collective timed out (or the peer left)
        if fault.kind != "hang":
            raise
        print(f"rank {rank}: collective failed at step {len(step_s)}, as the hang fault intends: {e}", file=sys.stderr)
    finally:
        if not args.no_profile:
            prof.stop()  # writes the trace, also when a collective timed out mid-step
    times = {"rank": rank, "step_s": step_s, **({"monitor_step_s": mon_s} if mon is not None else {})}
    (out / f"steps-rank-{rank}.json").write_text(json.dumps(times) + "\n")
    if fault.kind == "hang":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the process group is broken: skip its teardown, which could block
    if mon is not None:
        mon.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m gpufleet.diagnose.workload``."""
    args = parse_args(argv)
    if args.family != "lm":
        from gpufleet.diagnose.workload_ddp import train_ddp  # torch DDP: imported only when asked for

        return train_ddp(args)
    return train(args)


# ---- launching from Python ------------------------------------------------------------------------------------------
def run_workload(
    out_dir: str | Path,
    fault: str = "none",
    nproc: int = 4,
    steps: int = 8,
    seed: int = 0,
    extra: Sequence[str] = (),
    timeout: float = 600.0,
) -> Path:
    """Launch the workload with torchrun on this machine and return ``out_dir`` once every rank has finished.

    ``extra`` holds further workload flags (``["--device", "cpu", "--hidden", "256"]``). Raises DiagnoseError
    with the tail of the launcher's output when the run fails.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parse_fault(fault, nproc)  # fail here, with a clear message, rather than in every rank
    src = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
        "-m", "gpufleet.diagnose.workload",
        "--out", str(out), "--fault", fault, "--steps", str(steps), "--seed", str(seed), *extra,
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise DiagnoseError(f"workload {fault!r} in {out}: did not finish in {timeout:.0f} s") from e
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise DiagnoseError(f"workload {fault!r} in {out}: torchrun exited {proc.returncode}:\n{tail}")
    return out


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # every file is written and closed; skip torch's interpreter teardown (1-2 s per rank)
