"""What ``gpufleet perf step|validate|calibrate|models`` and ``gpufleet plan`` do, behind the thin Typer shells.

Each ``run_*`` takes the command's options as a dict keyed by the option's parameter name (as
``gpufleet.cli`` declares them) plus the two Rich consoles, and prints either Rich tables or JSON.
NumPy, Polars and SciPy are imported inside the functions, so importing this module stays cheap.
Errors a user can cause raise ``ConfigError`` or ``SpecError`` (one red line, exit status 2).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from gpufleet.errors import ConfigError

if TYPE_CHECKING:
    from gpufleet.perf.efficiency import Efficiency
    from gpufleet.perf.model import ModelSpec
    from gpufleet.perf.options import Layout, TrainOptions
    from gpufleet.perf.step import StepEstimate
    from gpufleet.perf.system import System
    from gpufleet.spec import ClusterSpec

__all__ = [
    "BREAKDOWN_LABELS",
    "parse_tokens",
    "run_calibrate",
    "run_models",
    "run_plan",
    "run_step",
    "run_validate",
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
_SHORT = {"compute": "compute", "tp_comm": "TP comm", "cp_comm": "CP comm", "pp_bubble": "bubble", "pp_comm": "PP comm",
          "dp_comm_exposed": "DP comm", "optimizer": "optim.", "overhead": "overhead"}
_SUFFIX = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
_DEFAULT_GPU = "a100-80g"
_DEFAULT_NIC = "ib-hdr"


# ---------------------------------------------------------------------------------------------- inputs
def parse_tokens(text: str) -> int:
    """'16M' -> 16 x 2**20 tokens; K, M and G are binary multiples (the '4M tokens' of LLM papers)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgG]?)\s*", str(text))
    if not match:
        raise ConfigError(f"--gbs-tokens {text!r} is not a token count; write e.g. 4194304, 4096K, 16M or 1G")
    value = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if value < 1:
        raise ConfigError(f"--gbs-tokens {text!r} must be at least one token")
    return int(value)


def _value(x: Any) -> Any:
    """An Enum member's value, anything else unchanged."""
    return getattr(x, "value", x)


def _model(a: dict[str, Any]) -> ModelSpec:
    from gpufleet.perf.model import load_model

    return load_model(
        a.get("model"),
        layers=a.get("layers"), hidden=a.get("hidden"), heads=a.get("heads"), kv_heads=a.get("kv_heads"),
        ffn_hidden=a.get("ffn_hidden"), vocab=a.get("vocab"), seq=a.get("seq"), glu=a.get("glu"),
    )


def _cluster(a: dict[str, Any]) -> ClusterSpec | None:
    if a.get("cluster") is None:
        if a.get("pool"):
            raise ConfigError("--pool picks a pool of a --cluster file; pass --cluster too")
        return None
    if any(a.get(k) is not None for k in ("gpu", "nic", "gpus_per_node", "nics_per_node")):
        raise ConfigError("--cluster sets the GPU, NIC and node shape from its pool; "
                          "drop --gpu/--nic/--gpus-per-node/--nics-per-node or drop --cluster")
    from gpufleet.spec import load_cluster

    return load_cluster(a["cluster"])


def _system(a: dict[str, Any], cluster: ClusterSpec | None) -> System:
    from gpufleet.perf.system import System

    if cluster is not None:
        return System.from_cluster(cluster, a.get("pool"))
    gpn = a.get("gpus_per_node") or 8
    npn = a.get("nics_per_node") or 8
    return System.build(a.get("gpu") or _DEFAULT_GPU, a.get("nic") or _DEFAULT_NIC, gpn, npn)


def _gbs(a: dict[str, Any], seq: int) -> int:
    gbs, tokens = a.get("gbs"), a.get("gbs_tokens")
    if (gbs is None) == (tokens is None):
        raise ConfigError("give the global batch exactly once: --gbs SEQUENCES or --gbs-tokens TOKENS (e.g. 16M)")
    if gbs is not None:
        if gbs < 1:
            raise ConfigError(f"--gbs {gbs} must be at least 1 sequence")
        return int(gbs)
    n = parse_tokens(tokens)
    if n < seq:
        raise ConfigError(f"--gbs-tokens {tokens} is less than one sequence of {seq} tokens")
    return n // seq


