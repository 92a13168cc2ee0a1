"""How ``gpufleet perf step|plan|validate|calibrate|models`` print: Rich tables (or JSON) of what
:mod:`gpufleet.perf.request` and :mod:`gpufleet.perf.reference_runs` compute. Plan's table shows the columns that
fit 100 columns; ``--wide`` adds the step-time breakdown."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import print_json
from gpufleet.perf.validate import SPLITS
from gpufleet.report.fmt import format_step_time, format_tokens

if TYPE_CHECKING:
    from gpufleet.perf.options import TrainOptions
    from gpufleet.perf.reference_runs import CalibrationRun, ValidationRun
    from gpufleet.perf.request import PlanOutcome
    from gpufleet.perf.step import StepEstimate

__all__ = [
    "BREAKDOWN_LABELS",
    "print_calibration",
    "print_comparison",
    "print_models",
    "print_plan",
    "print_step",
    "print_validation",
]

#: How the step-time components read in tables (JSON keeps the keys).
BREAKDOWN_LABELS = {
    "compute": "compute (incl. recomputation)",
    "tp_comm": "TP communication (exposed)",
    "cp_comm": "CP K/V all-gather",
    "pp_bubble": "pipeline bubble",
    "pp_comm": "PP send/recv",
    "dp_comm_exposed": "DP communication (exposed)",
    "optimizer": "optimizer step",
    "overhead": "fixed per-step overhead",
}
#: Columns of the validate table shown without ``--wide``.
VALIDATE_COLUMNS = ("row", "case", "stack", "layout (as predicted)", "measured", "predicted", "error", "GiB / GPU")
_SHORT = {
    "compute": "compute",
    "tp_comm": "TP comm",
    "cp_comm": "CP comm",
    "pp_bubble": "bubble",
    "pp_comm": "PP comm",
    "dp_comm_exposed": "DP comm",
    "optimizer": "optim.",
    "overhead": "overhead",
}


# ---------------------------------------------------------------------------------------------- formatting
def _header(est: StepEstimate) -> str:
    from gpufleet.perf.flops import param_count

    m, s = est.model, est.system
    return (
        f"[bold]{m.name}[/] ({param_count(m) / 1e9:,.1f} B parameters, seq {est.seq:,}) on "
        f"{est.layout.gpus:,} x {s.gpu.name} ({s.describe()})\n"
        f"layout [bold]{est.layout.describe()}[/] · global batch {est.gbs:,} sequences "
        f"({format_tokens(est.gbs * est.seq)} tokens) · {est.values['microbatches']:,.0f} micro-batches per "
        f"DP rank · {_describe_options(est.options)}"
    )


def _describe_options(o: TrainOptions) -> str:
    parts = [
        o.precision,
        "flash attention" if o.flash_attention else "unfused attention",
        "sequence parallel" if o.sequence_parallel else "no sequence parallel",
        f"ZeRO-{o.zero}" if o.zero else "no ZeRO",
    ]
    overlap = [k for k, on in (("TP", o.tp_overlap), ("PP", o.pp_overlap), ("DP", o.dp_overlap)) if on]
    if overlap:
        parts.append("overlap " + "/".join(overlap))
    if o.parallel_block:
        parts.append("parallel block")
    if o.fused_ops:
        parts.append("fused ops")
    return ", ".join(parts)


def _memory_cells(est: StepEstimate) -> tuple[str, str]:
    v = est.values
    cap = est.system.gpu.memory_gb
    used = f"{v['memory_gb']:.1f} of {cap:g} GiB"
    rest = v["memory_gb"] - v["memory_states_gb"] - v["memory_activations_gb"]
    detail = (
        f"weights + grads + optimizer {v['memory_states_gb']:.1f}, activations "
        f"{v['memory_activations_gb']:.1f}, logits + reserve {rest:.1f}"
    )
    return (used, detail) if est.fits else (f"[bold red]{used}[/]", detail + " [bold red](does not fit)[/]")


def _fit_warning(est: StepEstimate) -> str:
    return (
        f"[bold red]does not fit:[/] {est.values['memory_gb']:.1f} GiB needed per GPU, the {est.system.gpu.name} "
        f"has {est.system.gpu.memory_gb:g} GiB. Try --recompute selective or full, a larger --pp or --tp, "
        "--zero 2 or 3, or a smaller --mbs (or `gpufleet perf plan` to search)."
    )


def _step_tables(est: StepEstimate) -> tuple[Table, Table]:
    d = est.to_dict()
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column(justify="right")
    summary.add_column(style="dim")
    summary.add_row("step time", format_step_time(d["step_time_s"]), "")
    summary.add_row("MFU", f"{100 * d['mfu']:.1f} %", d["flop_convention"])
    summary.add_row("HFU", f"{100 * d['hfu']:.1f} %", "also counts the FLOPs recomputation executes again")
    summary.add_row("model TFLOP/s per GPU", f"{d['model_tflops_per_gpu']:.1f}", "")
    summary.add_row("tokens/s", f"{d['tokens_per_s']:,.0f}", "")
    summary.add_row("tokens/s per GPU", f"{d['tokens_per_s_per_gpu']:,.1f}", "")
    summary.add_row("memory per GPU", *_memory_cells(est))
    breakdown = Table(title="where the step time goes (slowest pipeline stage)", header_style="bold")
    breakdown.add_column("component")
    breakdown.add_column("time", justify="right")
    breakdown.add_column("% of step", justify="right")
    step = d["step_time_s"]
    for key, value in d["breakdown"].items():
        breakdown.add_row(BREAKDOWN_LABELS.get(key, key), format_step_time(value), f"{100 * value / step:.1f} %")
    breakdown.add_section()
    breakdown.add_row("[bold]step[/]", f"[bold]{format_step_time(step)}[/]", "100.0 %")
    return summary, breakdown


# ---------------------------------------------------------------------------------------------- perf step
def print_step(out: Console, est: StepEstimate, as_json: bool = False) -> None:
    """``gpufleet perf step``: one layout's step time, MFU, memory and breakdown."""
    if as_json:
        print_json(est.to_dict())
        return
    out.print(_header(est))
    summary, breakdown = _step_tables(est)
    out.print(summary)
    out.print(breakdown)
    if not est.fits:
        out.print(_fit_warning(est))


