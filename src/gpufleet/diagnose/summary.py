"""Behaviour summaries per (rank, function): PerfTracker's compact runtime patterns of a trace.

A function is a host op or annotation (measured by its self time) or a device kernel / copy (measured
by its duration). Per training step we keep each function's count and time; over the steps, its
count per step, total / mean / p50 / p95 / CV of per-call duration, and its share of the step time.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from gpufleet.diagnose.categories import CPU_STALL, DATA_LOADING
from gpufleet.diagnose.timeline import device_timeline, gap_waits, host_timeline, step_spans

__all__ = [
    "STEP_END",
    "STEP_START",
    "UNTRACED",
    "Timelines",
    "build_timelines",
    "call_sites",
    "function_summary",
    "per_step_functions",
    "untraced_gaps",
]

#: the function name of every untraced gap starts with this
UNTRACED = "<untraced: "
STEP_START = "<untraced: step start>"
STEP_END = "<untraced: step end>"

_KEYS = ["rank", "domain", "category", "function"]


@dataclass
class Timelines:
    """The frames every analysis starts from: step spans, host ops and device ops."""

    spans: pl.DataFrame
    host: pl.DataFrame
    device: pl.DataFrame


def build_timelines(events: pl.DataFrame) -> Timelines:
    """Steps, host nesting and device steps for a trace frame (all ranks at once)."""
    spans = step_spans(events)
    return Timelines(spans=spans, host=host_timeline(events, spans), device=device_timeline(events, spans))


def _function_name() -> pl.Expr:
    """Kernel signatures lose their argument list; other names stay as they are."""
    name = pl.col("name").fill_null("?")
    return pl.when(pl.col("cat") == "kernel").then(name.str.replace(r"\(.*$", "")).otherwise(name).alias("function")


def _calls(t: Timelines) -> pl.DataFrame:
    """One row per call: rank, step, domain, category, function, time_ns (own work), wait_ns (waiting on others).

    Domains: ``host`` is the training (step) thread, ``host-thread`` other host threads (gloo's
    collectives, the autograd engine on GPU), ``device`` the GPU. On the host both come from the call's
    self time; on the device a collective kernel's whole
    duration is waiting plus transfer, which a trace cannot split.
    """
    main = t.spans.select("rank", "pid", "tid").unique().with_columns(pl.lit(True).alias("_main"))
    host = t.host.join(main, on=["rank", "pid", "tid"], how="left")
    host = host.filter(pl.col("step").is_not_null() & ~pl.col("name").str.starts_with("ProfilerStep#")).select(
        "rank",
        "step",
        pl.when(pl.col("_main")).then(pl.lit("host")).otherwise(pl.lit("host-thread")).alias("domain"),
        "category",
        _function_name(),
        (pl.col("self_ns") - pl.col("wait_ns")).alias("time_ns"),
        "wait_ns",
        "ts_ns",
    )
    step_self = untraced_gaps(t).select(
        "rank", "step", pl.lit("host").alias("domain"), "category", "function",
        (pl.col("time_ns") - pl.col("wait_ns")).alias("time_ns"), "wait_ns", "ts_ns",
    )  # fmt: skip
    device = t.device.filter(pl.col("step").is_not_null()).select(
        "rank",
        "step",
        pl.lit("device").alias("domain"),
        "category",
        _function_name(),
        (pl.col("dur_ns") - pl.col("wait_ns")).alias("time_ns"),
        "wait_ns",
        "ts_ns",
    )
    return pl.concat([host, step_self, device], how="vertical")


def untraced_gaps(t: Timelines) -> pl.DataFrame:
    """Host time on the training thread inside a step but outside its top-level ops, one row per gap.

    The step annotation's self time, split by where it falls: ``<untraced: step start>`` (before the first op),
    ``<untraced: after OP>`` (after a top-level op, before the next) and ``<untraced: step end>`` (after the last
    op, before the step closes). Where it falls says what it likely is: before the first op, or next to the
    DataLoader, it is input work the pipeline does not annotate (``data_loading``); anywhere else it is the host
    away from the framework's ops (``cpu_stall``), or waiting where no event says so (DDP's reducer on gloo).
    Columns: rank, step, category, function, time_ns, ts_ns (the gap's start), wait_ns (the part of it spent
    blocked on a collective in flight: :func:`gpufleet.diagnose.timeline.gap_waits`).
    """
    main = t.spans.select("rank", "step", "pid", "tid", "start_ns", "end_ns")
    top = (
        t.host.filter((pl.col("depth") == 1) & pl.col("step").is_not_null())
        .join(main, on=["rank", "step", "pid", "tid"])
        .sort("rank", "step", "ts_ns")
        .with_columns((pl.col("ts_ns") + pl.col("dur_ns")).alias("_end"))
    )
    by = ["rank", "step"]
    prev_end = pl.col("_end").cum_max().shift(1).over(by)
    gaps = top.select(
        "rank",
        "step",
        pl.coalesce(prev_end, pl.col("start_ns")).alias("ts_ns"),
        (pl.col("ts_ns") - pl.coalesce(prev_end, pl.col("start_ns"))).clip(lower_bound=0).alias("time_ns"),
        pl.col("name").shift(1).over(by).alias("_prev"),
        pl.col("category").shift(1).over(by).alias("_prev_cat"),
        pl.col("category").alias("_next_cat"),
    )
    loader = (pl.col("_prev_cat") == DATA_LOADING) | (pl.col("_next_cat") == DATA_LOADING)
    gaps = gaps.select(
        "rank",
        "step",
        pl.when(pl.col("_prev").is_null() | loader.fill_null(False))
        .then(pl.lit(DATA_LOADING))
        .otherwise(pl.lit(CPU_STALL))
        .alias("category"),
        pl.when(pl.col("_prev").is_null())
        .then(pl.lit(STEP_START))
        .otherwise(pl.concat_str(pl.lit("<untraced: after "), pl.col("_prev"), pl.lit(">")))
        .alias("function"),
        "time_ns",
        "ts_ns",
    )
    last = top.group_by(by).agg(pl.col("_end").max(), pl.col("end_ns").first())
    ends = main.join(last, on=by, how="left").select(
        "rank",
        "step",
        pl.lit(CPU_STALL).alias("category"),
        pl.when(pl.col("_end").is_null()).then(pl.lit(STEP_START)).otherwise(pl.lit(STEP_END)).alias("function"),
        (pl.col("end_ns") - pl.coalesce("_end", "start_ns")).clip(lower_bound=0).alias("time_ns"),
        pl.coalesce("_end", "start_ns").alias("ts_ns"),
    )
    out = pl.concat([gaps, ends.select(gaps.columns)], how="vertical_relaxed")
    return out.with_columns(pl.Series("wait_ns", gap_waits(out, t.host), dtype=pl.Int64))


def per_step_functions(t: Timelines) -> pl.DataFrame:
    """Per (rank, step, domain, category, function): calls, own time and wait in seconds, zero-filled across ranks.

    A function that some rank never calls in a step gets a row with zero calls there, so that
    cross-rank comparisons see the absence (an extra ``.item()`` on one rank is an anomaly).
    """
    calls = _calls(t)
    agg = calls.group_by(["rank", "step", *_KEYS[1:]]).agg(
        pl.len().alias("calls"),
        (pl.col("time_ns").sum() / 1e9).alias("time_s"),
        (pl.col("wait_ns").sum() / 1e9).alias("wait_s"),
    )
    grid = agg.select(_KEYS[1:]).unique().join(t.spans.select("rank", "step"), how="cross")
    return (
        grid.join(agg, on=["rank", "step", *_KEYS[1:]], how="left")
        .with_columns(pl.col("calls").fill_null(0), pl.col("time_s").fill_null(0.0), pl.col("wait_s").fill_null(0.0))
        .sort("rank", "step", *_KEYS[1:])
    )


def call_sites(t: Timelines, quantile: float = 0.5) -> pl.DataFrame:
    """Per (rank, domain, category, function, site): a quantile over steps (the median) of one call site's own seconds.

    Site k of a function is its k-th call in a step: the same site does the same work every step (the same
    layer, the same bucket), so its median over the steps is a rank's steady cost there, untouched by a moment
    the OS descheduled the process or a collective that happened to wait. A site a rank skips in a step counts
    0 s there. ``time_s`` summed over sites is a rank's robust seconds per step in a function or category.
    """
    calls = _calls(t).sort("rank", "step", "ts_ns")
    calls = calls.with_columns(pl.int_range(pl.len()).over("rank", "step", *_KEYS[1:]).alias("site"))
    per_site = calls.group_by("rank", "step", *_KEYS[1:], "site").agg((pl.col("time_ns").sum() / 1e9).alias("t"))
    keys = per_site.select("rank", *_KEYS[1:], "site").unique()
    grid = keys.join(t.spans.select("rank", "step"), on="rank")  # every step of the rank, the site's or not
    full = grid.join(per_site, on=["rank", "step", *_KEYS[1:], "site"], how="left").with_columns(
        pl.col("t").fill_null(0.0)
    )
    return full.group_by("rank", *_KEYS[1:], "site").agg(pl.col("t").quantile(quantile, "linear").alias("time_s"))


def function_summary(t: Timelines) -> pl.DataFrame:
    """Per (rank, domain, category, function): count per step, total/mean/p50/p95/CV of call time, share of step."""
    calls = _calls(t)
    step_time = t.spans.group_by("rank").agg((pl.col("dur_ns").sum() / 1e9).alias("steps_s"), pl.len().alias("steps"))
    secs = (pl.col("time_ns") + pl.col("wait_ns")) / 1e9
    out = calls.group_by(_KEYS).agg(
        pl.len().alias("calls"),
        secs.sum().alias("total_s"),
        (pl.col("wait_ns").sum() / 1e9).alias("wait_s"),
        secs.mean().alias("mean_s"),
        secs.median().alias("p50_s"),
        secs.quantile(0.95, "linear").alias("p95_s"),
        (secs.std(ddof=0) / secs.mean()).fill_nan(0.0).alias("cv"),
    )
    return (
        out.join(step_time, on="rank", how="left")
        .with_columns(
            (pl.col("calls") / pl.col("steps")).alias("calls_per_step"),
            (pl.col("total_s") / pl.col("steps_s")).alias("share_of_step"),
        )
        .drop("steps_s", "steps")
        .sort(["rank", "total_s"], descending=[False, True])
    )
