"""Compare two runs of the same job: which functions and kernels were added, removed, got slower or faster.

``gpufleet diagnose diff CONTROL/ TEST/`` answers "why is today's run slower than yesterday's?". Per function
(host op or annotation, by name) and per kernel it gives calls and time per step in both runs, as HTA's
``TraceDiff.compare_traces`` counts them: every complete event of a step, its whole duration (host events by the
step their start falls in, device events by the step of the runtime call that launched them). Those totals count a
nested op inside its parent too, so they cannot say which differences add up to the step-time change. Self times
on the training thread can: they tile the step exactly (:mod:`gpufleet.diagnose.summary`), so their per-function
deltas sum to the change of the mean step, and the largest of them *explain* it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from gpufleet.diagnose.kineto import TraceSet, read_folder
from gpufleet.diagnose.summary import build_timelines, per_step_functions
from gpufleet.diagnose.timeline import DEVICE_CATS, step_spans
from gpufleet.errors import DiagnoseError

__all__ = ["TraceDiff", "diff_runs", "op_totals"]

#: the explanation's one row for every blocking wait on the training thread
WAITING = "<waiting for other ranks or the device>"
#: a function whose time per step moved by less than this share of its control time (and 1 µs) is unchanged
SAME_SHARE = 0.02
#: the explaining differences: the largest self-time deltas that together reach this share of the step change
EXPLAINED_SHARE = 0.9


def _steps_of(frame: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with a ``step`` column: the span of its rank that contains its start (null when none)."""
    starts = spans.select("rank", "step", "start_ns", "end_ns").sort("start_ns")
    out = frame.sort("ts_ns").join_asof(
        starts, left_on="ts_ns", right_on="start_ns", by="rank", strategy="backward", check_sortedness=False
    )
    return out.with_columns(pl.when(pl.col("ts_ns") < pl.col("end_ns")).then(pl.col("step")).alias("step")).drop(
        "start_ns", "end_ns"
    )


