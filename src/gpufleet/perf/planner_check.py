"""The planner against the layouts experts tuned: for each published run, the planner's best layout beside it.

A model that ranks an exotic layout much faster than the one a published run tuned is missing a cost. For
every predictable row of the ground-truth table this plans the same model, GPUs, batch and training software,
and reports the planner's best layout, the published layout's predicted step time, the best one's, and how
much faster the planner claims to be (``gap_pct``), and where the claimed time comes from (``gains``: the
step-time components in which the best layout saves most against the published one, a changed recomputation,
a published layout predicted over the GPU's memory). ``perf validate`` prints it; runs of at least
``TRUST_MIN_GPUS`` GPUs should stay within ``TRUST_GAP_PCT``, and ``gains`` is the reason to name where they do not.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from gpufleet.errors import ConfigError
from gpufleet.perf.efficiency import Efficiency, default_efficiency
from gpufleet.perf.flops import RECOMPUTE_MODES
from gpufleet.perf.ground_truth import Case
from gpufleet.perf.planner import plan_layouts
from gpufleet.perf.step import BREAKDOWN_KEYS, evaluate
from gpufleet.perf.validate import predict_case

__all__ = ["TRUST_GAP_PCT", "TRUST_MIN_GPUS", "gap_gains", "planner_gaps"]

TRUST_MIN_GPUS = 1024
TRUST_GAP_PCT = 5.0

#: How the breakdown components are named in ``gains`` ("compute" includes recomputation).
_COMPONENT_NAMES = {"compute": "compute (incl. recompute)", "dp_comm_exposed": "exposed DP comm"}


def gap_gains(
    published: dict[str, float],
    best: dict[str, float],
    published_recompute: str,
    best_recompute: str,
    memory: tuple[float, float] | None = None,
    top: int = 2,
) -> str:
    """Where the planner's best layout gains on the published one, in words: the ``top`` step-time components it
    saves most seconds in (``BREAKDOWN_KEYS`` of both), a changed recomputation, and ``memory`` (the published
    layout's predicted GiB and the GPU's) where the published layout is predicted not to fit."""
    saved = sorted(
        ((published[k] - best[k], k) for k in BREAKDOWN_KEYS if published[k] - best[k] >= 0.005), reverse=True
    )
    parts = [f"{_COMPONENT_NAMES.get(k, k)} -{d:.2f} s" for d, k in saved[:top]]
    if published_recompute != best_recompute:
        parts.append(f"recompute {published_recompute} -> {best_recompute}")
    if memory is not None and memory[0] > memory[1]:
        parts.append(f"published layout over memory ({memory[0]:.0f} of {memory[1]:.0f} GiB)")
    return "; ".join(parts) if parts else "nothing: same time"


def planner_gaps(cases: Sequence[Case], efficiency: Efficiency | None = None) -> pl.DataFrame:
    """One row per published run (first case of each table row): published vs the planner's best layout."""
    eff = efficiency or default_efficiency()
    rows = []
    seen: set[int] = set()
    for case in cases:
        if case.row in seen:
            continue
        seen.add(case.row)
        published = predict_case(case, eff)
        ep = f" EP{case.ep}" if case.ep > 1 else ""
        layout = f"TP{case.tp} PP{case.pp} DP{case.dp} CP{case.cp}{ep} v{published['vp']}"
        try:
            plan = plan_layouts(case.model, case.system, case.gpus, case.gbs, case.seq, case.options, eff, top=1)
            best = plan.table.row(0, named=True) if not plan.table.is_empty() else None
        except ConfigError:
            best = None
        best_layout = "nothing fits"
        best_t = float("nan")
        gains = "nothing fits"
        if best is not None:
            pub = evaluate(
                case.model,
                case.system,
                case.gbs,
                case.tp,
                case.pp,
                case.dp,
                case.cp,
                published["mbs"],
                published["vp"],
                RECOMPUTE_MODES.index(published["recompute"]),  # type: ignore[arg-type]
                case.seq,
                case.options,
                eff,
                ep=case.ep,
            )
            gains = gap_gains(
                {k: float(pub[k]) for k in BREAKDOWN_KEYS},
                {k: float(best[k]) for k in BREAKDOWN_KEYS},
                str(published["recompute"]),
                str(best["recompute"]),
                (published["memory_gb"], case.system.gpu.memory_gb),
            )
            bep = f" EP{best['ep']}" if best["ep"] > 1 else ""
            best_layout = (
                f"TP{best['tp']} PP{best['pp']} DP{best['dp']} CP{best['cp']}{bep} mbs{best['mbs']} v{best['vp']} "
                f"{best['recompute']}"
            )
            best_t = float(best["step_time_s"])
        t = published["step_time_s"]
        rows.append(
            {
                "row": case.row,
                "case": case.label,
                "gpus": case.gpus,
                "published_layout": layout,
                "published_step_s": t,
                "published_fits": published["fits"],
                "best_layout": best_layout,
                "best_step_s": best_t,
                "gap_pct": (t - best_t) / t * 100.0,
                "trusted": not (case.gpus >= TRUST_MIN_GPUS and (t - best_t) / t * 100.0 > TRUST_GAP_PCT),
                "gains": gains,
            }
        )
    return pl.DataFrame(rows)
