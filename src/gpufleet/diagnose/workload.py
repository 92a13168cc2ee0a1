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
import gzip
import itertools
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import DataLoader, Dataset, default_collate

from gpufleet.diagnose import faults
from gpufleet.diagnose.faults import Fault, parse_fault
from gpufleet.diagnose.monitor import StepMonitor
from gpufleet.errors import ConfigError, DiagnoseError

#: the record_function names that mark the sections of a step in the trace
SECTIONS = ("gpufleet::forward", "gpufleet::backward", "gpufleet::allreduce", "gpufleet::optimizer")
#: nested in every gpufleet::allreduce, once per bucket: this rank waiting for its all-reduce to finish
COMM_WAIT = "gpufleet::comm_wait"
#: the shapes of training job the workload can run (``--family``); ``lm`` is this module's, the others torch DDP's
FAMILIES = ("lm", "lm-ddp", "cnn-ddp", "lm-accum")


# ---- data ---------------------------------------------------------------------------------------------------------
class SyntheticTokens(Dataset):
    """Random token sequences, reproducible per (seed, rank, index); item = (inputs, next-token targets)."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int) -> None:
        self.n, self.seq, self.vocab, self.seed = n, seq, vocab, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        t = torch.randint(self.vocab, (self.seq + 1,), generator=g)
        return t[:-1], t[1:]


class SlowCollate:
    """``default_collate`` that first waits ``delay`` seconds: the slow-data fault (a slow read or decode)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def __call__(self, batch: list[Any]) -> Any:
        faults.sleep(self.delay)
        return default_collate(batch)


# ---- model --------------------------------------------------------------------------------------------------------
_DEVICE_OPS: Any = None
_now = time.perf_counter  # the clock a throttled layer times itself with (a test may swap it)


def _block(x: torch.Tensor, seconds: float) -> torch.Tensor:
    """Body of ``gpufleet::device_wait``: wait ``seconds`` (none on a healthy rank) without using the CPU."""
    faults.sleep(seconds)
    return x.new_empty(0)


def _throttle_op() -> Any:
    """The ``gpufleet::device_wait`` op (registered once per process): blocks for the seconds it is given.

    It is a real dispatcher op, so the profiler records it as a ``cpu_op`` inside the layer that called it, exactly
    where a throttled GPU's longer kernels would keep the host waiting for them.
    """
    global _DEVICE_OPS
    if _DEVICE_OPS is None:
        lib = torch.library.Library("gpufleet", "DEF")
        lib.define("device_wait(Tensor x, float seconds) -> Tensor")
        lib.impl("device_wait", _block, "CompositeExplicitAutograd")
        _DEVICE_OPS = lib  # keep the library alive: dropping it unregisters the op
    return torch.ops.gpufleet.device_wait


class _LayerClock:
    """Start times of one wrapped layer call, forward and backward, shared by its enter/exit autograd nodes."""

    __slots__ = ("backward_s", "factor", "forward_s")

    def __init__(self, factor: float) -> None:
        self.factor, self.forward_s, self.backward_s = factor, 0.0, 0.0

    def stall(self, since: float, x: torch.Tensor) -> None:
        """Block for ``factor`` times the seconds since ``since``: the layer ran (1 + factor) times as long."""
        _throttle_op()(x.detach(), self.factor * (_now() - since))


class _EnterLayer(torch.autograd.Function):
    """Identity before a throttled layer: notes its forward start; in backward, stalls for the layer's backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clock: _LayerClock) -> torch.Tensor:
        ctx.clock = clock
        clock.forward_s = _now()
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.clock.stall(ctx.clock.backward_s, grad)
        return grad, None


class _ExitLayer(torch.autograd.Function):
    """Identity after a throttled layer: stalls for its forward; in backward, notes the backward start."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, clock: _LayerClock) -> torch.Tensor:
        ctx.clock = clock
        clock.stall(clock.forward_s, y)
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.clock.backward_s = _now()
        return grad, None


def throttled(layer: nn.Module, x: torch.Tensor, factor: float) -> torch.Tensor:
    """``layer(x)`` on a device throttled by ``factor``: forward and backward each take ``1 + factor`` times as long.

    The slow-rank fault. A clock-capped or overheating GPU runs the same kernels slower while its host waits; it
    does not take CPU from the other ranks' hosts. Extra matmul work would, on a machine where 4 ranks share 2
    cores, and the scheduler's noise would then drown the fault. So the extra time is spent blocked, in a
    ``gpufleet::device_wait`` op that every rank runs (0 s on a healthy one): the slow rank calls the very same
    ops as the others, only for longer.
    """
    clock = _LayerClock(factor)
    return _ExitLayer.apply(layer(_EnterLayer.apply(x, clock)), clock)


class Block(nn.Module):
    """A pre-norm transformer block whose linears can run on a throttled device and which can sync needlessly."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.throttle = 0.0  # extra fraction of every linear's time, forward and backward: the slow-rank fault
        self.syncs = 0  # needless .item() calls per forward, set by the sync fault

    def _lin(self, lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return throttled(lin, x, self.throttle)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, s, d = h.shape
        x = self.ln1(h).reshape(b * s, d)
        q, k, v = self._lin(self.qkv, x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b * s, d)
        h = h + self._lin(self.proj, a).reshape(b, s, d)
        x = self.ln2(h).reshape(b * s, d)
        h = h + self._lin(self.fc2, F.gelu(self._lin(self.fc1, x))).reshape(b, s, d)
        for _ in range(self.syncs):
            torch.isfinite(h).all().item()  # a host-device sync nobody needs (a "debug check" left in)
            if h.is_cuda:
                torch.cuda.synchronize()
        return h


class TinyLM(nn.Module):
    """A GPT-style language model small enough to train on CPU in tens of milliseconds per step."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.ln(h))