def print_comparison(out: Console, base: StepEstimate, fast: StepEstimate, as_json: bool = False) -> None:
    """``gpufleet perf step --compare-megascale``: the layout without and with MegaScale's optimisations."""
    speedup = base.step_time_s / fast.step_time_s
    if as_json:
        print_json({"baseline": base.to_dict(), "megascale": fast.to_dict(), "speedup": speedup})
        return
    out.print(_header(base))
    out.print(_compare_table(base, fast))
    out.print(
        f"MegaScale's optimisations: [bold]{speedup:.2f}x[/] faster per step "
        f"({format_step_time(base.step_time_s)} -> {format_step_time(fast.step_time_s)}), "
        f"MFU {100 * base.values['mfu']:.1f} % -> {100 * fast.values['mfu']:.1f} %"
    )
    for est in (base, fast):
        if not est.fits:
            out.print(_fit_warning(est))


def _compare_table(base: StepEstimate, fast: StepEstimate) -> Table:
    table = Table(title="same layout without and with MegaScale's optimisations", header_style="bold")
    for col in ("", "baseline", "MegaScale", "MegaScale / baseline"):
        table.add_column(col, justify="left" if not col else "right")
    b, f = base.values, fast.values

    def ratio(x: float, y: float) -> str:
        return f"{y / x:.2f}x" if x > 0 else "—"

    table.add_row(
        "step time",
        format_step_time(b["step_time_s"]),
        format_step_time(f["step_time_s"]),
        ratio(b["step_time_s"], f["step_time_s"]),
    )
    table.add_row("MFU", f"{100 * b['mfu']:.1f} %", f"{100 * f['mfu']:.1f} %", ratio(b["mfu"], f["mfu"]))
    table.add_row(
        "tokens/s",
        f"{b['tokens_per_s']:,.0f}",
        f"{f['tokens_per_s']:,.0f}",
        ratio(b["tokens_per_s"], f["tokens_per_s"]),
    )
    table.add_row(
        "memory per GPU", f"{b['memory_gb']:.1f} GB", f"{f['memory_gb']:.1f} GB", ratio(b["memory_gb"], f["memory_gb"])
    )
    table.add_section()
    for key, label in BREAKDOWN_LABELS.items():
        table.add_row(label, format_step_time(b[key]), format_step_time(f[key]), ratio(b[key], f[key]))
    return table


