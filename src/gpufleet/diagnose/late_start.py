"""Late-start straggler candidates: the ranks that start the job's dominant collective last, as HTA finds them.

Blocking collectives end together on every rank, so the rank that *starts* the dominant one last is the one the
others wait for. This is HTA 0.5.0's ``get_potential_stragglers`` with its default metric,
``find_stragglers_with_late_start_comm_kernels`` (``hta/analyzers/straggler.py``), step for step:

1. take the events of the selected ``ProfilerStep`` iterations (default: every step in HTA's window, i.e. all but
   the last, see :func:`gpufleet.diagnose.gpu_time.hta_window`); ``t_min`` = their earliest start over all ranks,
   mean iteration time = (latest end − ``t_min``) / number of iterations;
2. keep communication kernels on streams > 0, in iterations > 0, lasting ≥ 1 % of the mean iteration time;
3. per (rank, stream, iteration, kernel name) keep the last such kernel (in file order);
4. choose the (stream, kernel name) whose duration, normalised by the mean iteration time, has the largest mean
   over iterations of its standard deviation across ranks;
5. metric = normalised start time (ts − ``t_min``) / mean iteration time of those kernels;
6. per iteration flag the ranks whose metric is ≥ the ``num_candidates``-th largest; the candidates are the
   ``num_candidates`` ranks flagged most often.

*HTA:* step 2 keeps only names that start with ``ncclKernel``, so newer NCCL's ``ncclDevKernel_*`` never counts
(HTA's breakdown does count it as communication). Ties in the final count are broken by the lower rank (HTA's sort
leaves them in an order that is not specified). With one rank there is no spread across ranks (HTA fails on the
NaN); we then choose the first (stream, name) in sorted order, and the rank is trivially the candidate. Where an
iteration has fewer ranks than ``num_candidates``, all of them are flagged (HTA raises an IndexError).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from gpufleet.diagnose.gpu_time import hta_window
from gpufleet.errors import DiagnoseError

__all__ = ["LateStart", "late_start_stragglers", "profiler_steps"]

_STEP_RE = r"^ProfilerStep\s*#\s*(\d+)"


@dataclass
class LateStart:
    """Result of :func:`late_start_stragglers`."""

    candidates: list[int]  # the potential stragglers, most often flagged first
    counts: pl.DataFrame  # rank, flagged: in how many iterations the rank was among the latest starters
    metric: pl.DataFrame  # rank, iteration, ts_ns, dur_ns, normalized_start, normalized_duration, flagged
    stream: int  # the stream of the dominant collective
    kernel: str  # its kernel name
    iterations: list[int]  # the ProfilerStep numbers analysed
    mean_iteration_ns: float


def profiler_steps(events: pl.DataFrame, *, include_last_step: bool = False) -> list[int]:
    """The ``ProfilerStep#N`` numbers present in HTA's window (all steps but the last one, by default)."""
    window = events if "is_gpu" in events.columns else hta_window(events, include_last_step=include_last_step)
    numbers = window.filter(~pl.col("is_gpu"))["name"].str.extract(_STEP_RE, 1).drop_nulls().cast(pl.Int64)
    return sorted(n for n in numbers.unique().to_list() if n != -1)


def late_start_stragglers(
    events: pl.DataFrame,
    num_candidates: int = 2,
    *,
    steps: list[int] | None = None,
    include_last_step: bool = False,
    min_normalized_duration: float = 0.01,
) -> LateStart:
    """The ``num_candidates`` ranks that most often start the dominant collective latest (HTA's algorithm)."""
    num_candidates = max(1, num_candidates)
    window = events if "is_gpu" in events.columns else hta_window(events, include_last_step=include_last_step)
    available = profiler_steps(window)
    chosen = available if steps is None else [s for s in steps if s in available]
    if not chosen:
        raise DiagnoseError(
            f"late-start stragglers: no usable ProfilerStep iterations (asked {steps}, available {available}); "
            "profile at least two steps with torch.profiler's schedule and prof.step()"
        )
    sel = window.filter(pl.col("iteration").is_in(chosen))
    n_iters = sel["iteration"].n_unique()
    t_min = sel["ts_ns"].min()
    mean_iter = (sel["end_ns"].max() - t_min) / float(n_iters)
    long_comm = sel.filter(
        pl.col("is_gpu")
        & (pl.col("stream") > 0)
        & (pl.col("iteration") > 0)
        & (pl.col("dur_ns") >= mean_iter * min_normalized_duration)
        & pl.col("name").str.starts_with("ncclKernel")
    )
    if long_comm.height == 0:
        raise DiagnoseError(
            f"late-start stragglers: no ncclKernel_* lasting ≥ {min_normalized_duration:.0%} of an iteration in "
            f"steps {chosen}; the traces hold no significant NCCL collective to compare"
        )
    last = (
        long_comm.sort("order")
        .group_by("rank", "stream", "iteration", "name")
        .agg(pl.col("ts_ns").last(), pl.col("dur_ns").last())
        .with_columns(
            ((pl.col("ts_ns") - t_min) / mean_iter).alias("normalized_start"),
            (pl.col("dur_ns") / mean_iter).alias("normalized_duration"),
        )
    )
    spread = (
        last.group_by("stream", "iteration", "name")
        .agg(pl.col("normalized_duration").std(ddof=1).alias("std"))
        .group_by("stream", "name")
        .agg(pl.col("std").mean().fill_null(0.0).fill_nan(0.0))
        .sort(["std", "stream", "name"], descending=[True, False, False])
    )
    stream, kernel = spread.row(0)[:2]
    metric = last.filter((pl.col("stream") == stream) & (pl.col("name") == kernel)).sort("iteration", "rank")
    threshold = (
        pl.col("normalized_start")
        .sort(descending=True)
        .get(pl.min_horizontal(pl.len(), pl.lit(num_candidates)) - 1)
        .over("iteration")
    )
    metric = metric.with_columns((pl.col("normalized_start") >= threshold).alias("flagged"))
    counts = (
        metric.group_by("rank")
        .agg(pl.col("flagged").sum().alias("flagged"))
        .sort(["flagged", "rank"], descending=[True, False])
    )
    return LateStart(
        candidates=counts["rank"].head(num_candidates).to_list(),
        counts=counts,
        metric=metric.select(
            "rank", "iteration", "ts_ns", "dur_ns", "normalized_start", "normalized_duration", "flagged"
        ),
        stream=int(stream),
        kernel=str(kernel),
        iterations=chosen,
        mean_iteration_ns=float(mean_iter),
    )
