"""Where a rank's GPU time goes: busy/idle breakdown, communication/computation overlap, stream gaps, kernel stats.

The breakdown and the overlap follow Holistic Trace Analysis (HTA 0.5.0, ``hta/analyzers/breakdown_analysis.py``
and ``communication_analysis.py``) definition for definition, so that our figures can be checked against HTA's on
the same traces (``tests/diagnose/test_gpu_time.py``); they are computed with Polars over all ranks at once instead
of per-rank pandas loops. HTA's choices that look odd are kept for comparability and marked *HTA:* below.

What HTA analyses (its load step, ``Trace.load_traces`` → ``_filter_irrelevant_gpu_kernels``, reproduced by
:func:`hta_window`):

- A *GPU event* is any complete event with ``args.stream >= 0`` and ``args.correlation >= 0``: kernels, memcpys,
  memsets and ``cuda_sync`` events that carry a stream. Everything else is a *CPU event*, except the device-wide
  ``Event Sync`` / ``Context Sync`` which HTA counts as GPU events but never analyses when their stream is -1.
  *HTA:* some Kineto versions write those with stream 2**32−1; they are then GPU events of kind ``other``, and a
  long ``Context Sync`` counts as busy, non-compute GPU time.
- *HTA:* when the job's traces hold more than one ``ProfilerStep`` name, each rank keeps only the CPU events that
  start before its last ``ProfilerStep`` starts (the last, usually incomplete, step is dropped) — including those
  before the first step — and only the GPU events whose ``correlation`` matches a kept CPU event (its launch), so a
  kernel whose launch is not in the trace is dropped too. ``include_last_step=True`` keeps CPU events that start
  up to the end of the last step, like HTA's ``include_last_profiler_step``. *HTA:* the last step's start and end
  are taken over the ``gpu_user_annotation`` projections of the steps too, when a trace has them, since HTA
  classifies those as CPU events. A rank that has no ``ProfilerStep`` at all is kept whole (HTA would drop all
  its kernels and fail).

Every function here analyses that window (so the gaps and kernel statistics leave out the last step too) and
accepts either ``TraceSet.events`` or the frame :func:`hta_window` returns, to share the work between analyses.
HTA's breakdown takes every event with a stream other than -1; Kineto writes no stream without a correlation,
so requiring both, as HTA's own GPU-kernel filter does, selects the same events.

Kernel kinds (``hta/utils/utils.py:get_kernel_type``, by name, first match wins):

- ``communication``: name matches ``^nccl.*Kernel`` (so ``ncclKernel_*`` and ``ncclDevKernel_*``);
- ``memory``: name starts with ``Memcpy``, ``Memset`` or ``dma``;
- ``other``: *HTA:* the name contains ``Memcpy`` or ``Sync`` anywhere (``cuda_sync`` events, but also e.g. a
  ``SyncBatchNorm`` kernel) — not compute, so it counts as non-compute time;
- ``compute``: everything else.
"""

from __future__ import annotations

import polars as pl

from gpufleet.errors import DiagnoseError

__all__ = [
    "COMMUNICATION",
    "COMPUTE",
    "MEMORY",
    "OTHER",
    "comm_comp_overlap",
    "gpu_idle_gaps",
    "gpu_kernels",
    "hta_window",
    "kernel_kind",
    "kernel_summary",
    "merge_intervals",
    "temporal_breakdown",
]

COMPUTE, COMMUNICATION, MEMORY, OTHER = "compute", "communication", "memory", "other"

_COMM_RE = r"^nccl.*Kernel"
_MEMORY_RE = r"^(?:Memcpy|Memset|dma)"
_NOT_COMPUTE_RE = r"^(?:nccl.*Kernel|.*Memcpy|Memset|.*Sync)"  # HTA's NCCL_COMPUTE_KERNEL_RE, as re.match reads it
_STEP_NUMBER_RE = r"^ProfilerStep\s*#\s*(\d+)"
_DEVICE_SYNCS = ("Event Sync", "Context Sync")
_WINDOW_COLUMNS = ("rank", "cat", "name", "ts_ns", "dur_ns", "stream", "correlation")
_REQUIRED = (*_WINDOW_COLUMNS, "ph")