def _options(a: dict[str, Any], megascale: bool | None = None) -> TrainOptions:
    from gpufleet.perf.options import TrainOptions

    common = {
        "precision": _value(a.get("precision") or "bf16"),
        "zero": int(a.get("zero", 1)),
        "flash_attention": bool(a.get("flash", True)),
        "sequence_parallel": bool(a.get("sp", True)),
        "causal_flops": bool(a.get("causal_flops", False)),
    }
    if a.get("tp_overlap"):
        common["tp_overlap"] = True
    if a.get("dp_overlap"):
        common["dp_overlap"] = True
    use_megascale = a.get("megascale", False) if megascale is None else megascale
    return TrainOptions.megascale(**common) if use_megascale else TrainOptions(**common)


def _efficiency(a: dict[str, Any]) -> Efficiency | None:
    if a.get("efficiency") is None:
        return None
    from gpufleet.perf.efficiency import load_efficiency

    return load_efficiency(a["efficiency"])


def _layout(a: dict[str, Any], model: ModelSpec, gpus: int, gbs: int) -> Layout:
    from gpufleet.perf.options import Layout
    from gpufleet.perf.step import layout_problems

    knobs = {"tp": a.get("tp", 1), "pp": a.get("pp", 1), "cp": a.get("cp", 1), "mbs": a.get("mbs", 1),
             "vp": a.get("vp", 1), "recompute": _value(a.get("recompute") or "none")}
    for key in ("tp", "pp", "cp", "mbs", "vp"):
        if knobs[key] < 1:
            raise ConfigError(f"--{key} must be at least 1, got {knobs[key]}")
    dp = a.get("dp")
    if dp is None:
        rest = knobs["tp"] * knobs["pp"] * knobs["cp"]
        if gpus % rest:
            # say why DP cannot be derived, and everything else wrong with the layout at once
            others = layout_problems(model, rest, gbs, Layout(dp=1, **knobs))
            raise ConfigError(
                f"layout TP{knobs['tp']} PP{knobs['pp']} CP{knobs['cp']} is invalid: {gpus} GPUs are not a multiple "
                f"of TP x PP x CP = {rest}, so DP cannot be derived (change --gpus or pass --dp)"
                + "".join(f"; {p}" for p in others)
            )
        dp = gpus // rest
    elif dp < 1:
        raise ConfigError(f"--dp must be at least 1, got {dp}")
    layout = Layout(dp=dp, **knobs)
    # estimate_step checks the layout against its own GPU count; check it against --gpus here
    problems = layout_problems(model, gpus, gbs, layout)
    if problems:
        raise ConfigError(f"layout {layout.describe()} is invalid: " + "; ".join(problems))
    return layout


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinity become null, NumPy scalars plain numbers, recursively."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _print_json(data: Any) -> None:
    print(json.dumps(_clean(data), indent=2, default=str))


# ---------------------------------------------------------------------------------------------- formatting
def _fmt_time(seconds: float) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "—"
    if seconds >= 100:
        return f"{seconds:,.0f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _fmt_tokens(n: float) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def _header(est: StepEstimate) -> str:
    from gpufleet.perf.flops import param_count

    m, s = est.model, est.system
    return (
        f"[bold]{m.name}[/] ({param_count(m) / 1e9:,.1f} B parameters, seq {est.seq:,}) on "
        f"{est.layout.gpus:,} x {s.gpu.name} ({s.describe()})\n"
        f"layout [bold]{est.layout.describe()}[/] · global batch {est.gbs:,} sequences "
        f"({_fmt_tokens(est.gbs * est.seq)} tokens) · {est.values['microbatches']:,.0f} micro-batches per "
        f"DP rank · {_describe_options(est.options)}"
    )


def _describe_options(o: TrainOptions) -> str:
    parts = [o.precision, "flash attention" if o.flash_attention else "unfused attention",
             "sequence parallel" if o.sequence_parallel else "no sequence parallel",
             f"ZeRO-{o.zero}" if o.zero else "no ZeRO"]
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
    used = f"{v['memory_gb']:.1f} of {cap:g} GB"
    rest = v["memory_gb"] - v["memory_states_gb"] - v["memory_activations_gb"]
    detail = (f"weights + grads + optimizer {v['memory_states_gb']:.1f}, activations "
              f"{v['memory_activations_gb']:.1f}, logits + reserve {rest:.1f}")
    return (used, detail) if est.fits else (f"[bold red]{used}[/]", detail + " [bold red](does not fit)[/]")


