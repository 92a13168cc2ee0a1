"""Functions one rank calls more often than the others (``extra-calls``)."""

from __future__ import annotations

import numpy as np
import polars as pl

from gpufleet.diagnose.categories import SYNC
from gpufleet.diagnose.findings import Finding
from gpufleet.diagnose.localize import Localiser, LocaliserContext, alarm, localiser


@localiser("extra-calls")
class ExtraCalls(Localiser):
    """Functions one rank calls more often than the others; a sync among them names the finding ``sync``."""

    order = 20

    def find(self, ctx: LocaliserContext) -> list[Finding]:
        if ctx.n_ranks < 2:
            return []
        per_fn = ctx.steps.group_by("rank", "domain", "category", "function").agg(
            pl.col("calls").mean(), (pl.col("time_s") + pl.col("wait_s")).mean().alias("time_s")
        )
        per_fn = per_fn.with_columns(
            pl.col("calls").median().over("domain", "category", "function").alias("median_calls"),
            pl.col("time_s").median().over("domain", "category", "function").alias("median_time"),
        )
        extra = per_fn.filter(
            pl.col("calls") >= pl.col("median_calls") + pl.max_horizontal(pl.lit(1.0), 0.5 * pl.col("median_calls"))
        )
        findings = []
        for (rank,), group in extra.group_by("rank"):
            cost = float((group["time_s"] - group["median_time"]).clip(lower_bound=0).sum())
            syncs = group.filter(pl.col("category") == SYNC)
            category = SYNC if syncs.height else group.sort("time_s", descending=True)["category"][0]
            lead = (syncs if syncs.height else group).sort("calls", descending=True).row(0, named=True)
            n_others = max(int(ctx.n_ranks) - 1, 1)
            score = float(min(lead["calls"] - lead["median_calls"], 100.0) * np.sqrt(n_others))
            findings.append(
                Finding(
                    rank=int(rank),
                    function=lead["function"],
                    category=category,
                    cost_s_per_step=cost,
                    score=score,
                    evidence={
                        "extra_functions": [
                            {
                                "function": r["function"],
                                "category": r["category"],
                                "calls_per_step": round(r["calls"], 2),
                                "median_calls_per_step": round(r["median_calls"], 2),
                                "excess_s_per_step": round(r["time_s"] - r["median_time"], 6),
                            }
                            for r in group.sort("time_s", descending=True).head(6).iter_rows(named=True)
                        ],
                    },
                    localiser=self.name,
                    alarm=alarm(score, cost, ctx, category),
                    weight=1.0 / ctx.thresholds.sync_cost_factor if category == SYNC else 1.0,
                )
            )
        return findings
