"""Train the guarded ``rl`` placement on arrivals under every order, and choose a checkpoint on validation only.

Episodes (drawn per reset, seeded):
- **Philly windows** of 500-1,500 consecutive jobs from job ranges that no evaluation uses (0-19,999, 30,000-39,999,
  50,000-59,999, 70,000-end: :data:`placement_eval.EVAL_WINDOWS` is left out), on the default cluster sized by the
  bench's rule at a load drawn from 0.8-1.1, times 1.2-3 (short windows queue less);
- **synthetic arrivals**: DeepShare model mixes with Poisson arrivals, sized the same way;
- **t = 0 mixes** (every job at once) on 32-64 GPUs, one workload among the three.

The order is drawn per episode from srtf, las, tiresias (preemptive), fifo and sjf. The placement is the guarded
``rl`` one with the model deciding the waits (``wait_rule`` 0) and the arrival features on. ElasticFlow traces are
all validation or held-apart, so none is trained on.

    python bench/placement_train.py train --out /tmp/pl/model.zip --steps 150000     # resumable
    python bench/placement_train.py select --out /tmp/pl/model.zip                   # validation traces only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpufleet.perf.comm_profiles import assign_profiles
from gpufleet.sched.placement.rl import RLPlacement
from gpufleet.sched.placement.rl_fit import checkpoints, fit_placement
from gpufleet.sched.placement.rl_gym import make_placement_env
from gpufleet.sched.policy import make_policy
from gpufleet.sched.rl_features import WAIT
from gpufleet.sim.config import SimConfig
from gpufleet.sim.engine import Simulator
from gpufleet.sim.mixes import generate_mix
from gpufleet.sim.network import network_for
from gpufleet.sim.run import RunSpec, run_one
from gpufleet.sim.workload import Workload, partitions_for
from gpufleet.spec import load_cluster
from gpufleet.traces import load_trace
from placement_eval import (
    CASES,
    EVAL_WINDOWS,
    SELECTION_CASES,
    SMALL_CASES,
    THIN_CASES,
    TraceCase,
    load_case,
    sized_gpus,
    trace_columns,
)

ORDERS = ("srtf", "las", "tiresias", "fifo", "sjf")
MIXES = ("heavy", "medium", "light", "random", "equal")
#: Share of episodes per workload: Philly windows, synthetic arrivals, t = 0 mixes.
WORKLOADS = {"philly": 0.5, "poisson": 0.3, "batch": 0.2}
#: The guarded placement as trained: the model decides the waits and reads the arrival features, on clusters of any
#: size (``small_nodes`` 0, the default, said outright: with 8 clusters of <= 8 nodes would ask nothing).
TRAIN_OPTS: dict[str, float] = {
    "guard": 1.0,
    "wait_rule": 0.0,
    "arrivals": 1.0,
    "small_nodes": 0.0,
    "service_holds": 1.0,  # the model trains under every order, las and tiresias included (seventh round)
}
SEED_BASE = 1_000_000  # synthetic mixes train on seeds from here (evaluation seeds stay below)
console = Console(stderr=True)


def training_ranges(total: int) -> list[tuple[int, int]]:
    """Philly job ranges outside every evaluation window."""
    out, start = [], 0
    for lo, hi in sorted(EVAL_WINDOWS):
        if lo > start:
            out.append((start, lo))
        start = max(start, hi)
    if start < total:
        out.append((start, total))
    return out


class Episodes:
    """Draws one training episode: jobs, a cluster sized to them, an order, and the guarded rl placement."""

    def __init__(self, placement_opts: dict[str, float] | None = None) -> None:
        self.philly = load_trace("philly").jobs.sort("submit_s")
        self.ranges = training_ranges(self.philly.height)
        self.base = load_cluster(None)
        self.opts = {**TRAIN_OPTS, **(placement_opts or {})}

    def jobs(self, rng: np.random.Generator) -> tuple[pl.DataFrame, int]:
        kinds = list(WORKLOADS)
        kind = kinds[int(rng.choice(len(kinds), p=list(WORKLOADS.values())))]
        load = float(rng.uniform(0.8, 1.1))
        if kind == "philly":
            lo, hi = self.ranges[int(rng.integers(len(self.ranges)))]
            size = int(rng.integers(500, 1500))
            start = int(rng.integers(lo, max(hi - size, lo + 1)))
            jobs = self.philly.slice(start, min(size, hi - start))
            jobs = jobs.with_columns(pl.col("submit_s") - pl.col("submit_s").min())
            jobs = assign_profiles(jobs, None, seed=int(rng.integers(1 << 30)))
            # a short window's long jobs run on long after its last arrival: sized at the bench's load it never
            # queues, so it is offered more
            return jobs, sized_gpus(jobs, load * float(rng.uniform(1.2, 3.0)))
        mix = MIXES[int(rng.integers(len(MIXES)))]
        seed = SEED_BASE + int(rng.integers(1 << 30))
        if kind == "poisson":
            jobs = generate_mix(mix, jobs=int(rng.integers(200, 600)), seed=seed, arrival="poisson")
            return jobs, sized_gpus(jobs, load)
        gpus = int(rng.choice([32, 64]))
        return generate_mix(mix, jobs=int(rng.integers(64, 256)), seed=seed, arrival="batch"), gpus

    def __call__(self, rng: np.random.Generator, decider: Any) -> Simulator:
        jobs, gpus = self.jobs(rng)
        spec = self.base.resized(gpus)
        parts = partitions_for(spec)
        policy = make_policy(ORDERS[int(rng.integers(len(ORDERS)))])
        policy.use_placement(RLPlacement(decider=decider, **self.opts))
        net = network_for(spec, parts, jobs)
        return Simulator(Workload.from_frame(jobs), parts, policy, SimConfig(network=True), network=net)


def train(args: argparse.Namespace) -> None:
    env = make_placement_env(Episodes({"margin": args.margin}), seed=args.seed, tail_weight=args.tail)
    bias = {WAIT: args.wait_bias} if args.wait_bias else None
    summary = fit_placement(
        env,
        args.out,
        steps=args.steps,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        progress=True,
        action_bias=bias,
    )
    print(json.dumps(summary, indent=1))


# -- selection on the validation (+ selection) traces only -------------------------------------------------------
#: What selection may look at: every case of these roles (never held-apart or external traces), and the trace files
#: named with ``select --trace-file`` (role ``selection-file``: real traces already judged once, now selection data).
SELECT_ROLES = ("validation", "selection", "selection-small", "selection-thin", "selection-file")


def _run(jobs: pl.DataFrame, spec: Any, label: str, network: bool, opts: dict) -> dict:
    t0 = time.perf_counter()
    s = run_one(RunSpec(label, jobs, spec, SimConfig(network=network), placement_opts=opts)).summary
    if s["finished"] < s["jobs"]:
        raise SystemExit(f"{label}: finished {s['finished']} of {s['jobs']} jobs")
    return {"avg": float(s["avg_jct_s"]), "p99": float(s["p99_jct_s"]), "s": time.perf_counter() - t0}


def _cell(task: tuple[TraceCase, dict[str, str] | None, tuple[str, str, str, bool, dict]]) -> tuple[str, dict]:
    """One run of a selection cell (a process-pool task, which carries its case and the trace files' columns):
    (cache key, its figures)."""
    case, columns, (name, order, placement, network, opts) = task
    jobs = load_case(case, columns)  # the columns name only a trace file's; bundled cases ignore them
    spec = load_cluster(None).resized(sized_gpus(jobs))
    label = order if placement == "consolidate" else f"{order}+{placement}"
    return _key(name, order, placement, network, opts), {
        **_run(jobs, spec, label, network, opts),
        "gpus": sized_gpus(jobs),
    }


def _known(files: tuple[TraceCase, ...] = ()) -> tuple[TraceCase, ...]:
    """Every case selection may name: the bundled ones and the ``--trace-file`` ones (``files``)."""
    return CASES + SELECTION_CASES + SMALL_CASES + THIN_CASES + files


def _key(name: str, order: str, placement: str, network: bool, opts: dict) -> str:
    return f"{name}/{order}/{placement}/{'net' if network else 'free'}/{json.dumps(opts, sort_keys=True)}"


def validate(
    variants: dict[str, dict],
    orders: list[str],
    cache: Path,
    roles: tuple[str, ...] = ("validation",),
    jobs: int = 1,
    files: tuple[TraceCase, ...] = (),
    columns: dict[str, str] | None = None,
) -> pl.DataFrame:
    """Each variant (rl placement options) against consolidate and contention under every order, on the cases of
    ``roles`` (validation and selection only; ``files``: the ``--trace-file`` cases, read with ``columns``); every run
    is cached in ``cache`` by trace, order, placement and options, so that a variant judged once is never run
    again."""
    bad = set(roles) - set(SELECT_ROLES)
    if bad:
        raise SystemExit(f"selection may not look at {', '.join(sorted(bad))}")
    done = json.loads(cache.read_text()) if cache.is_file() else {}
    cases = [c for c in _known(files) if c.role in roles]
    by_name = {c.name: c for c in cases}
    tasks = [(c.name, o, "consolidate", False, {}) for c in cases for o in orders]
    tasks += [
        (c.name, o, pl_name, True, {}) for c in cases for o in orders for pl_name in ("consolidate", "contention")
    ]
    tasks += [(c.name, o, "rl", True, opts) for opts in variants.values() for c in cases for o in orders]
    todo = list({_key(*t): t for t in tasks if _key(*t) not in done}.values())
    console.log(f"{len(todo)} runs to do, {len({_key(*t) for t in tasks}) - len(todo)} cached")
    with ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else _Serial() as pool:
        for key, res in pool.map(_cell, [(by_name[t[0]], columns, t) for t in todo]):
            done[key] = res
            cache.write_text(json.dumps(done))
            console.log(f"{key}: avg {res['avg']:,.0f} p99 {res['p99']:,.0f} ({res['s']:.0f} s)")
    rows = []
    for name, opts in variants.items():
        for c in cases:
            for o in orders:
                cons, cont = (
                    done[_key(c.name, o, "consolidate", True, {})],
                    done[_key(c.name, o, "contention", True, {})],
                )
                free, rl = done[_key(c.name, o, "consolidate", False, {})], done[_key(c.name, o, "rl", True, opts)]
                rows.append(
                    {
                        "variant": name,
                        "trace": c.name,
                        "role": c.role,
                        "gpus": cons["gpus"],
                        "order": o,
                        "free": free["avg"],
                        "cons": cons["avg"],
                        "cont": cont["avg"],
                        "rl": rl["avg"],
                        "avg_ratio": rl["avg"] / cons["avg"],
                        "cont_ratio": rl["avg"] / cont["avg"],
                        "p99_ratio": rl["p99"] / cons["p99"],
                    }
                )
    return pl.DataFrame(rows).with_columns(
        # a cell's margin to the bar: <= 1 passes every check (avg vs consolidate and contention, p99)
        pl.max_horizontal(pl.col("avg_ratio") / 1.01, pl.col("cont_ratio") / 1.02, "p99_ratio").alias("cell")
    )


class _Serial:
    """A stand-in for a one-worker pool: map in this process."""

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn: Any, items: list) -> Any:
        return map(fn, items)


def score(frame: pl.DataFrame) -> pl.DataFrame:
    """Per variant: the cells that fail the bar, the worst cell (its ratio to its own bar: <= 1 passes), the worst
    ratios to consolidate (avg, p99) and to contention, the mean avg ratio to consolidate, and the gap closed on the
    worst trace (best rl row against the best consolidate and network-free rows)."""
    gap = (
        frame.group_by("variant", "trace", maintain_order=True)
        .agg(
            ((pl.col("cons").min() - pl.col("rl").min()) / (pl.col("cons").min() - pl.col("free").min())).alias("g"),
            (pl.col("cons").min() - pl.col("free").min()).alias("pen"),
        )
        .filter(pl.col("pen") > 0)
        .group_by("variant", maintain_order=True)
        .agg(pl.col("g").min().alias("worst_gap"))
    )
    return (
        frame.group_by("variant", maintain_order=True)
        .agg(
            (pl.col("cell") > 1.0).sum().alias("fails"),
            pl.col("cell").max().alias("worst"),
            pl.col("avg_ratio").max().alias("worst_avg"),
            pl.col("cont_ratio").max().alias("worst_cont"),
            pl.col("p99_ratio").max().alias("worst_p99"),
            pl.col("avg_ratio").mean().alias("mean_avg"),
        )
        .join(gap, on="variant", how="left")
        .sort("worst", "mean_avg")
    )


def select(args: argparse.Namespace) -> None:
    out = Path(args.out).with_suffix(".zip")
    ckpts = [p for n, p in checkpoints(out.with_name(out.stem + ".ckpt")) if n >= args.from_step]
    if out.is_file():
        ckpts.append(out)
    variants: dict[str, dict] = {"rule": {}, **(json.loads(args.rules) if args.rules else {})}
    extra = json.loads(args.opts) if args.opts else {}
    for p in ckpts if not args.rules_only else []:
        variants[p.stem] = {"model": str(p), "wait_rule": 0.0, **extra}
    roles = tuple(args.roles.split(","))
    files = tuple(TraceCase(Path(p).stem, "selection-file", str(p)) for p in args.trace_file)
    if files and "selection-file" not in roles:
        roles = (*roles, "selection-file")
    frame = validate(
        variants, args.orders.split(","), Path(args.cache), roles, args.jobs, files, trace_columns(args.columns)
    )
    if args.json:
        frame.write_json(args.json)
    with pl.Config(tbl_rows=200, tbl_cols=20, tbl_width_chars=200):
        failing = frame.filter(pl.col("cell") > 1.0).select(
            "variant", "trace", "order", "avg_ratio", "cont_ratio", "p99_ratio"
        )
        print(failing)
        print(score(frame))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=150_000)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--margin", type=float, default=0.0)
    t.add_argument("--tail", type=float, default=0.0, help="weight of the episode's p99 JCT (hours) in the reward")
    t.add_argument("--wait-bias", type=float, default=0.0, help="initial logit added to waiting (start near the rule)")
    t.add_argument("--checkpoint-every", type=int, default=10_240)
    s = sub.add_parser("select")
    s.add_argument("--out", required=True)
    s.add_argument("--from-step", type=int, default=0)
    s.add_argument("--orders", default=",".join(ORDERS))
    s.add_argument("--opts", help="JSON of extra rl options for every checkpoint (e.g. a tail guard)")
    s.add_argument("--rules", help='JSON {name: rl options} of rule variants to judge beside "rule" (the default)')
    s.add_argument("--rules-only", action="store_true", help="judge no checkpoint, only the rule variants")
    s.add_argument("--roles", default="validation", help=f"comma-separated, of {', '.join(SELECT_ROLES)}")
    s.add_argument(
        "--trace-file",
        action="append",
        default=[],
        help="a real trace already judged once, now selection data (repeatable; role selection-file)",
    )
    s.add_argument("--columns", default="elasticflow", help="how --trace-file names its columns (placement_eval)")
    s.add_argument("--jobs", type=int, default=1, help="runs in parallel (process pool)")
    s.add_argument("--cache", default="/tmp/placement_select_runs.json")
    s.add_argument("--json")
    args = ap.parse_args()
    train(args) if args.cmd == "train" else select(args)


if __name__ == "__main__":
    main()
