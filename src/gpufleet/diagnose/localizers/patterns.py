"""Expected patterns every rank shares: data loading or exposed communication dominating (``patterns``)."""

from __future__ import annotations

import polars as pl

from gpufleet.diagnose.categories import COMMUNICATION, DATA_LOADING
from gpufleet.diagnose.findings import Finding
from gpufleet.diagnose.localize import Localiser, LocaliserContext, localiser


@localiser("patterns")
class ExpectedPatterns(Localiser):
    """Problems every rank shares: data loading or exposed communication dominating the step."""

    order = 40

    def find(self, ctx: LocaliserContext) -> list[Finding]:
        step_s = ctx.step_s
        if step_s <= 0:
            return []
        host = ctx.steps.filter(pl.col("domain") == "host")
        per_rank = (
            host.group_by("rank", "step", "category")
            .agg(pl.col("time_s").sum())
            .group_by("rank", "category")
            .agg(pl.col("time_s").mean())
        )
        findings = []
        rules = ((DATA_LOADING, ctx.thresholds.data_share), (COMMUNICATION, ctx.thresholds.comm_share))
        for category, limit in rules:
            shared = per_rank.filter(pl.col("category") == category)["time_s"]
            if shared.len() < ctx.n_ranks or shared.len() == 0:
                continue
            floor_s = float(shared.min())  # what even the fastest rank spends: shared by all
            share = floor_s / step_s
            score = ctx.thresholds.z * share / limit
            top = (
                host.filter(pl.col("category") == category)
                .group_by("function")
                .agg(pl.col("time_s").mean())
                .sort(["time_s", "function"], descending=[True, False])
            )
            findings.append(
                Finding(
                    rank=None,
                    function=top["function"][0] if top.height else category,
                    category=category,
                    cost_s_per_step=floor_s,
                    score=score,
                    evidence={"share_of_step_on_every_rank": round(share, 4), "rule_threshold_share": limit},
                    localiser=self.name,
                    alarm=share >= limit,
                )
            )
        return findings
