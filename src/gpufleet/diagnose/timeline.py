"""Per-rank timelines built from a trace frame: training steps, host-op nesting, self time and category.

Host events (CPU ops, annotations, Python functions, runtime calls) nest on their thread; an event's
*self* time is its duration minus its children's, so that summing self times never counts a moment
twice. An event takes its category from its own name when it has one of the strong kinds
(communication, sync, memcpy), else from its enclosing scope (everything under the DataLoader's
``__next__`` is data loading), else its own (compute). The self time of a plain annotation
(``ProfilerStep#N``, ``record_function`` ranges) is host time spent outside every op: Python work,
garbage collection, sleeps; it is :data:`CPU_STALL` unless its scope says otherwise.

Device events (kernels, copies, memsets) take the step of the runtime call that launched them
(through the correlation id) and their own category.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from gpufleet.diagnose.categories import COMMUNICATION, COMPUTE, CPU_STALL, STRONG, SYNC, category_expr

HOST_CATS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
ANNOTATION_CATS = ("user_annotation", "python_function")
_STEP_RE = r"^ProfilerStep#(\d+)$"
_NEST_TOLERANCE_NS = 2_000  # Kineto rounds host timestamps to the microsecond
#: Host events that *are* a collective in flight (gloo runs them on its own worker threads).
COLLECTIVE_IMPL = r"^(?:gloo|nccl|mpi|ucc):"

__all__ = ["DEVICE_CATS", "HOST_CATS", "device_timeline", "gap_waits", "host_timeline", "step_spans"]


def step_spans(events: pl.DataFrame) -> pl.DataFrame:
    """``ProfilerStep#N`` spans per rank: rank, step, start_ns, end_ns, dur_ns, host pid/tid.

    A rank without step annotations gets one span (step 0) over its whole host timeline, so that
    single-shot traces still analyse.
    """
    steps = (
        events.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.contains(_STEP_RE))
        .select(
            "rank",
            pl.col("name").str.extract(_STEP_RE, 1).cast(pl.Int64).alias("step"),
            pl.col("ts_ns").alias("start_ns"),
            (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"),
            "pid",
            "tid",
        )
        .unique(["rank", "step"], keep="first")
    )
    host = events.filter(pl.col("cat").is_in(HOST_CATS) & (pl.col("ph") == "X"))
    without = host.select("rank").unique().join(steps.select("rank").unique(), on="rank", how="anti")
    if without.height:
        whole = (
            host.join(without, on="rank")
            .group_by("rank")
            .agg(
                pl.lit(0, dtype=pl.Int64).alias("step"),
                pl.col("ts_ns").min().alias("start_ns"),
                (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("end_ns"),
                pl.col("pid").mode().first().alias("pid"),
                pl.col("tid").mode().first().alias("tid"),
            )
        )
        steps = pl.concat([steps, whole.select(steps.columns)], how="vertical")
    return steps.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")).sort("rank", "step")


def _attach_steps(frame: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """Step of each event whose start lies inside a step span of its rank (others get a null step)."""
    starts = spans.select("rank", "step", "start_ns", "end_ns").sort("start_ns")
    out = frame.sort("ts_ns").join_asof(
        starts, left_on="ts_ns", right_on="start_ns", by="rank", strategy="backward", check_sortedness=False
    )
    inside = pl.col("ts_ns") < pl.col("end_ns")
    return out.with_columns(pl.when(inside).then(pl.col("step")).otherwise(None).alias("step")).drop(
        "start_ns", "end_ns"
    )


def _nest(ts: np.ndarray, end: np.ndarray, own: list[str | None], is_annotation: np.ndarray, thread: np.ndarray):
    """Self time, depth, scoped category, first child's start and parent's row (-1: none) of events sorted by
    (thread, ts, -dur): one stack walk."""
    n = len(ts)
    child_ns = np.zeros(n, dtype=np.int64)
    first_child = np.full(n, -1, dtype=np.int64)
    parents = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int32)
    category: list[str] = [COMPUTE] * n
    stack: list[int] = []
    current_thread = None
    ts_l, end_l, thread_l, ann_l = ts.tolist(), end.tolist(), thread.tolist(), is_annotation.tolist()
    for i in range(n):
        if thread_l[i] != current_thread:
            stack.clear()
            current_thread = thread_l[i]
        start = ts_l[i]
        # pop finished scopes, and scopes this event outlives: an event that starts a hair before its
        # predecessor ends (clock rounding) is its sibling, not its child
        while stack and (end_l[stack[-1]] <= start or end_l[i] > end_l[stack[-1]] + _NEST_TOLERANCE_NS):
            stack.pop()
        parent = stack[-1] if stack else -1
        mine = own[i]
        parents[i] = parent
        if parent >= 0:
            if first_child[parent] < 0:
                first_child[parent] = start
            child_ns[parent] += min(end_l[i], end_l[parent]) - start
            depth[i] = depth[parent] + 1
            scope = category[parent]
            if mine in STRONG:
                category[i] = mine
            elif scope not in (COMPUTE, CPU_STALL):
                category[i] = scope
            else:
                category[i] = mine or (CPU_STALL if ann_l[i] else COMPUTE)
        else:
            category[i] = mine or (CPU_STALL if ann_l[i] else COMPUTE)
        stack.append(i)
    return child_ns, depth, category, first_child, parents


def host_timeline(events: pl.DataFrame, spans: pl.DataFrame | None = None) -> pl.DataFrame:
    """Host events with step, depth, self_ns and category; ``ProfilerStep`` spans become depth-0 parents.

    Only complete events on host threads are kept. Self time of annotation events (including the
    step itself) is host time outside any op, i.e. Python and interpreter stalls.
    """
    spans = step_spans(events) if spans is None else spans
    host = events.filter(pl.col("cat").is_in(HOST_CATS) & (pl.col("ph") == "X")).select(
        "rank", "cat", "name", "pid", "tid", "ts_ns", "dur_ns", "external_id", "correlation"
    )
    host = host.with_columns(category_expr().alias("own"))
    host = host.sort(["rank", "pid", "tid", "ts_ns", "dur_ns"], descending=[False, False, False, False, True])
    thread = (
        host.select(pl.struct("rank", "pid", "tid").rank("dense").cast(pl.Int64)).to_series().to_numpy()
        if host.height
        else np.zeros(0, dtype=np.int64)
    )
    ts = host["ts_ns"].to_numpy()
    end = ts + host["dur_ns"].fill_null(0).to_numpy()
    is_ann = host["cat"].is_in(list(ANNOTATION_CATS)).to_numpy()
    child_ns, depth, category, first_child, parents = _nest(ts, end, host["own"].to_list(), is_ann, thread)
    host = host.with_columns(
        pl.Series("depth", depth),
        pl.Series("_first_child", first_child),
        pl.Series("_parent", parents),
        pl.Series("category", category, dtype=pl.Utf8),
        (pl.col("dur_ns") - pl.Series("child_ns", child_ns)).clip(lower_bound=0).alias("self_ns"),
    )
    host = _wait_time(host, spans).drop("own", "_first_child", "_parent")
    return _attach_steps(host, spans)


def _covered(starts: np.ndarray, ends: np.ndarray):
    """F(t): length of the union of [starts, ends) up to t, as a vectorised function."""
    order = np.argsort(starts)
    s, e = starts[order], ends[order]
    e = np.maximum.accumulate(e)  # merge overlaps: each interval ends no earlier than those before
    s = np.maximum(s, np.concatenate(([np.iinfo(np.int64).min], e[:-1])))
    length = np.clip(e - s, 0, None)
    before = np.concatenate(([0], np.cumsum(length)[:-1]))

    def f(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(s, t, side="right") - 1
        inside = np.clip(t - s[np.clip(k, 0, None)], 0, length[np.clip(k, 0, None)])
        return np.where(k >= 0, before[np.clip(k, 0, None)] + inside, 0)

    return f


def _wait_time(host: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """``wait_ns``: the part of an event's self time spent waiting for other ranks or for the device.

    Collective implementations (``gloo:all_reduce`` on gloo's worker thread) and synchronisations wait
    for all their self time. A communication-scope event or an annotation on the training thread waits for the part of
    its span, from its first op on, covered by a collective in flight on the same rank (the untraced
    ``work.wait()``), and all of it when it holds no op and a collective ends inside it (a blocking wait,
    woken up after the end); the rest of its self time (packing buckets, a delay before its first op, a
    comm hook's own work) is the rank's own work.
    """
    own_wait = (pl.col("name").str.contains(COLLECTIVE_IMPL) | (pl.col("own") == SYNC)).fill_null(False)
    host = host.with_columns(pl.when(own_wait).then(pl.col("self_ns")).otherwise(0).alias("wait_ns"))
    colls = host.filter(pl.col("name").str.contains(COLLECTIVE_IMPL))
    if colls.is_empty():
        return host
    parts = []
    rows = host.with_row_index("_row")
    for (rank,), group in rows.group_by("rank"):
        c = colls.filter(pl.col("rank") == rank)
        # communication-scope events, and annotations (whose self time is host time outside every op: DDP's forward
        # waiting for its buffers' broadcast, a user's "train_step" around a blocked reducer)
        comm = pl.col("category") == COMMUNICATION
        annotation = pl.col("cat").is_in(list(ANNOTATION_CATS)) & ~pl.col("name").str.starts_with("ProfilerStep#")
        cand = group.filter((comm | annotation) & ~pl.col("name").str.contains(COLLECTIVE_IMPL))
        if c.is_empty() or cand.is_empty():
            continue
        c_end = (c["ts_ns"] + c["dur_ns"]).to_numpy()
        f = _covered(c["ts_ns"].to_numpy(), c_end)
        start, dur = cand["ts_ns"].to_numpy(), cand["dur_ns"].to_numpy()
        # a rank waits on a collective only once it has launched it: time before the event's first op (a delay, a
        # slow comm hook's own work) is its own, even while an earlier collective is still in flight
        first = cand["_first_child"].to_numpy()
        overlap = f(start + dur) - f(np.where(first >= 0, first, start))
        # only the event's self time can wait: take off what its children's own spans cover
        kids = group.filter(pl.col("_parent") >= 0)
        kid_cov = f((kids["ts_ns"] + kids["dur_ns"]).to_numpy()) - f(kids["ts_ns"].to_numpy())
        by_parent = (
            pl.DataFrame({"_row": kids["_parent"].cast(pl.UInt32), "_kc": kid_cov})
            .group_by("_row")
            .agg(pl.col("_kc").sum())
        )
        kc = cand.select("_row").join(by_parent, on="_row", how="left")["_kc"].fill_null(0).to_numpy()
        overlap = np.clip(overlap - kc, 0, None)
        # a blocking wait (no op inside it) in which a collective ends waited all along: after the collective
        # ended, the thread was only being woken up (on a busy CPU, milliseconds), which is no work of its own
        ends = np.sort(c_end)
        ended_inside = np.searchsorted(ends, start + dur, side="right") > np.searchsorted(ends, start, side="right")
        blocking = ended_inside & (cand["self_ns"].to_numpy() == dur) & (cand["category"] == COMMUNICATION).to_numpy()
        overlap = np.where(blocking, dur, overlap)
        parts.append(pl.DataFrame({"_row": cand["_row"], "_overlap": overlap.astype(np.int64)}))
    if not parts:
        return host
    over = pl.concat(parts)
    host = host.with_row_index("_row").join(over, on="_row", how="left")
    return host.with_columns(
        pl.max_horizontal("wait_ns", pl.min_horizontal(pl.col("_overlap").fill_null(0), "self_ns")).alias("wait_ns")
    ).drop("_row", "_overlap")


def gap_waits(gaps: pl.DataFrame, host: pl.DataFrame) -> np.ndarray:
    """Per gap (rank, ts_ns, time_ns: host time outside every op): the nanoseconds of it spent waiting on a collective.

    The part of a gap while one of the rank's collectives is in flight is the training thread blocked on it where no
    event says so (DDP's reducer waiting inside the autograd engine, an untraced ``work.wait()``). Unlike a blocking
    op, a gap in which a collective ends is not counted as waiting all along: gloo closes its event a little after it
    released the waiting thread, so the gap after it may be the rank's own work (a pause after the optimizer).
    """
    out = np.zeros(gaps.height, dtype=np.int64)
    colls = host.filter(pl.col("name").str.contains(COLLECTIVE_IMPL))
    if colls.is_empty() or gaps.is_empty():
        return out
    indexed = gaps.with_row_index("_row")
    for (rank,), c in colls.group_by("rank"):
        g = indexed.filter(pl.col("rank") == rank)
        if g.is_empty():
            continue
        c_end = (c["ts_ns"] + c["dur_ns"]).to_numpy()
        f = _covered(c["ts_ns"].to_numpy(), c_end)
        start, dur = g["ts_ns"].to_numpy(), g["time_ns"].to_numpy()
        out[g["_row"].to_numpy()] = np.minimum(f(start + dur) - f(start), dur)
    return out


def device_timeline(events: pl.DataFrame, spans: pl.DataFrame | None = None) -> pl.DataFrame:
    """Kernels, copies and memsets with their category and the step of the runtime call that launched them."""
    spans = step_spans(events) if spans is None else spans
    device = events.filter(pl.col("cat").is_in(DEVICE_CATS) & (pl.col("ph") == "X")).select(
        "rank", "cat", "name", "pid", "tid", "ts_ns", "dur_ns", "correlation", "stream", "collective", "in_nelems"
    )
    device = device.with_columns(category_expr().fill_null(COMPUTE).alias("category"))
    device = device.with_columns(
        pl.when(pl.col("category") == COMMUNICATION).then(pl.col("dur_ns")).otherwise(0).alias("wait_ns")
    )
    if not device.height:
        return device.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    launches = _attach_steps(
        events.filter(
            pl.col("cat").is_in(["cuda_runtime", "cuda_driver"]) & pl.col("correlation").is_not_null()
        ).select("rank", "correlation", "ts_ns"),
        spans,
    ).select("rank", "correlation", pl.col("step").alias("launch_step"))
    device = device.join(launches.unique(["rank", "correlation"]), on=["rank", "correlation"], how="left")
    device = _attach_steps(device, spans)
    return device.with_columns(pl.coalesce("launch_step", "step").alias("step")).drop("launch_step")