def op_totals(events: pl.DataFrame, spans: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per (rank, step, device, function): calls and total duration in ns, counted as HTA's TraceDiff counts them.

    Every complete event with a duration counts (``ProfilerStep#N`` itself included): host events in the step
    whose span holds their start; kernels, copies and memsets (events on a stream) in the step of the runtime
    call with their correlation id. Events in no step are left out.
    """
    spans = step_spans(events) if spans is None else spans
    done = events.filter((pl.col("ph") == "X") & pl.col("dur_ns").is_not_null() & (pl.col("cat") != "Trace"))
    on_stream = pl.col("cat").is_in(list(DEVICE_CATS)) | (pl.col("stream").fill_null(-1) > 0)
    host = _steps_of(done.filter(~on_stream).select("rank", "name", "ts_ns", "dur_ns"), spans)
    launches = _steps_of(
        done.filter(~on_stream & pl.col("correlation").is_not_null()).select("rank", "correlation", "ts_ns"),
        spans,
    ).select("rank", "correlation", pl.col("step").alias("launch_step"))
    device = (
        done.filter(on_stream)
        .select("rank", "name", "ts_ns", "dur_ns", "correlation")
        .join(launches.unique(["rank", "correlation"]), on=["rank", "correlation"], how="left")
        .select("rank", "name", "ts_ns", "dur_ns", pl.col("launch_step").alias("step"))
    )
    both = pl.concat(
        [host.with_columns(pl.lit(False).alias("device")), device.with_columns(pl.lit(True).alias("device"))],
        how="diagonal_relaxed",
    )
    return (
        both.filter(pl.col("step").is_not_null())
        .group_by("rank", "step", "device", pl.col("name").alias("function"))
        .agg(pl.len().alias("calls"), pl.col("dur_ns").sum().alias("total_ns"))
        .sort("rank", "step", "device", "function")
    )


@dataclass
class TraceDiff:
    """Two runs compared: per-function figures, the differences that explain the step change, and the step times.

    ``ops``: per (device, function): calls and seconds per step in each run (HTA's totals, averaged over every
    rank's steps), ``delta_s_per_step`` (test - control) and ``change`` (added, removed, slower, faster, same),
    ranked by time gained in the test run. ``explain``: per (category, function), self seconds per step on the
    training thread in each run, their delta, its share of the step change, and ``explains`` for the few that
    together account for it.
    """

    ops: pl.DataFrame
    explain: pl.DataFrame
    control_step_s: float
    test_step_s: float
    control_steps: int
    test_steps: int
    notes: list[str] = field(default_factory=list)

    @property
    def step_change_s(self) -> float:
        """Test minus control mean step, in seconds."""
        return self.test_step_s - self.control_step_s

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """JSON-ready summary; ``top`` limits the op rows."""
        ops = self.ops if top is None else self.ops.head(top)
        return {
            "control_step_s": round(self.control_step_s, 6),
            "test_step_s": round(self.test_step_s, 6),
            "step_change_s": round(self.step_change_s, 6),
            "control_steps": self.control_steps,
            "test_steps": self.test_steps,
            "explained_by": self.explain.filter(pl.col("explains")).to_dicts(),
            "ops": ops.to_dicts(),
            "notes": self.notes,
        }


def _load(source: str | Path | TraceSet) -> TraceSet:
    return source if isinstance(source, TraceSet) else read_folder(source)


def _per_step_ops(traces: TraceSet) -> tuple[pl.DataFrame, int]:
    """Per (device, function): calls and seconds per rank-step; and how many rank-steps there are."""
    spans = step_spans(traces.events)
    n = max(spans.height, 1)
    ops = (
        op_totals(traces.events, spans)
        .with_columns(pl.col("function").str.replace(r"^ProfilerStep#\d+$", "ProfilerStep#*"))  # one row: the step
        .group_by("device", "function")
        .agg((pl.col("calls").sum() / n).alias("calls"), (pl.col("total_ns").sum() / 1e9 / n).alias("s"))
    )
    return ops, spans.height


def _self_times(traces: TraceSet) -> tuple[pl.DataFrame, float]:
    """Per (category, function): self seconds per rank-step on the training thread; and the mean step in seconds."""
    timelines = build_timelines(traces.events)
    steps = per_step_functions(timelines).filter(pl.col("domain") == "host")
    n = max(timelines.spans.height, 1)
    own = steps.group_by("category", "function").agg((pl.col("time_s").sum() / n).alias("s"))
    # waiting (blocking collectives, syncs) is the effect of another rank's or the device's time, not a cause: one row
    waiting = pl.DataFrame({"category": ["wait"], "function": [WAITING], "s": [float(steps["wait_s"].sum()) / n]})
    return pl.concat([own, waiting]), float(timelines.spans["dur_ns"].mean() or 0.0) / 1e9


def _change(control: pl.Expr, test: pl.Expr, c_calls: pl.Expr, t_calls: pl.Expr) -> pl.Expr:
    delta = test - control
    same = delta.abs() < pl.max_horizontal(SAME_SHARE * control, pl.lit(1e-6))
    return (
        pl.when(c_calls == 0)
        .then(pl.lit("added"))
        .when(t_calls == 0)
        .then(pl.lit("removed"))
        .when(same)
        .then(pl.lit("same"))
        .when(delta > 0)
        .then(pl.lit("slower"))
        .otherwise(pl.lit("faster"))
    )


def diff_runs(control: str | Path | TraceSet, test: str | Path | TraceSet) -> TraceDiff:
    """Compare the traces of a control run with those of a test run of the same job (see the module docstring)."""
    c_traces, t_traces = _load(control), _load(test)
    (c_ops, c_n), (t_ops, t_n) = _per_step_ops(c_traces), _per_step_ops(t_traces)
    if c_n == 0 or t_n == 0:
        raise DiagnoseError(f"diagnose diff: {'CONTROL' if c_n == 0 else 'TEST'} holds no step of any rank")
    keys = ["device", "function"]
    ops = (
        c_ops.rename({"calls": "control_calls_per_step", "s": "control_s_per_step"})
        .join(
            t_ops.rename({"calls": "test_calls_per_step", "s": "test_s_per_step"}), on=keys, how="full", coalesce=True
        )
        .fill_null(0.0)
        .with_columns((pl.col("test_s_per_step") - pl.col("control_s_per_step")).alias("delta_s_per_step"))
    )
    ops = ops.with_columns(
        _change(
            pl.col("control_s_per_step"),
            pl.col("test_s_per_step"),
            pl.col("control_calls_per_step"),
            pl.col("test_calls_per_step"),
        ).alias("change")
    ).sort(["delta_s_per_step", "function"], descending=[True, False])
    (c_self, c_step), (t_self, t_step) = _self_times(c_traces), _self_times(t_traces)
    explain = (
        c_self.rename({"s": "control_self_s_per_step"})
        .join(t_self.rename({"s": "test_self_s_per_step"}), on=["category", "function"], how="full", coalesce=True)
        .fill_null(0.0)
        .with_columns((pl.col("test_self_s_per_step") - pl.col("control_self_s_per_step")).alias("delta_s_per_step"))
    )
    change = t_step - c_step
    sign = 1.0 if change >= 0 else -1.0
    explain = explain.with_columns(
        (pl.col("delta_s_per_step") / change if change else pl.lit(0.0)).alias("share_of_step_change")
    ).sort(pl.col("delta_s_per_step") * -sign)
    cum = (explain["delta_s_per_step"] * sign).cum_sum()
    before = pl.concat([pl.Series([0.0]), cum.head(explain.height - 1)]) if explain.height else cum
    explains = (before < EXPLAINED_SHARE * abs(change)) & (explain["delta_s_per_step"] * sign > 0)
    explain = explain.with_columns(pl.Series("explains", explains if change else [False] * explain.height))
    notes = []
    if set(c_traces.ranks) != set(t_traces.ranks):
        notes.append(f"the runs hold different ranks: control {c_traces.ranks}, test {t_traces.ranks}")
    return TraceDiff(ops, explain, c_step, t_step, c_n, t_n, notes)