# ---------------------------------------------------------------------------------------------- plan
def _print_hetero(out: Console, plan: PlanOutcome, as_json: bool) -> None:
    """Heterogeneous planning over training pools with different NICs (``gpufleet.perf.hetero``)."""
    result = plan.hetero
    summary, table = result.summary, getattr(result, "table", None)
    if as_json:
        print_json({"hetero": True, "summary": _frame_rows(summary), "layouts": _frame_rows(table)})
        return
    out.print(_frame_table(summary, f"heterogeneous plan for {plan.model.name} on cluster '{plan.cluster.name}'"))
    if table is not None:
        out.print(_frame_table(table, "layouts"))


def _frame_rows(frame: Any) -> Any:
    if frame is None:
        return None
    return frame.to_dicts() if hasattr(frame, "to_dicts") else frame


def _frame_table(frame: Any, title: str) -> Any:
    """A Rich table of a Polars DataFrame (anything else is printed as it is)."""
    if not hasattr(frame, "iter_rows"):
        return frame
    table = Table(title=title, header_style="bold")
    for name, dtype in zip(frame.columns, frame.dtypes, strict=True):
        table.add_column(name, justify="right" if dtype.is_numeric() else "left", overflow="fold")
    for row in frame.iter_rows():
        table.add_row(*[f"{v:,.4g}" if isinstance(v, float) else str(v) for v in row])
    return table


def print_plan(out: Console, plan: PlanOutcome, top: int, as_json: bool = False, wide: bool = False) -> None:
    """``gpufleet plan``: the fastest layouts, how many candidates failed, and why the others lost."""
    if plan.hetero is not None:
        _print_hetero(out, plan, as_json)
        return
    from gpufleet.perf.flops import param_count

    model, system, gpus, gbs, res = plan.model, plan.system, plan.gpus, plan.gbs, plan.result
    rows = res.table.to_dicts()
    if as_json:
        print_json(
            {
                "model": model.name,
                "gpu": system.gpu.name,
                "gpus": gpus,
                "gbs": gbs,
                "seq": model.seq,
                "layouts": rows,
                "searched": res.searched,
                "invalid": res.invalid,
                "out_of_memory": res.out_of_memory,
                "lost_to": res.lost_to,
                "seconds": res.seconds,
            }
        )
        return
    out.print(
        f"[bold]{model.name}[/] ({param_count(model) / 1e9:,.1f} B parameters, seq {model.seq:,}) on "
        f"{gpus:,} x {system.gpu.name} ({system.describe()}); global batch {gbs:,} sequences "
        f"({format_tokens(gbs * model.seq)} tokens); {_describe_options(plan.options)}"
    )
    if rows:
        out.print(_plan_table(rows, system.gpu.memory_gb, top, wide))
    else:
        out.print(
            "[bold red]no layout fits:[/] add GPUs, allow --recompute full, raise --max-tp, use --zero 3 "
            "or a GPU with more memory"
        )
    feasible = res.searched - res.invalid - res.out_of_memory
    out.print(
        f"searched {res.searched:,} layouts in {res.seconds:.2f} s: {res.invalid:,} broke a divisibility "
        f"rule, {res.out_of_memory:,} did not fit in memory, {feasible:,} fit"
    )
    if res.lost_to:
        out.print(
            "why the others lost (each feasible layout slower than #1, by the component that costs it "
            "most against #1): " + ", ".join(f"{k} {v:,}" for k, v in res.lost_to.items())
        )