class MomentumSGD:
    """SGD with momentum in three foreach ops; ``torch.optim`` would import torch._dynamo, 3 s per process."""

    def __init__(self, params: list[nn.Parameter], lr: float = 0.05, momentum: float = 0.9) -> None:
        self.params, self.lr, self.momentum = params, lr, momentum
        self.bufs = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def zero_grad(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_zero_(grads)

    @torch.no_grad()
    def step(self) -> None:
        torch._foreach_mul_(self.bufs, self.momentum)
        torch._foreach_add_(self.bufs, [p.grad for p in self.params])
        torch._foreach_add_(self.params, self.bufs, alpha=-self.lr)


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


def _init_dist(device: str, timeout: float) -> tuple[int, int, torch.device]:
    """Join the process group (gloo on CPU, NCCL on GPU); a lone process without torchrun is a world of one."""
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local)
    dev = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    kw: dict[str, Any] = {"backend": "nccl" if use_cuda else "gloo", "timeout": timedelta(seconds=timeout)}
    if "RANK" not in os.environ:  # not under torchrun
        kw.update(init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    dist.init_process_group(**kw)
    return dist.get_rank(), dist.get_world_size(), dev


class _Profile(profile):
    """``torch.profiler.profile`` that does not import torch._inductor (3 s per rank) only to read a CUDA-graph flag.

    torch asks ``hasattr(torch, "_inductor")``, which imports inductor and dynamo lazily; this workload compiles
    nothing, so the flag keeps its default (False) and start-up stays short.
    """

    def prepare_trace(self) -> None:
        lazy = getattr(torch, "_lazy_modules", None)
        if "torch._inductor" in sys.modules or not isinstance(lazy, set) or "_inductor" not in lazy:
            super().prepare_trace()
            return
        lazy.discard("_inductor")
        try:
            super().prepare_trace()
        finally:
            lazy.add("_inductor")


def export_trace(prof: profile, path: Path) -> None:
    """Write the profiler's Chrome trace gzipped in one go (torch gzips it line by line: seconds per rank)."""
    if path.suffix != ".gz":
        prof.export_chrome_trace(str(path))
        return
    tmp = path.with_name(path.name.removesuffix(".gz"))  # also the trace's traceName
    prof.export_chrome_trace(str(tmp))
    path.write_bytes(gzip.compress(tmp.read_bytes(), compresslevel=4))
    tmp.unlink()


class _Hung(Exception):
    """Raised on the hanging rank after its stall, to stop training and flush its trace."""


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


def _ground_truth(args: argparse.Namespace, fault: Fault, world: int, pauses: list[int], hang: int) -> dict[str, Any]:
    """The content of ``fault.json``: the fault, where it acts, and the run's shape."""
    first = args.wait + args.warmup
    total = first + args.steps
    acts = {"python-pause": pauses, "hang": [hang]}.get(fault.kind, list(range(total)))
    return {
        **fault.to_dict(),
        "family": args.family,
        "seed": args.seed,
        "world_size": world,
        "backend": dist.get_backend(),
        "steps": args.steps,
        "profiled_steps": list(range(first, total)),
        "affected_steps": [s for s in acts if first <= s < total] if fault.rank is not None else [],
        "timeout_s": args.hang_timeout if fault.kind == "hang" else args.timeout,
        "magnitude_means": faults.FAULTS[fault.kind][2] if fault.kind in faults.FAULTS else "no fault",
    }


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
    fault = parse_fault(args.fault)
    if fault.kind == "hang" and (args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())):
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # wait() raises on timeout instead of aborting
    rank, world, dev = _init_dist(args.device, args.timeout)
    fault = parse_fault(args.fault, world)
    if fault.kind == "hang" and fault.magnitude < 0:
        fault = Fault("hang", fault.rank, args.hang_timeout + 2.0)
    total = args.wait + args.warmup + args.steps
    hang_step = args.hang_step if args.hang_step is not None else args.wait + args.warmup + args.steps // 2
    pause_steps = [i for i in range(total) if (i + 1) % args.pause_every == 0]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        truth = _ground_truth(args, fault, world, pause_steps, hang_step)
        (out / "fault.json").write_text(json.dumps(truth, indent=2) + "\n")
    model, opt, buckets, loader = _build(args, fault, rank, dev)
    if fault.kind == "hang":  # start together, then let the stuck collective time out quickly
        dist.barrier()
        if hasattr(dist.distributed_c10d, "_set_pg_timeout"):
            dist.distributed_c10d._set_pg_timeout(timedelta(seconds=args.hang_timeout))
    comm_delay = fault.magnitude if fault.on(rank, "slow-collective") else 0.0
    mon = StepMonitor(every=args.timings_every, out=args.timings) if args.timings is not None else None
    trace_path = out / f"rank-{rank}.json.gz"
    prof = _Profile(
        activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else []),
        schedule=schedule(wait=args.wait, warmup=args.warmup, active=args.steps, repeat=1),
        on_trace_ready=lambda p: export_trace(p, trace_path),
        record_shapes=False,
        with_stack=False,
    )
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
                raise _Hung
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
    except _Hung:
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
        from gpufleet.diagnose.workload_ddp import train_ddp  # it builds on this module's parts

        return train_ddp(args)
    return train(args)


# ---- launching from Python ------------------------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
