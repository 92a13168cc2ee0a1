"""One analyzer object over a folder of per-rank traces, one method per question (as HTA's TraceAnalysis).

>>> a = TraceAnalyzer("traces/")            # doctest: +SKIP
>>> a.diagnose().findings[0].headline()      # doctest: +SKIP
'rank 2: compute in aten::mm costs 31.2 ms/step'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from gpufleet.diagnose.findings import Finding, merge_findings
from gpufleet.diagnose.kineto import TraceSet, read_folder
from gpufleet.diagnose.localize import LOCALISERS, LocaliserContext, Thresholds, default_localisers
from gpufleet.diagnose.summary import Timelines, build_timelines, call_sites, function_summary, per_step_functions
from gpufleet.errors import DiagnoseError

__all__ = ["Diagnosis", "TraceAnalyzer", "default_localisers"]


@dataclass
class Diagnosis:
    """Findings ranked by time lost (alarming first), with the context a report needs."""

    findings: list[Finding]
    ranks: list[int]
    missing_ranks: list[int]
    world_size: int | None
    step_s_median: float
    steps_per_rank: dict[int, int]
    notes: list[str] = field(default_factory=list)

    @property
    def alarms(self) -> list[Finding]:
        """The findings above the alarm thresholds."""
        return [f for f in self.findings if f.alarm]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: findings first."""
        return {
            "findings": [f.to_dict() for f in self.findings],
            "ranks": self.ranks,
            "missing_ranks": self.missing_ranks,
            "world_size": self.world_size,
            "step_s_median": round(self.step_s_median, 6),
            "steps_per_rank": {str(k): v for k, v in self.steps_per_rank.items()},
            "notes": self.notes,
        }


class TraceAnalyzer:
    """Loads the traces of one job once; each method answers one question about them."""

    def __init__(self, source: str | Path | TraceSet, thresholds: Thresholds | None = None) -> None:
        self.traces = source if isinstance(source, TraceSet) else read_folder(source)
        self.thresholds = thresholds or Thresholds()

    @cached_property
    def timelines(self) -> Timelines:
        """Steps, host-op nesting and device steps of every rank."""
        return build_timelines(self.traces.events)

    @cached_property
    def per_step(self) -> pl.DataFrame:
        """Per (rank, step, domain, category, function): calls, own seconds and seconds waiting on others."""
        return per_step_functions(self.timelines)

    @cached_property
    def call_sites(self) -> pl.DataFrame:
        """Per (rank, domain, category, function, site): median own seconds of one call site over the steps."""
        return call_sites(self.timelines, self.thresholds.site_quantile)

    def function_summary(self) -> pl.DataFrame:
        """Per (rank, function): counts, duration statistics and share of step time."""
        return function_summary(self.timelines)

    def step_times(self) -> pl.DataFrame:
        """Per (rank, step): step duration in seconds."""
        return self.timelines.spans.select("rank", "step", (pl.col("dur_ns") / 1e9).alias("step_s"))

    def category_time(self) -> pl.DataFrame:
        """Per (rank, domain, category): mean seconds per step (the heat map of the report)."""
        n = self.timelines.spans.group_by("rank").agg(pl.len().alias("steps"))
        return (
            self.per_step.group_by("rank", "domain", "category")
            .agg(pl.col("time_s").sum())
            .join(n, on="rank")
            .with_columns((pl.col("time_s") / pl.col("steps")).alias("s_per_step"))
            .drop("steps")
            .sort("rank", "domain", "category")
        )

    def diagnose(self, localisers: Sequence[str] | None = None) -> Diagnosis:
        """Run the localisers (None: every default one, in run order) and rank their findings by time lost per step."""
        localisers = default_localisers() if localisers is None else localisers
        unknown = [name for name in localisers if name not in LOCALISERS]
        if unknown:
            known = ", ".join(LOCALISERS.names())
            raise DiagnoseError(f"unknown localiser(s) {', '.join(unknown)}; choose from {known}")
        ctx = LocaliserContext(
            steps=self.per_step,
            spans=self.timelines.spans,
            sites=self.call_sites,
            thresholds=self.thresholds,
            host=self.timelines.host,
            device=self.timelines.device,
        )
        found: list[Finding] = []
        for name in localisers:
            found.extend(LOCALISERS[name]().find(ctx))
        notes = []
        if self.traces.missing_ranks:
            shown = ", ".join(map(str, self.traces.missing_ranks[:16]))
            more = len(self.traces.missing_ranks) - 16
            notes.append(
                f"no trace for rank(s) {shown}{f' and {more} more' if more > 0 else ''} "
                f"(world size {self.traces.world_size})"
            )
        if self.traces.skipped:
            notes.append(
                f"skipped {len(self.traces.skipped)} JSON file(s) that are not traces: "
                + ", ".join(p.name for p in self.traces.skipped[:5])
            )
        if ctx.n_ranks < 3:
            notes.append("cross-rank comparison needs at least 3 ranks; only pattern rules and per-rank checks ran")
        steps = self.timelines.spans.group_by("rank").agg(pl.len()).sort("rank")
        return Diagnosis(
            findings=merge_findings(found),
            ranks=self.traces.ranks,
            missing_ranks=self.traces.missing_ranks,
            world_size=self.traces.world_size,
            step_s_median=ctx.step_s,
            steps_per_rank=dict(zip(steps["rank"].to_list(), steps["len"].to_list(), strict=True)),
            notes=notes,
        )
