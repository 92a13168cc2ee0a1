"""Functions one rank calls more often than the others (``extra-calls``).

A needless sync is judged by its count, not its traced cost. On a GPU each ``.item()`` drains the launch queue: the
device idles until the host launches again, a loss the host trace does not show (on CPU it costs microseconds). A
rank that makes more syncs than every other rank in nearly every step runs a different code path -- the evidence
is the count and its steadiness, whatever the calls cost in the trace.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from gpufleet.diagnose.categories import SYNC
from gpufleet.diagnose.findings import Finding
from gpufleet.diagnose.localize import Localiser, LocaliserContext, alarm, localiser


def extra_call_steps(steps: pl.DataFrame, rank: int, domain: str, function: str) -> float:
    """Share of steps in which ``rank`` calls ``function`` more often than every other rank does in that step."""
    rows = steps.filter((pl.col("domain") == domain) & (pl.col("function") == function))
    per = rows.group_by("rank", "step").agg(pl.col("calls").sum())
    wide = per.pivot(on="rank", index="step", values="calls").fill_null(0)
    key = str(rank)
    others = [c for c in wide.columns if c not in ("step", key)]
    if key not in wide.columns or not others or wide.height == 0:
        return 0.0
    return float(np.mean(wide[key].to_numpy() > wide.select(others).to_numpy().max(axis=1)))


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
            category = (
                SYNC if syncs.height else group.sort(["time_s", "function"], descending=[True, False])["category"][0]
            )
            pool = syncs if syncs.height else group  # ties in calls (.item() and its child) go by name: same every run
            lead = pool.sort(["calls", "function"], descending=[True, False]).row(0, named=True)
            n_others = max(int(ctx.n_ranks) - 1, 1)
            score = float(min(lead["calls"] - lead["median_calls"], 100.0) * np.sqrt(n_others))
            steady = extra_call_steps(ctx.steps, int(rank), lead["domain"], lead["function"])
            if category == SYNC:  # its count is the evidence: extra syncs in three steps of four (as call sites)
                alarmed = score >= ctx.thresholds.z and steady >= 1.0 - ctx.thresholds.site_quantile
            else:
                alarmed = alarm(score, cost, ctx, category)
            findings.append(
                Finding(
                    rank=int(rank),
                    function=lead["function"],
                    category=category,
                    cost_s_per_step=cost,
                    score=score,
                    evidence={
                        "steps_with_extra_calls": round(steady, 3),
                        "extra_functions": [
                            {
                                "function": r["function"],
                                "category": r["category"],
                                "calls_per_step": round(r["calls"], 2),
                                "median_calls_per_step": round(r["median_calls"], 2),
                                "excess_s_per_step": round(r["time_s"] - r["median_time"], 6),
                            }
                            for r in group.sort(["time_s", "function"], descending=[True, False])
                            .head(6)
                            .iter_rows(named=True)
                        ],
                    },
                    localiser=self.name,
                    alarm=alarmed,
                    weight=1.0 / ctx.thresholds.sync_cost_factor if category == SYNC else 1.0,
                )
            )
        return findings
