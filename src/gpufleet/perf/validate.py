"""Predict every published measurement and report the error: the accuracy bar of ``gpufleet.perf``.

The error of a row is the absolute percentage error of step time where the source publishes one, else
of throughput (TFLOP/s per GPU in the source's own FLOP convention, MFU, or tokens/s per GPU). Where a
source leaves the micro-batch size or the number of virtual stages out, the prediction uses the value
the planner picks (fastest that fits), as the authors would have tuned it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import polars as pl

from gpufleet.perf.efficiency import Efficiency, default_efficiency
from gpufleet.perf.flops import RECOMPUTE_MODES, hardware_flops_per_step, model_flops_per_step
from gpufleet.perf.ground_truth import Case
from gpufleet.perf.step import evaluate

__all__ = [
    "CALIBRATION_SPLITS",
    "SPLITS",
    "UNSEEN_SPLITS",
    "error_summary",
    "is_calibration",
    "predict_case",
    "seen_cases",
    "signed_error_pct",
    "split_of",
    "validate_cases",
]

#: The ground truth's splits, in the order summaries list them ('fresh' is revision 3's set, calibration since).
SPLITS = ("calibration", "held-out", "fresh", "fresh2", "fresh3", "fresh4", "fresh5")

#: Held-apart splits no revision has judged yet. Every test, fit and cross-validation leaves them out (``seen_cases``);
#: ``bench/perf_planner.py`` predicts them once, at the revision's end, as their own split. None since revision 9:
#: revision 8's end judged fresh5.
UNSEEN_SPLITS: tuple[str, ...] = ()

#: Splits whose rows set the constants (``perf calibrate``). The fresh sets join calibration once judged: they can no
#: longer judge anything (revision 8: fresh2-fresh4); ``held-out`` stays apart, the split the bar names. fresh5 is
#: seen (it enters every LOSO fold) but does not calibrate: with it the refit put InfiniBand's efficiency on its 0.5
#: bound and TP overlap at 0 to absorb its MoE misses (DeepSeek-V3 +38.6 %), and held-out went 7.0 / 17.2 -> 9.0 /
#: 21.9 % (revision 9, docs/perf.md); it joins once the model expresses those runs.
CALIBRATION_SPLITS = ("calibration", "fresh2", "fresh3", "fresh4")

#: Rows whose errors set the efficiency constants (``perf calibrate``); all others are held out.
#: Per GPU generation and network: A100 on InfiniBand (Korthikanti, Narayanan Table 1), A100 on RoCE
#: (MegaScale's smallest and largest Megatron-LM runs, one MegaScale run), H100 on InfiniBand (three of
#: the five Megatron-Core runs) and H100 fp8 (the Megatron-Bridge run).
_CALIBRATION_RULES: dict[str, Callable[[Case], bool]] = {
    "Korthikanti 2022": lambda case: True,
    "Narayanan 2021": lambda case: case.source.startswith("Narayanan21 (arXiv"),  # Table 1
    "MegaScale (Megatron-LM)": lambda case: "Tab" in case.source and case.gpus in (256, 1024, 12288),
    "MegaScale (MegaScale)": lambda case: case.gpus == 1024,
    "Megatron-Core H100": lambda case: case.gpus in (48, 768, 6144),
    "Megatron-Bridge (fp8)": lambda case: True,
    "MosaicML MPT (FSDP)": lambda case: "A100" in case.label,
}


def seen_cases(cases: Sequence[Case]) -> list[Case]:
    """``cases`` without the rows of an unseen split (``UNSEEN_SPLITS``): what tests, fits and LOSO may predict."""
    return [c for c in cases if c.split not in UNSEEN_SPLITS]


def split_of(case: Case) -> str:
    """The split ``case`` belongs to: its ``split`` column (one of ``SPLITS``), else the rules."""
    if case.split:
        return case.split
    return "calibration" if is_calibration(case) else "held-out"


def is_calibration(case: Case) -> bool:
    """Whether ``case`` belongs to the calibration subset: the table's ``split`` column, else ``_CALIBRATION_RULES``."""
    if case.split:
        return case.split in CALIBRATION_SPLITS
    rule = _CALIBRATION_RULES.get(case.group)
    return rule is not None and rule(case)