def _fit_warning(est: StepEstimate) -> str:
    return (
        f"[bold red]does not fit:[/] {est.values['memory_gb']:.1f} GB needed per GPU, the {est.system.gpu.name} "
        f"has {est.system.gpu.memory_gb:g} GB. Try --recompute selective or full, a larger --pp or --tp, "
        "--zero 2 or 3, or a smaller --mbs (or `gpufleet plan` to search)."
    )


def _step_tables(est: StepEstimate) -> tuple[Table, Table]:
    d = est.to_dict()
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column(justify="right")
    summary.add_column(style="dim")
    summary.add_row("step time", _fmt_time(d["step_time_s"]), "")
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
        breakdown.add_row(BREAKDOWN_LABELS.get(key, key), _fmt_time(value), f"{100 * value / step:.1f} %")
    breakdown.add_section()
    breakdown.add_row("[bold]step[/]", f"[bold]{_fmt_time(step)}[/]", "100.0 %")
    return summary, breakdown


# ---------------------------------------------------------------------------------------------- perf step
def run_step(out: Console, err: Console, a: dict[str, Any]) -> None:
    """``gpufleet perf step``: one layout's step time, MFU, memory and breakdown."""
    from gpufleet.perf.step import estimate_step

    model = _model(a)
    cluster = _cluster(a)
    system = _system(a, cluster)
    gpus = int(a["gpus"])
    if gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {gpus}")
    gbs = _gbs(a, model.seq)
    layout = _layout(a, model, gpus, gbs)
    eff = _efficiency(a)
    as_json = a.get("as_json", False)

    if a.get("compare_megascale"):
        base = estimate_step(model, system, layout, gbs, options=_options(a, megascale=False), efficiency=eff)
        fast = estimate_step(model, system, layout, gbs, options=_options(a, megascale=True), efficiency=eff)
        speedup = base.step_time_s / fast.step_time_s
        if as_json:
            _print_json({"baseline": base.to_dict(), "megascale": fast.to_dict(), "speedup": speedup})
            return
        out.print(_header(base))
        out.print(_compare_table(base, fast))
        out.print(f"MegaScale's optimisations: [bold]{speedup:.2f}x[/] faster per step "
                  f"({_fmt_time(base.step_time_s)} -> {_fmt_time(fast.step_time_s)}), "
                  f"MFU {100 * base.values['mfu']:.1f} % -> {100 * fast.values['mfu']:.1f} %")
        for est in (base, fast):
            if not est.fits:
                out.print(_fit_warning(est))
        return

    est = estimate_step(model, system, layout, gbs, options=_options(a), efficiency=eff)
    if as_json:
        _print_json(est.to_dict())
        return
    out.print(_header(est))
    summary, breakdown = _step_tables(est)
    out.print(summary)
    out.print(breakdown)
    if not est.fits:
        out.print(_fit_warning(est))


def _compare_table(base: StepEstimate, fast: StepEstimate) -> Table:
    table = Table(title="same layout without and with MegaScale's optimisations",
                  header_style="bold")
    for col in ("", "baseline", "MegaScale", "MegaScale / baseline"):
        table.add_column(col, justify="left" if not col else "right")
    b, f = base.values, fast.values

    def ratio(x: float, y: float) -> str:
        return f"{y / x:.2f}x" if x > 0 else "—"

    table.add_row("step time", _fmt_time(b["step_time_s"]), _fmt_time(f["step_time_s"]),
                  ratio(b["step_time_s"], f["step_time_s"]))
    table.add_row("MFU", f"{100 * b['mfu']:.1f} %", f"{100 * f['mfu']:.1f} %", ratio(b["mfu"], f["mfu"]))
    table.add_row("tokens/s", f"{b['tokens_per_s']:,.0f}", f"{f['tokens_per_s']:,.0f}",
                  ratio(b["tokens_per_s"], f["tokens_per_s"]))
    table.add_row("memory per GPU", f"{b['memory_gb']:.1f} GB", f"{f['memory_gb']:.1f} GB",
                  ratio(b["memory_gb"], f["memory_gb"]))
    table.add_section()
    for key, label in BREAKDOWN_LABELS.items():
        table.add_row(label, _fmt_time(b[key]), _fmt_time(f[key]), ratio(b[key], f[key]))
    return table


