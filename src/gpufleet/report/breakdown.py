"""Per-group job statistics (by virtual cluster or by job size) of one run's job frame.

Shared by the HTML report and the CLI, so both show the same numbers.
"""

from __future__ import annotations

from typing import Literal

import polars as pl

__all__ = ["BREAKDOWN_COLUMNS", "SIZE_BUCKETS", "breakdown"]

#: Columns of the frame that :func:`breakdown` returns.
BREAKDOWN_COLUMNS = ("group", "jobs", "avg_jct_s", "avg_queue_s", "p95_jct_s")

#: Job-size buckets by ``num_gpus``: (label, lowest, highest), inclusive. Jobs with fewer than one
#: GPU count as "1"; the last bucket is open-ended.
SIZE_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("1", 0, 1),
    ("2-4", 2, 4),
    ("5-8", 5, 8),
    ("9-32", 9, 32),
    ("33+", 33, None),
)

#: Label of jobs whose ``vc`` is missing.
NO_VC = "(none)"


def _size_label() -> pl.Expr:
    n = pl.col("num_gpus")
    (first, _, first_high), *middle, (last, _, _) = SIZE_BUCKETS
    chain = pl.when(n <= first_high).then(pl.lit(first))
    for label, _, high in middle:
        chain = chain.when(n <= high).then(pl.lit(label))
    return chain.otherwise(pl.lit(last))


def _finite(name: str) -> pl.Expr:
    col = pl.col(name).cast(pl.Float64)
    return col.filter(col.is_finite())


def breakdown(jobs: pl.DataFrame, by: Literal["vc", "size"]) -> pl.DataFrame:
    """Group ``jobs`` (a ``SimResult.jobs`` frame) by ``vc`` or by GPU-count bucket and summarise.

    Returns one row per non-empty group with columns ``group`` (str), ``jobs`` (all jobs of the group,
    finished or not), ``avg_jct_s``, ``avg_queue_s`` and ``p95_jct_s`` (over jobs with a finite value,
    so unfinished jobs are left out; null when a group has none). VC rows are sorted by name, with
    missing VCs as ``"(none)"`` last; size rows follow :data:`SIZE_BUCKETS`.
    """
    if by == "vc":
        needed = ("vc", "jct_s", "queue_s")
        key = pl.col("vc").cast(pl.String).fill_null(NO_VC)
    elif by == "size":
        needed = ("num_gpus", "jct_s", "queue_s")
        key = _size_label()
    else:
        raise ValueError(f"breakdown: by must be 'vc' or 'size', got {by!r}")
    missing = [c for c in needed if c not in jobs.columns]
    if missing:
        raise ValueError(f"breakdown by {by}: the jobs frame lacks column(s) {missing}")

    out = (
        jobs.lazy()
        .group_by(key.alias("group"))
        .agg(
            pl.len().cast(pl.Int64).alias("jobs"),
            _finite("jct_s").mean().alias("avg_jct_s"),
            _finite("queue_s").mean().alias("avg_queue_s"),
            _finite("jct_s").quantile(0.95, interpolation="linear").alias("p95_jct_s"),
        )
        .collect()
    )
    if by == "size":
        order = {label: i for i, (label, _, _) in enumerate(SIZE_BUCKETS)}
    else:
        names = sorted(g for g in out["group"].to_list() if g != NO_VC)
        order = {g: i for i, g in enumerate([*names, NO_VC])}
    rank = pl.col("group").replace_strict(order, return_dtype=pl.Int64)
    return out.sort(rank).select(
        pl.col("group").cast(pl.String),
        "jobs",
        *(pl.col(c).cast(pl.Float64) for c in BREAKDOWN_COLUMNS[2:]),
    )