def kernel_kind(name: pl.Expr | None = None) -> pl.Expr:
    """Polars expression ``kind``: HTA's kind of a GPU event from its name (compute, communication, memory, other)."""
    name = pl.col("name") if name is None else name
    return (
        pl.when(name.str.contains(_COMM_RE))
        .then(pl.lit(COMMUNICATION))
        .when(name.str.contains(_MEMORY_RE))
        .then(pl.lit(MEMORY))
        .when(name.str.contains(_NOT_COMPUTE_RE))
        .then(pl.lit(OTHER))
        .otherwise(pl.lit(COMPUTE))
        .alias("kind")
    )


def _check(events: pl.DataFrame) -> None:
    missing = [c for c in _REQUIRED if c not in events.columns]
    if missing:
        raise DiagnoseError(
            f"events frame: missing column(s) {', '.join(missing)}; pass TraceSet.events from "
            "gpufleet.diagnose.kineto.read_folder"
        )


def _steps(frame: pl.DataFrame) -> pl.DataFrame:
    """The ``ProfilerStep#N`` spans among ``frame``'s events, per rank: rank, step_ts, step_end, step (N)."""
    return (
        frame.select(
            "rank",
            pl.col("ts_ns").alias("step_ts"),
            (pl.col("ts_ns") + pl.col("dur_ns")).alias("step_end"),
            pl.col("name").str.extract(_STEP_NUMBER_RE, 1).cast(pl.Int64).alias("step"),
        )
        .drop_nulls("step")
        .sort("rank", "step_ts")
    )