def _plan_table(rows: list[dict[str, Any]], capacity: float, top: int, wide: bool) -> Table:
    from gpufleet.perf.step import BREAKDOWN_KEYS

    keys = BREAKDOWN_KEYS if wide else ()
    table = Table(
        title=f"fastest {len(rows)} layouts that fit (of top {top} asked; times in s per step)",
        header_style="bold",
        caption=None if wide else "--wide adds the step-time breakdown",
    )
    for col in ("rank", "TP", "PP", "DP", "CP", "mbs", "vp", "recompute", "step s", "MFU %", f"mem GB /{capacity:g}"):
        table.add_column(col, justify="left" if col == "recompute" else "right")
    for key in keys:
        table.add_column(_SHORT[key], justify="right")
    for r in rows:
        table.add_row(
            str(r["rank"]),
            str(r["tp"]),
            str(r["pp"]),
            str(r["dp"]),
            str(r["cp"]),
            str(r["mbs"]),
            str(r["vp"]),
            r["recompute"],
            f"{r['step_time_s']:.3f}",
            f"{100 * r['mfu']:.1f}",
            f"{r['memory_gb']:.1f}",
            *[f"{r[k]:.3f}" for k in keys],
        )
    return table


# ---------------------------------------------------------------------------------------------- validate
def _fmt_metric(kind: str, value: float) -> str:
    if kind == "step_time_s":
        return f"{value:.2f} s"
    if kind == "mfu":
        return f"{100 * value:.1f} % MFU"
    if kind == "tflops_hfu_full":
        return f"{value:.1f} TF/s hfu"
    if kind == "tflops_model":
        return f"{value:.1f} TF/s"
    if kind == "tokens_per_s_per_gpu":
        return f"{value:,.0f} tok/s/GPU"
    return f"{value:.4g}"


#: The ground truth's splits, as the summary tables list them after 'all rows'.
_SPLITS = SPLITS


def _summary_table(summary: Any, title: str) -> Table:
    table = Table(title=title, header_style="bold")
    for col in ("subset", "rows", "mean error", "max error"):
        table.add_column(col, justify="left" if col == "subset" else "right")
    n_splits = sum(1 for s in summary["subset"] if s in _SPLITS)
    for i, row in enumerate(summary.iter_rows(named=True)):
        if i in (1, 1 + n_splits):  # after 'all rows', after the splits (calibration, held-out, fresh2)
            table.add_section()
        table.add_row(row["subset"], str(row["rows"]), f"{row['mean_pct']:.1f} %", f"{row['max_pct']:.1f} %")
    return table


