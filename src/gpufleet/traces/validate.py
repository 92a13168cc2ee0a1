"""Bad-row policy: every row that cannot be a job is counted by reason, never silently dropped.

A row gets the first reason that applies (rules are checked in the order of ``REASONS``); the
loader keeps the valid rows and reports counts and a few example row numbers per reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from gpufleet.traces.canonical import RAW_PREFIX, ROW, raw_col
from gpufleet.traces.schema import KINDS

#: Row numbers kept per reason, to show the user where to look.
MAX_EXAMPLES = 5
_INT32_MAX = 2**31 - 1
_REASON = "__reason"

MISSING_JOB_ID = "missing job_id"
DUPLICATE_JOB_ID = "duplicate job_id"
MISSING_SUBMIT = "missing submit time"
BAD_SUBMIT = "unparsable submit time"
SUBMIT_NOT_FINITE = "submit_s is NaN or infinite"
SUBMIT_NEGATIVE = "submit_s < 0"
MISSING_DURATION = "missing duration_s"
BAD_DURATION = "unparsable duration_s"
DURATION_NOT_FINITE = "duration_s is NaN or infinite"
DURATION_NOT_POSITIVE = "duration_s <= 0"
MISSING_GPUS = "missing num_gpus"
BAD_GPUS = "unparsable num_gpus"
GPUS_NOT_FINITE = "num_gpus is NaN or infinite"
GPUS_NOT_POSITIVE = "num_gpus <= 0"
GPUS_NOT_WHOLE = "num_gpus is not a whole number"
GPUS_TOO_LARGE = f"num_gpus > {_INT32_MAX}"
BAD_KIND = "kind is not 'train' or 'inference'"

#: Every reason the loader can report, in the order rules are checked.
REASONS = (
    MISSING_JOB_ID,
    MISSING_SUBMIT,
    BAD_SUBMIT,
    SUBMIT_NOT_FINITE,
    SUBMIT_NEGATIVE,
    MISSING_DURATION,
    BAD_DURATION,
    DURATION_NOT_FINITE,
    DURATION_NOT_POSITIVE,
    MISSING_GPUS,
    BAD_GPUS,
    GPUS_NOT_FINITE,
    GPUS_NOT_POSITIVE,
    GPUS_NOT_WHOLE,
    GPUS_TOO_LARGE,
    BAD_KIND,
    DUPLICATE_JOB_ID,
)


@dataclass
class Validated:
    """Valid rows (canonical dtypes, source order) and the rejected ones summarised."""

    valid: pl.DataFrame
    rejected: dict[str, int] = field(default_factory=dict)
    rejected_examples: dict[str, list[int]] = field(default_factory=dict)


def _presence_rules(frame: pl.DataFrame, name: str, missing: str, bad: str) -> list[tuple[str, pl.Expr]]:
    """Missing (source empty) and unparsable (source present, parse failed) checks for one field."""
    raw = raw_col(name)
    if raw not in frame.columns:
        return [(missing, pl.col(name).is_null())]
    return [
        (missing, pl.col(raw).is_null()),
        (bad, pl.col(name).is_null()),
    ]


def _rules(frame: pl.DataFrame) -> list[tuple[str, pl.Expr]]:
    submit, duration, gpus = pl.col("submit_s"), pl.col("duration_s"), pl.col("num_gpus")
    rules = [(MISSING_JOB_ID, pl.col("job_id").is_null())]
    rules += _presence_rules(frame, "submit_s", MISSING_SUBMIT, BAD_SUBMIT)
    rules += [(SUBMIT_NOT_FINITE, ~submit.is_finite()), (SUBMIT_NEGATIVE, submit < 0)]
    rules += _presence_rules(frame, "duration_s", MISSING_DURATION, BAD_DURATION)
    rules += [(DURATION_NOT_FINITE, ~duration.is_finite()), (DURATION_NOT_POSITIVE, duration <= 0)]
    rules += _presence_rules(frame, "num_gpus", MISSING_GPUS, BAD_GPUS)
    rules += [
        (GPUS_NOT_FINITE, ~gpus.is_finite()),
        (GPUS_NOT_POSITIVE, gpus <= 0),
        (GPUS_NOT_WHOLE, gpus.floor() != gpus),
        (GPUS_TOO_LARGE, gpus > _INT32_MAX),
        (BAD_KIND, ~pl.col("kind").is_in(KINDS) | pl.col("kind").is_null()),
    ]
    return rules


def _reason_expr(frame: pl.DataFrame) -> pl.Expr:
    rules = _rules(frame)
    label, cond = rules[0]
    chain = pl.when(cond).then(pl.lit(label))
    for label, cond in rules[1:]:
        chain = chain.when(cond).then(pl.lit(label))
    return chain.otherwise(pl.lit(None, dtype=pl.String)).alias(_REASON)


def validate_jobs(frame: pl.DataFrame) -> Validated:
    """Split a parsed table into valid rows and per-reason counts of rejected rows.

    ``frame`` comes from :func:`gpufleet.traces.canonical.parse_table` (or any frame with the
    canonical columns, ``num_gpus`` as a float, and ``__row``).
    """
    if ROW not in frame.columns:
        frame = frame.with_row_index(ROW)
    frame = frame.with_columns(pl.col("num_gpus").cast(pl.Float64), _reason_expr(frame))
    ok = pl.col(_REASON).is_null()
    duplicate = ok & ~pl.col("job_id").is_first_distinct().over(ok)
    frame = frame.with_columns(
        pl.when(duplicate).then(pl.lit(DUPLICATE_JOB_ID)).otherwise(pl.col(_REASON)).alias(_REASON)
    )
    bad = (
        frame.filter(pl.col(_REASON).is_not_null())
        .group_by(_REASON)
        .agg(pl.len().alias("n"), pl.col(ROW).sort().head(MAX_EXAMPLES).alias("rows"))
        .sort(["n", _REASON], descending=[True, False])
    )
    rejected = {r: int(n) for r, n in zip(bad[_REASON], bad["n"], strict=True)}
    examples = {r: [int(x) for x in rows] for r, rows in zip(bad[_REASON], bad["rows"], strict=True)}
    drop = [c for c in frame.columns if c.startswith(RAW_PREFIX)] + [_REASON]
    valid = frame.filter(pl.col(_REASON).is_null()).drop(drop).with_columns(pl.col("num_gpus").cast(pl.Int32))
    return Validated(valid=valid, rejected=rejected, rejected_examples=examples)