# ---------------------------------------------------------------------------------------------- plan
def _hetero(out: Console, err: Console, a: dict[str, Any], model: ModelSpec, cluster: ClusterSpec) -> None:
    """Hook for heterogeneous planning over training pools with different NICs (``gpufleet.perf.hetero``)."""
    try:
        from gpufleet.perf.hetero import plan_hetero
    except ModuleNotFoundError as exc:
        if exc.name != "gpufleet.perf.hetero":  # a dependency of an existing module is missing: a real bug
            raise
        raise ConfigError(
            "heterogeneous planning unavailable: the training pools of this cluster use different NICs "
            f"({', '.join(sorted({p.nic for p in cluster.training_pools}))}); pass --pool to plan on one pool"
        ) from None
    gbs = _gbs(a, model.seq)
    result = plan_hetero(model, cluster, gbs, model.seq, _options(a), _efficiency(a), int(a.get("top") or 10))
    summary, table = result.summary, getattr(result, "table", None)
    if a.get("as_json"):
        _print_json({"hetero": True, "summary": _frame_rows(summary), "layouts": _frame_rows(table)})
        return
    out.print(_frame_table(summary, f"heterogeneous plan for {model.name} on cluster '{cluster.name}'"))
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
        table.add_column(name, justify="right" if dtype.is_numeric() else "left")
    for row in frame.iter_rows():
        table.add_row(*[f"{v:,.4g}" if isinstance(v, float) else str(v) for v in row])
    return table


def run_plan(out: Console, err: Console, a: dict[str, Any]) -> None:
    """``gpufleet plan``: search every layout, rank those that fit, explain why the others lost."""
    from gpufleet.perf.flops import RECOMPUTE_MODES
    from gpufleet.perf.planner import plan_layouts

    model = _model(a)
    cluster = _cluster(a)
    if cluster is not None and not a.get("pool"):
        nics = {p.nic for p in cluster.training_pools}
        if len(nics) > 1:
            _hetero(out, err, a, model, cluster)
            return
    system = _system(a, cluster)
    if a.get("gpus") is None:
        raise ConfigError("--gpus is required: the number of GPUs to plan for (e.g. --gpus 1024)")
    gpus = int(a["gpus"])
    if gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {gpus}")
    gbs = _gbs(a, model.seq)
    top = int(a.get("top") or 10)
    if top < 1:
        raise ConfigError(f"--top must be at least 1, got {top}")
    chosen = [_value(r) for r in (a.get("recompute") or [])]
    recompute = tuple(r for r in RECOMPUTE_MODES if r in chosen) if chosen else RECOMPUTE_MODES
    max_tp, max_cp = a.get("max_tp"), a.get("max_cp")
    if max_tp is not None and max_tp < 1:
        raise ConfigError(f"--max-tp must be at least 1, got {max_tp}")
    res = plan_layouts(model, system, gpus, gbs, options=_options(a), efficiency=_efficiency(a), top=top,
                       recompute=recompute, max_tp=max_tp, max_cp=max_cp)
    rows = res.table.to_dicts()
    if a.get("as_json"):
        _print_json({
            "model": model.name, "gpu": system.gpu.name, "gpus": gpus, "gbs": gbs, "seq": model.seq,
            "layouts": rows, "searched": res.searched, "invalid": res.invalid, "out_of_memory": res.out_of_memory,
            "lost_to": res.lost_to, "seconds": res.seconds,
        })
        return
    from gpufleet.perf.flops import param_count

    out.print(f"[bold]{model.name}[/] ({param_count(model) / 1e9:,.1f} B parameters, seq {model.seq:,}) on "
              f"{gpus:,} x {system.gpu.name} ({system.describe()}); global batch {gbs:,} sequences "
              f"({_fmt_tokens(gbs * model.seq)} tokens); {_describe_options(_options(a))}")
    if rows:
        out.print(_plan_table(rows, system.gpu.memory_gb, top))
    else:
        out.print("[bold red]no layout fits:[/] add GPUs, allow --recompute full, raise --max-tp, use --zero 3 "
                  "or a GPU with more memory")
    feasible = res.searched - res.invalid - res.out_of_memory
    out.print(f"searched {res.searched:,} layouts in {res.seconds:.2f} s: {res.invalid:,} broke a divisibility "
              f"rule, {res.out_of_memory:,} did not fit in memory, {feasible:,} fit")
    if res.lost_to:
        out.print("why the others lost (each feasible layout slower than #1, by the component that costs it "
                  "most against #1): " + ", ".join(f"{k} {v:,}" for k, v in res.lost_to.items()))