def print_validation(
    out: Console,
    err: Console,
    run: ValidationRun,
    efficiency: Any = None,
    csv: Any = None,
    as_json: bool = False,
    wide: bool = False,
) -> None:
    """``gpufleet perf validate``: every published measurement against its prediction, and the error summary."""
    path, table, summary, skipped = run.path, run.table, run.summary, run.skipped
    if as_json:
        print_json(
            {
                "table": str(path),
                "efficiency": str(efficiency) if efficiency else "shipped",
                "rows": table.to_dicts(),
                "summary": summary.to_dicts(),
                "skipped": [{"row": s.row, "case": s.label, "reason": s.reason} for s in skipped],
                "planner": run.planner.to_dicts() if run.planner is not None else None,
            }
        )
        return
    rows = Table(title=f"predicted vs published: {path.name}", header_style="bold")
    cols = (
        "row",
        "case",
        "group",
        "stack",
        "split",
        "layout (as predicted)",
        "measured",
        "predicted",
        "error",
        "GiB / GPU",
    )
    shown = cols if wide else VALIDATE_COLUMNS
    for col in shown:
        rows.add_column(
            col,
            justify="right" if col in ("row", "measured", "predicted", "error", "GiB / GPU") else "left",
            no_wrap=col not in ("case", "group"),
        )
    if not wide:
        rows.caption = f"--wide shows every column ({len(cols) - len(shown)} more)"
    for r in table.iter_rows(named=True):
        err_pct = r["error_pct"]
        style = "red" if err_pct > 15 else "yellow" if err_pct > 10 else ""
        cells = dict(
            zip(
                cols,
                (
                    str(r["row"]),
                    r["case"],
                    r["group"],
                    r["stack"],
                    r["split"],
                    r["layout"],
                    _fmt_metric(r["metric"], r["measured"]),
                    _fmt_metric(r["metric"], r["predicted"]),
                    f"[{style}]{err_pct:.1f} %[/]" if style else f"{err_pct:.1f} %",
                    _memory_cell(r["memory_gb"], r["gpu_memory_gb"]),
                ),
                strict=True,
            )
        )
        rows.add_row(*[cells[c] for c in shown])
    out.print(rows)
    out.print(_summary_table(summary, "absolute percentage error"))
    if not table["fits"].all():
        out.print(
            "[yellow]note:[/] rows whose predicted memory (GiB / GPU, yellow) exceeds the GPU are predicted for a "
            "layout the model thinks does not fit (the memory model overestimates those runs)"
        )
    for note in sorted({n for n in table["stack_note"].to_list() if n}):
        out.print(f"[yellow]note:[/] {note}", highlight=False)
    if run.planner is not None:
        out.print(_planner_table(run.planner))
    if skipped:
        out.print(f"skipped {len(skipped)} rows the model does not predict:")
        for s in skipped:
            out.print(f"  row {s.row}: {s.label} — {s.reason}", highlight=False)
    err.print(
        f"{table.height} rows predicted from {path}"
        + (f" with the constants of {efficiency}" if efficiency else "")
        + (f"; per-row results written to {csv}" if csv is not None else "")
    )


def _memory_cell(memory: float, capacity: float) -> str:
    text = f"{memory:.0f} / {capacity:.0f}"
    return text if memory <= capacity else f"[yellow]{text}[/]"


def _planner_table(gaps: Any) -> Table:
    from gpufleet.perf.planner_check import TRUST_GAP_PCT, TRUST_MIN_GPUS

    table = Table(
        title="the planner's best layout beside the published one (same model, GPUs, batch and software)",
        header_style="bold",
        caption=f"gap: how much faster the planner predicts its best layout; red: runs of >= {TRUST_MIN_GPUS:,} "
        f"GPUs where it exceeds {TRUST_GAP_PCT:g} %",
    )
    for col in ("row", "GPUs", "published layout", "s/step", "planner's best", "s/step ", "gap"):
        table.add_column(col, justify="left" if "layout" in col or "best" in col else "right", no_wrap=True)
    table.add_column("where the best gains", justify="left")
    for r in gaps.iter_rows(named=True):
        gap = f"{r['gap_pct']:.1f} %"
        table.add_row(
            str(r["row"]),
            f"{r['gpus']:,}",
            r["published_layout"] + ("" if r["published_fits"] else " [yellow](OOM)[/]"),
            f"{r['published_step_s']:.2f}",
            r["best_layout"],
            f"{r['best_step_s']:.2f}",
            gap if r["trusted"] else f"[red]{gap}[/]",
            r["gains"],
        )
    return table


