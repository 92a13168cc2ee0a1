"""Why the guarded ``rl`` placement moves the tail: one trace and order, consolidate against rl, side by side.

Per run: preemptions and restarts (and the restart overhead and lost work they cost), idle GPU-seconds while jobs
queue (all of them, and while the queue's smallest job would fit in the idle GPUs), starts that span more nodes
than the job needs (share of starts, GPU-weighted), the contention loss, the holds rl chose; then the cohort of
jobs at rl's p99 (within 2 % of it): how much each moved against consolidate, split by whether rl ever held it,
and what it spent in queue, in restarts and running. Selection and validation traces only (issue 24's roles).

    python bench/placement_diag.py --trace ef03 --order las
    python bench/placement_diag.py --trace philly-20k --order tiresias --rl-option wait_below=0.9
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpufleet.sched.placement.rl import RLPlacement
from gpufleet.sched.policy import make_scheduler
from gpufleet.sim.config import SimConfig
from gpufleet.sim.engine import Simulator
from gpufleet.sim.network import network_for_run
from gpufleet.sim.workload import Workload, partitions_for
from gpufleet.spec import load_cluster
from placement_eval import CASES, SELECTION_CASES, SMALL_CASES, THIN_CASES, load_case, rl_options, sized_gpus
from placement_train import SELECT_ROLES


class _Recorder(Simulator):
    """The simulator, recording every start (time, job, nodes spanned, nodes needed) and free GPUs over time."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.starts: list[tuple[float, int, int, int]] = []

    def _start(self, j: int, p: int, alloc: Any, now: float) -> None:
        self.starts.append((now, j, len(alloc), self.parts[p].ideal_nodes(self.gpus[j])))
        super()._start(j, p, alloc, now)


def run(case_name: str, order: str, placement: str, opts: dict) -> tuple[_Recorder, Any]:
    """Run ``order`` with ``placement`` on the case, network on; the simulator (for its per-job state) and result."""
    case = next(c for c in CASES + SELECTION_CASES + SMALL_CASES + THIN_CASES if c.name == case_name)
    if case.role not in SELECT_ROLES:
        raise SystemExit(f"{case_name} is {case.role}: diagnose on validation and selection traces only")
    jobs = load_case(case)
    spec = load_cluster(None).resized(sized_gpus(jobs))
    label = order if placement == "consolidate" else f"{order}+{placement}"
    policy = make_scheduler(label, {}, opts if placement == "rl" else {})
    cfg = SimConfig(network=True)
    parts = partitions_for(spec)
    net = network_for_run(spec, parts, jobs, cfg)
    sim = _Recorder(Workload.from_frame(jobs), parts, policy, cfg, network=net)
    holds: dict[int, int] = {}
    placer = policy.placer
    if isinstance(placer, RLPlacement):
        hold = placer._hold

        def counted(j: int, p: int = 0) -> None:
            holds[j] = holds.get(j, 0) + 1
            hold(j, p)

        placer._hold = counted  # type: ignore[method-assign]
    res = sim.run()
    sim.holds = holds  # type: ignore[attr-defined]
    return sim, res


def figures(sim: _Recorder, res: Any) -> dict[str, float]:
    """Run-level figures: preemptions, restart overhead, idle GPUs while jobs queue, spans, contention."""
    tl = res.timeline
    t = tl["time_s"].to_numpy()
    busy, queued = tl["busy_gpus"].to_numpy(), tl["queued_jobs"].to_numpy()
    dt = np.diff(t, append=t[-1])
    idle = (sim.total_gpus - busy) * dt
    g = np.array(sim.gpus)
    starts = np.array(sim.starts)
    spans = starts[:, 2] > starts[:, 3]
    gw = g[starts[:, 1].astype(int)]
    restarts = np.array(sim.restarts)
    return {
        "avg_jct_s": float(res.summary["avg_jct_s"]),
        "p99_jct_s": float(res.summary["p99_jct_s"]),
        "preemptions": int(sum(sim.preemptions)),
        "restarts": int(restarts.sum()),
        "restart_overhead_gpu_h": float((restarts * g).sum() * sim.config.restart_s / 3600),
        "lost_work_gpu_h": float(res.meta["lost_work_gpu_s"] / 3600),
        "idle_gpu_h_while_queued": float(idle[queued > 0].sum() / 3600),
        "busy_share": float((busy * dt).sum() / (sim.total_gpus * dt.sum())),
        "starts": len(starts),
        "starts_spanning_share": float(spans.mean()),
        "gpu_weighted_spanning_share": float((gw * spans).sum() / gw.sum()),
        "contention_gpu_h": float(res.summary.get("contention_gpu_h", 0.0)),
        "holds": int(sum(getattr(sim, "holds", {}).values())),
        "jobs_held": len(getattr(sim, "holds", {})),
    }


def cohort(cons: _Recorder, rl: _Recorder, band: float = 0.02) -> dict[str, Any]:
    """The jobs within ``band`` of rl's p99 JCT: how they moved against consolidate, held or not."""
    sub, g = np.array(rl.submit), np.array(rl.gpus)
    jr, jc = np.array(rl.finish) - sub, np.array(cons.finish) - sub
    p99 = float(np.quantile(jr, 0.99))
    idx = np.flatnonzero(np.abs(jr / p99 - 1.0) <= band)
    held = np.array([j in rl.holds for j in idx])  # type: ignore[attr-defined]
    moved = jr[idx] / jc[idx] - 1.0
    pre_r, pre_c = np.array(rl.preemptions)[idx], np.array(cons.preemptions)[idx]
    fs_r = np.array(rl.first_start)[idx] - sub[idx]
    fs_c = np.array(cons.first_start)[idx] - sub[idx]
    out = {
        "p99_rl_s": p99,
        "jobs": len(idx),
        "held": int(held.sum()),
        "gpus": {int(k): int(v) for k, v in zip(*np.unique(g[idx], return_counts=True), strict=True)},
        "moved_never_held_pct": [float(x) for x in np.round(100 * np.sort(moved[~held]), 2)],
        "moved_held_pct": [float(x) for x in np.round(100 * np.sort(moved[held]), 2)],
        "preemptions_rl_mean": float(pre_r.mean()),
        "preemptions_cons_mean": float(pre_c.mean()),
        "first_start_delay_rl_minus_cons_s_median": float(np.median(fs_r - fs_c)),
        "jct_rl_minus_cons_s_median": float(np.median(jr[idx] - jc[idx])),
        "submit_range_s": [float(sub[idx].min()), float(sub[idx].max())],
    }
    # where the extra time went, summed over the cohort: queue (not running), running
    held_r, held_c = np.array(rl.held_s)[idx], np.array(cons.held_s)[idx]
    out["cohort_running_s_rl_minus_cons_median"] = float(np.median(held_r - held_c))
    out["cohort_queue_s_rl_minus_cons_median"] = float(np.median((jr[idx] - held_r) - (jc[idx] - held_c)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--order", required=True)
    ap.add_argument("--rl-option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    opts = rl_options(args.rl_option)
    cons, rc = run(args.trace, args.order, "consolidate", {})
    rl, rr = run(args.trace, args.order, "rl", opts)
    out = {
        "trace": args.trace,
        "order": args.order,
        "rl_opts": opts,
        "consolidate": figures(cons, rc),
        "rl": figures(rl, rr),
        "cohort": cohort(cons, rl),
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