def _with_step(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """``frame`` sorted by (rank, ts), with ``iteration``: the step whose span holds ``ts_ns``, else -1."""
    frame = frame.sort("rank", "ts_ns")
    if frame.height == 0 or steps.height == 0:
        return frame.with_columns(pl.lit(-1, dtype=pl.Int64).alias("iteration"))
    found = frame.join_asof(
        steps, left_on="ts_ns", right_on="step_ts", by="rank", strategy="backward", check_sortedness=False
    )
    inside = pl.when(pl.col("ts_ns") < pl.col("step_end")).then(pl.col("step")).otherwise(-1)
    return found.with_columns(inside.fill_null(-1).alias("iteration")).drop("step_ts", "step_end", "step")


def _with_kind(gpu: pl.DataFrame) -> pl.DataFrame:
    """``kind`` of each GPU event, classified once per distinct name (names repeat: a few hundred per job)."""
    kinds = gpu.select(pl.col("name").unique()).with_columns(kernel_kind())
    return gpu.join(kinds, on="name", how="left", nulls_equal=True)


def hta_window(events: pl.DataFrame, *, include_last_step: bool = False) -> pl.DataFrame:
    """The events HTA analyses, with ``order``, ``is_gpu``, ``kind``, ``end_ns`` and ``iteration`` (rows unordered).

    ``order`` is the row's position in ``events`` (join back on it for the columns not kept here). ``iteration``
    is HTA's (``hta/common/trace.py:add_iteration``): a CPU event gets the ``ProfilerStep#N`` whose span holds its
    start, a GPU event on a stream > 0 gets the iteration of the CPU event with the same ``correlation`` (its
    launch), -1 when there is none; *HTA:* a GPU event on stream 0 gets none (null). Where a kernel has no launch in
    the trace, we also look for a ``gpu_user_annotation`` ``ProfilerStep#N`` span on the GPU that holds it (HTA
    leaves those at -1; it matters only for traces whose CPU side was lost).
    The frame can be passed to every analysis of this module in place of ``events``, to share the work; it then
    fixes ``include_last_step`` for them.
    """
    _check(events)
    ev = (
        events.select(*_WINDOW_COLUMNS, "ph")
        .with_row_index("order")
        .filter((pl.col("ph") == "X") & pl.col("cat").is_not_null() & (pl.col("cat") != "Trace"))  # HTA drops these
        .drop("ph")
        .with_columns(
            ((pl.col("stream") >= 0) & (pl.col("correlation") >= 0)).fill_null(False).alias("is_gpu"),
            (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"),
        )
    )
    is_cpu = ~pl.col("is_gpu") & ~pl.col("name").is_in(_DEVICE_SYNCS).fill_null(False)
    cpu = ev.filter(is_cpu)
    gpu = ev.filter(pl.col("is_gpu"))
    is_step = pl.col("name").str.starts_with("ProfilerStep")

    # iterations: CPU events by containment, GPU events through their launch
    cpu = _with_step(cpu, _steps(cpu.filter(is_step & (pl.col("cat") != "gpu_user_annotation"))))
    launches = (
        cpu.filter(pl.col("correlation").is_not_null())
        .sort("order")
        .unique(["rank", "correlation"], keep="last")
        .select("rank", "correlation", pl.col("iteration").alias("launch_iteration"))
    )
    gpu = _with_step(
        gpu.join(launches, on=["rank", "correlation"], how="left"),
        _steps(cpu.filter(is_step & (pl.col("cat") == "gpu_user_annotation"))),
    )
    gpu = gpu.with_columns(
        pl.when(pl.col("stream") == 0)
        .then(None)
        .when(pl.col("launch_iteration").is_not_null())
        .then(pl.col("launch_iteration"))
        .otherwise(pl.col("iteration"))
        .alias("iteration")
    ).drop("launch_iteration")

    # HTA's window: drop the last step's CPU events and the GPU events they (or nothing) launched
    has_step = pl.col("name").str.contains("ProfilerStep", literal=True)
    if ev.filter(has_step)["name"].n_unique() > 1:
        bounds = (
            cpu.filter(has_step)
            .group_by("rank")
            .agg(pl.col("ts_ns").max().alias("last_ts"), pl.col("end_ns").max().alias("last_end"))
        )
        cpu = cpu.join(bounds, on="rank", how="left")
        keep = (pl.col("ts_ns") <= pl.col("last_end")) if include_last_step else (pl.col("ts_ns") < pl.col("last_ts"))
        cpu = cpu.filter(keep | pl.col("last_ts").is_null()).drop("last_ts", "last_end")
        stepped = pl.col("rank").is_in(bounds["rank"].to_list())
        launched = cpu.filter(pl.col("correlation").is_not_null()).select("rank", "correlation").unique()
        gpu = pl.concat(
            [gpu.filter(stepped).join(launched, on=["rank", "correlation"], how="semi"), gpu.filter(~stepped)]
        )
    gpu = _with_kind(gpu)
    cpu = cpu.with_columns(pl.lit(None, dtype=pl.Utf8).alias("kind"))
    return pl.concat([gpu, cpu.select(gpu.columns)], how="vertical")


def gpu_kernels(events: pl.DataFrame, *, include_last_step: bool = False) -> pl.DataFrame:
    """The GPU events HTA analyses (kernels, memcpy, memset, stream syncs on a stream), with ``kind`` and ``end_ns``."""
    window = events if "is_gpu" in events.columns else hta_window(events, include_last_step=include_last_step)
    return window.filter(pl.col("is_gpu"))


def merge_intervals(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Union of ``[ts_ns, end_ns)`` intervals per group ``by``: disjoint, sorted; touching intervals merge (as HTA)."""
    if frame.height == 0:
        return frame.select(*by, "ts_ns", "end_ns")
    prev_end = pl.col("end_ns").cum_max().shift(1).over(by)
    return (
        frame.select(*by, "ts_ns", "end_ns")
        .sort([*by, "ts_ns"])
        .with_columns((prev_end.is_null() | (pl.col("ts_ns") > prev_end)).cum_sum().over(by).alias("_group"))
        .group_by([*by, "_group"])
        .agg(pl.col("ts_ns").min(), pl.col("end_ns").max())
        .drop("_group")
        .sort([*by, "ts_ns"])
    )


def _union_ns(frame: pl.DataFrame, by: list[str], name: str) -> pl.DataFrame:
    return merge_intervals(frame, by).group_by(by).agg((pl.col("end_ns") - pl.col("ts_ns")).sum().alias(name))


def temporal_breakdown(events: pl.DataFrame, *, include_last_step: bool = False) -> pl.DataFrame:
    """Per rank: GPU idle, compute and non-compute time (ns) and their share (%) of the GPU span, as HTA.

    HTA's ``get_temporal_breakdown``: over all streams of a rank together, ``span`` = end of the last GPU event −
    start of the first; ``idle`` = span − the union of all GPU events; ``compute`` = the union of compute kernels;
    ``non_compute`` = span − compute − idle, i.e. time when only communication, memory or *other* events run.
    *HTA:* the span runs from the first to the last GPU event of the window, not over the steps, so time before the
    first kernel and after the last one is not idle. HTA rounds the percentages to 2 decimals; we do not.
    """
    gpu = gpu_kernels(events, include_last_step=include_last_step)
    span = gpu.group_by("rank").agg((pl.col("end_ns").max() - pl.col("ts_ns").min()).alias("span_ns"))
    busy = _union_ns(gpu, ["rank"], "busy_ns")
    compute = _union_ns(gpu.filter(pl.col("kind") == COMPUTE), ["rank"], "compute_ns")
    out = (
        span.join(busy, on="rank", how="left")
        .join(compute, on="rank", how="left")
        .with_columns(pl.col("compute_ns").fill_null(0))
        .with_columns(
            (pl.col("span_ns") - pl.col("busy_ns")).alias("idle_ns"),
            (pl.col("busy_ns") - pl.col("compute_ns")).alias("non_compute_ns"),
        )
    )
    pct = [
        (100.0 * pl.col(f"{c}_ns") / pl.col("span_ns")).alias(f"{c}_pct") for c in ("idle", "compute", "non_compute")
    ]
    return (
        out.with_columns(pct)
        .select(
            "rank", "idle_ns", "compute_ns", "non_compute_ns", "span_ns", "idle_pct", "compute_pct", "non_compute_pct"
        )
        .sort("rank")
    )


def comm_comp_overlap(events: pl.DataFrame, *, include_last_step: bool = False) -> pl.DataFrame:
    """Per rank: share (%) of communication time during which a compute kernel also runs, as HTA.

    HTA's ``get_comm_comp_overlap``: |union(comm) ∩ union(compute)| / |union(comm)| over the whole window of a rank
    (not per iteration), all streams together. Memory and *other* events count for neither side. A rank without
    communication kernels gets null (HTA: NaN).
    """
    gpu = gpu_kernels(events, include_last_step=include_last_step)
    ranks = gpu.select("rank").unique()
    comm = merge_intervals(gpu.filter(pl.col("kind") == COMMUNICATION), ["rank"])
    comp = merge_intervals(gpu.filter(pl.col("kind") == COMPUTE), ["rank"])
    comm_ns = comm.group_by("rank").agg((pl.col("end_ns") - pl.col("ts_ns")).sum().alias("comm_ns"))
    # sweep: comm adds 1, compute adds 2; where the running sum is 3 both run
    edges = pl.concat(
        [
            comm.select("rank", pl.col("ts_ns").alias("t"), pl.lit(1).alias("d")),
            comm.select("rank", pl.col("end_ns").alias("t"), pl.lit(-1).alias("d")),
            comp.select("rank", pl.col("ts_ns").alias("t"), pl.lit(2).alias("d")),
            comp.select("rank", pl.col("end_ns").alias("t"), pl.lit(-2).alias("d")),
        ]
    ).sort("rank", "t")
    overlap = (
        edges.with_columns(
            pl.col("d").cum_sum().over("rank").alias("running"),
            (pl.col("t").shift(-1).over("rank") - pl.col("t")).alias("len"),
        )
        .filter(pl.col("running") == 3)
        .group_by("rank")
        .agg(pl.col("len").sum().alias("overlap_ns"))
    )
    return (
        ranks.join(comm_ns, on="rank", how="left")
        .join(overlap, on="rank", how="left")
        .with_columns(pl.col("comm_ns").fill_null(0), pl.col("overlap_ns").fill_null(0))
        .with_columns(
            pl.when(pl.col("comm_ns") > 0)
            .then(100.0 * pl.col("overlap_ns") / pl.col("comm_ns"))
            .otherwise(None)
            .alias("overlap_pct")
        )
        .select("rank", "comm_ns", "overlap_ns", "overlap_pct")
        .sort("rank")
    )


def gpu_idle_gaps(events: pl.DataFrame, *, include_last_step: bool = False) -> pl.DataFrame:
    """Per (rank, stream): busy and idle time of the stream and its idle gaps between consecutive GPU events.

    A gap is the time from the end of everything that ran before on the stream to the start of the next event
    (HTA's ``idle_interval`` in ``get_idle_time_breakdown``); only positive gaps count. Columns: events, span_ns,
    busy_ns, gaps, idle_ns, p50_gap_ns, p95_gap_ns, max_gap_ns.
    """
    gpu = gpu_kernels(events, include_last_step=include_last_step)
    keys = ["rank", "stream"]
    prev_end = pl.col("end_ns").cum_max().shift(1).over(keys)
    gaps = gpu.sort([*keys, "ts_ns"]).with_columns((pl.col("ts_ns") - prev_end).alias("gap")).filter(pl.col("gap") > 0)
    stats = gpu.group_by(keys).agg(
        pl.len().alias("events"), (pl.col("end_ns").max() - pl.col("ts_ns").min()).alias("span_ns")
    )
    gap_stats = gaps.group_by(keys).agg(
        pl.len().alias("gaps"),
        pl.col("gap").sum().alias("idle_ns"),
        pl.col("gap").quantile(0.5, "linear").alias("p50_gap_ns"),
        pl.col("gap").quantile(0.95, "linear").alias("p95_gap_ns"),
        pl.col("gap").max().alias("max_gap_ns"),
    )
    return (
        stats.join(_union_ns(gpu, keys, "busy_ns"), on=keys, how="left")
        .join(gap_stats, on=keys, how="left")
        .with_columns(pl.col("gaps").fill_null(0).cast(pl.UInt32), pl.col("idle_ns").fill_null(0))
        .select(*keys, "events", "span_ns", "busy_ns", "gaps", "idle_ns", "p50_gap_ns", "p95_gap_ns", "max_gap_ns")
        .sort(keys)
    )


def kernel_summary(events: pl.DataFrame, *, include_last_step: bool = False) -> pl.DataFrame:
    """Per (rank, kernel name): kind, count and duration statistics (ns), longest total first within a rank."""
    gpu = gpu_kernels(events, include_last_step=include_last_step)
    dur = pl.col("dur_ns")
    return (
        gpu.group_by("rank", "name")
        .agg(
            pl.col("kind").first(),
            pl.len().alias("count"),
            dur.sum().alias("total_ns"),
            dur.mean().alias("mean_ns"),
            dur.quantile(0.5, "linear").alias("p50_ns"),
            dur.quantile(0.95, "linear").alias("p95_ns"),
            dur.min().alias("min_ns"),
            dur.max().alias("max_ns"),
        )
        .sort(["rank", "total_ns", "name"], descending=[False, True, False])
    )