def _candidates(case: Case) -> list[tuple[int, int, int]]:
    """(mbs, vp, recompute code) triples the case allows: valid divisibility, VP only with PP."""
    out = []
    for mbs, vp, rc in itertools.product(case.mbs, case.vp, case.recompute):
        too_deep = case.pp * vp > case.model.layers + 2  # an embedding-only and an output-only chunk (Llama 3)
        if case.gbs % (case.dp * mbs) or too_deep or (vp > 1 and case.pp == 1):
            continue
        if vp > 1 and len(case.vp) > 1 and (case.gbs // (case.dp * mbs)) % case.pp:
            continue  # a tuned interleaving needs micro-batches in multiples of PP (Narayanan 2021, section 2.2.2)
        out.append((mbs, vp, RECOMPUTE_MODES.index(rc)))  # type: ignore[arg-type]
    return out or [(case.mbs[0], 1, RECOMPUTE_MODES.index(case.recompute[0]))]  # type: ignore[arg-type]


def predict_case(case: Case, efficiency: Efficiency | None = None) -> dict[str, float]:
    """The prediction for one case: chosen mbs/vp, step time, MFU, memory and the value its target measures."""
    eff = efficiency or default_efficiency()
    cands = np.array(_candidates(case), dtype=float)
    out = evaluate(
        case.model,
        case.system,
        case.gbs,
        case.tp,
        case.pp,
        case.dp,
        case.cp,
        cands[:, 0],
        cands[:, 1],
        cands[:, 2],
        case.seq,
        case.options,
        eff,
        ep=case.ep,
    )
    step, mem, mfu = (np.broadcast_to(out[k], (len(cands),)) for k in ("step_time_s", "memory_gb", "mfu"))
    fits = mem <= case.system.gpu.memory_gb
    order = np.where(fits, step, step + 1e9)
    best = int(np.argmin(order))
    t = float(step[best])
    n = case.gpus
    if case.target_kind == "step_time_s":
        predicted = t
    elif case.target_kind == "tflops_hfu_full":  # the source counts recomputation FLOPs (Narayanan eq. 3)
        predicted = hardware_flops_per_step(case.model, case.gbs, case.seq, "full") / (t * n) / 1e12
    elif case.target_kind == "tflops_model":
        predicted = model_flops_per_step(case.model, case.gbs, case.seq) / (t * n) / 1e12
    elif case.target_kind == "mfu":
        predicted = float(mfu[best])
    else:  # tokens_per_s_per_gpu
        predicted = case.gbs * case.seq / t / n
    return {
        "mbs": int(cands[best, 0]),
        "vp": int(cands[best, 1]),
        "recompute": RECOMPUTE_MODES[int(cands[best, 2])],
        "step_time_s": t,
        "mfu": float(mfu[best]),
        "memory_gb": float(mem[best]),
        "fits": bool(fits[best]),
        "predicted": predicted,
    }


def _stack_used(case: Case, eff: Efficiency) -> tuple[str, str]:
    from gpufleet.perf.stacks import resolve_stack

    _, used, note = resolve_stack(case.options.stack, eff)
    return used, note


def signed_error_pct(case: Case, predicted: float) -> float:
    """The prediction's error in percent of the measurement, + when it is predicted faster than measured (a
    throughput above, or a step time below, what was measured)."""
    signed = (predicted - case.target) / case.target * 100.0
    return -signed if case.target_kind == "step_time_s" else signed


def validate_cases(cases: Sequence[Case], efficiency: Efficiency | None = None) -> pl.DataFrame:
    """One row per case: measured, predicted, absolute percentage error, split and chosen knobs."""
    rows = []
    eff = efficiency or default_efficiency()
    for case in cases:
        p = predict_case(case, eff)
        signed = signed_error_pct(case, p["predicted"])
        used, note = _stack_used(case, eff)
        ep = f" EP{case.ep}" if case.ep > 1 else ""
        rows.append(
            {
                "row": case.row,
                "case": case.label,
                "group": case.group,
                "stack": case.options.stack or "megatron-core",
                "stack_used": used,
                "stack_note": note,
                "split": split_of(case),
                "layout": f"TP{case.tp} PP{case.pp} DP{case.dp} CP{case.cp}{ep} "
                f"mbs{p['mbs']} v{p['vp']} {p['recompute']}",
                "metric": case.target_kind,
                "measured": case.target,
                "predicted": p["predicted"],
                "error_pct": abs(signed),
                "signed_pct": signed,
                "pred_mfu_pct": p["mfu"] * 100.0,
                "memory_gb": p["memory_gb"],
                "gpu_memory_gb": float(case.system.gpu.memory_gb),
                "fits": p["fits"],
            }
        )
    return pl.DataFrame(rows)


def error_summary(table: pl.DataFrame) -> pl.DataFrame:
    """Mean and max error overall, per split and per source group."""
    parts = [
        table.select(
            pl.lit("all rows").alias("subset"),
            pl.len().alias("rows"),
            pl.col("error_pct").mean().alias("mean_pct"),
            pl.col("error_pct").max().alias("max_pct"),
        ),
        table.group_by("split")
        .agg(
            pl.len().alias("rows"),
            pl.col("error_pct").mean().alias("mean_pct"),
            pl.col("error_pct").max().alias("max_pct"),
        )
        .rename({"split": "subset"})
        .sort("subset"),
        table.group_by("group")
        .agg(
            pl.len().alias("rows"),
            pl.col("error_pct").mean().alias("mean_pct"),
            pl.col("error_pct").max().alias("max_pct"),
        )
        .rename({"group": "subset"})
        .sort("subset"),
    ]
    if "stack" in table.columns:  # per stack, and per stack and split
        parts.append(
            table.group_by("stack")
            .agg(
                pl.len().alias("rows"),
                pl.col("error_pct").mean().alias("mean_pct"),
                pl.col("error_pct").max().alias("max_pct"),
            )
            .with_columns(("stack " + pl.col("stack")).alias("subset"))
            .select("subset", "rows", "mean_pct", "max_pct")
            .sort("subset")
        )
        parts.append(
            table.group_by("stack", "split")
            .agg(
                pl.len().alias("rows"),
                pl.col("error_pct").mean().alias("mean_pct"),
                pl.col("error_pct").max().alias("max_pct"),
            )
            .with_columns(("stack " + pl.col("stack") + " / " + pl.col("split")).alias("subset"))
            .select("subset", "rows", "mean_pct", "max_pct")
            .sort("subset")
        )
    return pl.concat([p.with_columns(pl.col("rows").cast(pl.Int64)) for p in parts])