def _plan_table(rows: list[dict[str, Any]], capacity: float, top: int) -> Table:
    from gpufleet.perf.step import BREAKDOWN_KEYS

    table = Table(title=f"fastest {len(rows)} layouts that fit (of top {top} asked; times in s per step)",
                  header_style="bold")
    for col in ("rank", "TP", "PP", "DP", "CP", "mbs", "vp", "recompute", "step s", "MFU %", f"mem GB /{capacity:g}"):
        table.add_column(col, justify="left" if col == "recompute" else "right")
    for key in BREAKDOWN_KEYS:
        table.add_column(_SHORT[key], justify="right")
    for r in rows:
        table.add_row(
            str(r["rank"]), str(r["tp"]), str(r["pp"]), str(r["dp"]), str(r["cp"]), str(r["mbs"]), str(r["vp"]),
            r["recompute"], f"{r['step_time_s']:.3f}", f"{100 * r['mfu']:.1f}", f"{r['memory_gb']:.1f}",
            *[f"{r[k]:.3f}" for k in BREAKDOWN_KEYS],
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


def _summary_table(summary: Any, title: str) -> Table:
    table = Table(title=title, header_style="bold")
    for col in ("subset", "rows", "mean error", "max error"):
        table.add_column(col, justify="left" if col == "subset" else "right")
    for i, row in enumerate(summary.iter_rows(named=True)):
        if i in (1, 3):  # after 'all rows', after the two splits
            table.add_section()
        table.add_row(row["subset"], str(row["rows"]), f"{row['mean_pct']:.1f} %", f"{row['max_pct']:.1f} %")
    return table


def _read_cases(a: dict[str, Any]) -> tuple[Path, list, list]:
    from gpufleet.perf.ground_truth import default_ground_truth_path, read_cases

    path = Path(a["table"]) if a.get("table") else default_ground_truth_path()
    cases, skipped = read_cases(path)
    if not cases:
        raise ConfigError(f"{path}: no row of the table can be predicted (all {len(skipped)} skipped)")
    return path, cases, skipped


def run_validate(out: Console, err: Console, a: dict[str, Any]) -> None:
    """``gpufleet perf validate``: predict every published measurement and report the error."""
    from gpufleet.perf.validate import error_summary, validate_cases

    path, cases, skipped = _read_cases(a)
    eff = _efficiency(a)
    table = validate_cases(cases, eff)
    summary = error_summary(table)
    if a.get("csv") is not None:
        csv = Path(a["csv"])
        csv.parent.mkdir(parents=True, exist_ok=True)
        table.write_csv(csv)
    if a.get("as_json"):
        _print_json({
            "table": str(path),
            "efficiency": str(a["efficiency"]) if a.get("efficiency") else "shipped",
            "rows": table.to_dicts(),
            "summary": summary.to_dicts(),
            "skipped": [{"row": s.row, "case": s.label, "reason": s.reason} for s in skipped],
        })
        return
    rows = Table(title=f"predicted vs published: {path.name}", header_style="bold")
    for col in ("row", "case", "group", "split", "layout (as predicted)", "measured",
                "predicted", "error", "fits"):
        rows.add_column(col, justify="right" if col in ("row", "measured", "predicted", "error") else "left",
                        no_wrap=col not in ("case", "group"))
    for r in table.iter_rows(named=True):
        err_pct = r["error_pct"]
        style = "red" if err_pct > 15 else "yellow" if err_pct > 10 else ""
        rows.add_row(
            str(r["row"]), r["case"], r["group"], r["split"], r["layout"], _fmt_metric(r["metric"], r["measured"]),
            _fmt_metric(r["metric"], r["predicted"]), f"[{style}]{err_pct:.1f} %[/]" if style else f"{err_pct:.1f} %",
            "yes" if r["fits"] else "[yellow]no[/]",
        )
    out.print(rows)
    out.print(_summary_table(summary, "absolute percentage error"))
    if not table["fits"].all():
        out.print("[yellow]note:[/] rows with fits = no are predicted for a layout the model thinks does not "
                  "fit in GPU memory (the memory model overestimates those runs)")
    if skipped:
        out.print(f"skipped {len(skipped)} rows the model does not predict:")
        for s in skipped:
            out.print(f"  row {s.row}: {s.label} — {s.reason}", highlight=False)
    err.print(f"{table.height} rows predicted from {path}"
              + (f" with the constants of {a['efficiency']}" if a.get("efficiency") else "")
              + (f"; per-row results written to {a['csv']}" if a.get("csv") is not None else ""))


# ---------------------------------------------------------------------------------------------- calibrate
def run_calibrate(out: Console, err: Console, a: dict[str, Any]) -> None:
    """``gpufleet perf calibrate``: refit the efficiency constants on the calibration rows, write a TOML."""
    from gpufleet.perf.calibrate import FITTED, _get, calibrate, write_efficiency
    from gpufleet.perf.efficiency import default_efficiency
    from gpufleet.perf.validate import error_summary, is_calibration, validate_cases
    from gpufleet.spec.catalog import data_file

    path, cases, _ = _read_cases(a)
    n_cal = sum(1 for c in cases if is_calibration(c))
    if not n_cal:
        raise ConfigError(f"{path}: none of its {len(cases)} predictable rows is a calibration row; nothing to fit")
    base = _efficiency(a) or default_efficiency()
    template = Path(a["efficiency"]) if a.get("efficiency") else Path(str(data_file("perf_efficiency.toml")))
    target = Path(a["out"])
    before = error_summary(validate_cases(cases, base))
    with err.status(f"fitting {len(FITTED)} efficiency constants to {n_cal} calibration rows of {path.name} ..."):
        eff, fit = calibrate(cases, base)
        after = error_summary(validate_cases(cases, eff))
    target.parent.mkdir(parents=True, exist_ok=True)
    write_efficiency(eff, template, target)

    consts = Table(title="fitted constants", header_style="bold")
    for col in ("section", "constant", "before", "after", "bounds", ""):
        consts.add_column(col, justify="right" if col in ("before", "after", "bounds") else "left")
    old, new = base.model_dump(), eff.model_dump()
    for section, key, lo, hi in FITTED:
        x0, x1 = _get(old, section, key), _get(new, section, key)
        span = hi - lo
        note = ("[yellow]at lower bound[/]" if x1 - lo <= 1e-3 * span
                else "[yellow]at upper bound[/]" if hi - x1 <= 1e-3 * span else "")
        consts.add_row(section, key, f"{x0:.4g}", f"{x1:.4g}", f"{lo:g} .. {hi:g}", note)
    out.print(consts)
    errors = Table(title="absolute percentage error, before and after the fit", header_style="bold")
    for col in ("subset", "rows", "mean before", "mean after", "max before", "max after"):
        errors.add_column(col, justify="left" if col == "subset" else "right")
    b_rows = {r["subset"]: r for r in before.iter_rows(named=True)}
    for r in after.iter_rows(named=True):
        if r["subset"] not in ("all rows", "calibration", "held-out"):
            continue
        b = b_rows.get(r["subset"], {})
        errors.add_row(r["subset"], str(r["rows"]), f"{b.get('mean_pct', math.nan):.1f} %", f"{r['mean_pct']:.1f} %",
                       f"{b.get('max_pct', math.nan):.1f} %", f"{r['max_pct']:.1f} %")
    out.print(errors)
    out.print(f"fit on {fit['rows']:.0f} calibration rows: mean {fit['mean_pct']:.2f} %, max {fit['max_pct']:.2f} %; "
              "held-out rows never enter the fit")
    out.print(f"wrote [bold]{target}[/] (template: {template})")
    out.print(f"use it with: gpufleet perf validate --efficiency {target}   or   "
              f"gpufleet perf step ... --efficiency {target}", highlight=False)


# ---------------------------------------------------------------------------------------------- models
def run_models(out: Console, err: Console, a: dict[str, Any]) -> None:
    """``gpufleet perf models``: the shipped model catalog with parameter counts."""
    from gpufleet.perf.flops import param_count
    from gpufleet.perf.model import model_catalog

    specs = list(model_catalog().specs.values())
    rows = [{
        "name": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads_eff,
        "ffn": m.ffn, "glu": m.glu, "vocab": m.vocab, "seq": m.seq, "params_b": param_count(m) / 1e9,
        "aliases": list(m.aliases),
    } for m in specs]
    if a.get("as_json"):
        _print_json(rows)
        return
    table = Table(title=f"{len(rows)} models (use with --model NAME; override any field with its flag)",
                  header_style="bold")
    for col in ("name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "params (B)", "aliases"):
        table.add_column(col, justify="left" if col in ("name", "aliases") else "right")
    for r in rows:
        table.add_row(r["name"], str(r["layers"]), f"{r['hidden']:,}", str(r["heads"]), str(r["kv_heads"]),
                      f"{r['ffn']:,}" + (" (GLU)" if r["glu"] else ""), f"{r['vocab']:,}", f"{r['seq']:,}",
                      f"{r['params_b']:,.1f}", ", ".join(r["aliases"]))
    out.print(table)