# ---------------------------------------------------------------------------------------------- calibrate
def print_calibration(out: Console, run: CalibrationRun) -> None:
    """``gpufleet perf calibrate``: the fitted constants, the errors before and after, and where they went."""
    target, template = run.target, run.template
    consts = Table(title="fitted constants", header_style="bold")
    for col in ("section", "constant", "before", "after", "bounds", ""):
        consts.add_column(col, justify="right" if col in ("before", "after", "bounds") else "left")
    for section, key, lo, hi, x0, x1 in run.fitted:
        span = hi - lo
        note = (
            "[yellow]at lower bound[/]"
            if x1 - lo <= 1e-3 * span
            else "[yellow]at upper bound[/]"
            if hi - x1 <= 1e-3 * span
            else ""
        )
        consts.add_row(section, key, f"{x0:.4g}", f"{x1:.4g}", f"{lo:g} .. {hi:g}", note)
    out.print(consts)
    errors = Table(title="absolute percentage error, before and after the fit", header_style="bold")
    for col in ("subset", "rows", "mean before", "mean after", "max before", "max after"):
        errors.add_column(col, justify="left" if col == "subset" else "right")
    b_rows = {r["subset"]: r for r in run.before.iter_rows(named=True)}
    for r in run.after.iter_rows(named=True):
        if r["subset"] != "all rows" and r["subset"] not in _SPLITS:
            continue
        b = b_rows.get(r["subset"], {})
        errors.add_row(
            r["subset"],
            str(r["rows"]),
            f"{b.get('mean_pct', math.nan):.1f} %",
            f"{r['mean_pct']:.1f} %",
            f"{b.get('max_pct', math.nan):.1f} %",
            f"{r['max_pct']:.1f} %",
        )
    out.print(errors)
    fit = run.fit
    out.print(
        f"fit on {fit['rows']:.0f} calibration rows: mean {fit['mean_pct']:.2f} %, max {fit['max_pct']:.2f} %; "
        "held-out rows never enter the fit"
    )
    out.print(f"wrote [bold]{target}[/] (template: {template})")
    out.print(
        f"use it with: gpufleet perf validate --efficiency {target}   or   "
        f"gpufleet perf step ... --efficiency {target}",
        highlight=False,
    )


# ---------------------------------------------------------------------------------------------- models
def print_models(out: Console, rows: list[dict[str, Any]], as_json: bool = False, wide: bool = False) -> None:
    """``gpufleet perf models``: the shipped model catalog with parameter counts (``wide``: vocabulary and
    aliases too)."""
    if as_json:
        print_json(rows)
        return
    cols = (
        "name",
        "layers",
        "hidden",
        "heads",
        "kv_heads",
        "ffn",
        "vocab",
        "seq",
        "params (B)",
        "active (B)",
        "experts",
        "aliases",
    )
    shown = cols if wide else tuple(c for c in cols if c not in ("vocab", "aliases", "active (B)", "experts"))
    table = Table(
        title=f"{len(rows)} models (use with --model NAME; override any field with its flag)",
        header_style="bold",
        caption=None if wide else "--wide adds vocab, active parameters, experts and aliases",
    )
    for col in shown:
        table.add_column(col, justify="left" if col in ("name", "aliases") else "right", no_wrap=col != "aliases")
    for r in rows:
        cells = dict(
            zip(
                cols,
                (
                    r["name"],
                    str(r["layers"]),
                    f"{r['hidden']:,}",
                    str(r["heads"]),
                    str(r["kv_heads"]),
                    f"{r['ffn']:,}" + (" (GLU)" if r["glu"] else ""),
                    f"{r['vocab']:,}",
                    f"{r['seq']:,}",
                    f"{r['params_b']:,.1f}",
                    f"{r['active_params_b']:,.1f}",
                    r["experts"],
                    ", ".join(r["aliases"]),
                ),
                strict=True,
            )
        )
        table.add_row(*[cells[c] for c in shown])
    out.print(table)
