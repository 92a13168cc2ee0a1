"""A rank with more host time outside every op than the others, at one place in the step (``untraced``).

An input pipeline the DataLoader does not wrap, a Python pause after the optimizer, a blocking call no event marks:
the trace shows only a gap on the training thread. Gaps also hold the *other* ranks' waiting where no collective
is traced (DDP's reducer on gloo), so their total says nothing; their position does. Per position
(:func:`gpufleet.diagnose.summary.untraced_gaps`: step start, after an op, step end) each rank's steady gap time is
compared with the other ranks'; a rank's excess there is its own work when the others wait for it elsewhere.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from gpufleet.diagnose.findings import Finding
from gpufleet.diagnose.localize import (
    Localiser,
    LocaliserContext,
    alarm,
    localiser,
    rank_excesses,
    steady_share,
)
from gpufleet.diagnose.localizers.cross_rank import delays_others
from gpufleet.diagnose.summary import STEP_END, STEP_START, UNTRACED
from gpufleet.diagnose.victims import Slack

_POSITIONS = {STEP_START: "before the step's first op", STEP_END: "after the step's last op"}


def _position(function: str) -> str:
    """Where a gap falls, in words."""
    return _POSITIONS.get(function) or "between ops, " + function.removeprefix(UNTRACED).rstrip(">")


@localiser("untraced")
class Untraced(Localiser):
    """Host time outside every op, at one position of the step, above the other ranks' there (and they wait)."""

    order = 15

    def find(self, ctx: LocaliserContext) -> list[Finding]:
        if ctx.n_ranks < 3 or ctx.sites is None:
            return []
        ranks = sorted(ctx.spans["rank"].unique().to_list())
        gaps = ctx.sites.filter((pl.col("domain") == "host") & pl.col("function").str.starts_with(UNTRACED))
        if gaps.is_empty():
            return []
        steady = gaps.group_by("rank", "category", "function").agg(pl.col("time_s").sum())
        floor = ctx.thresholds.noise_share * ctx.step_s
        slack = Slack(ctx.steps, ctx.spans)
        findings = []
        for (category, function), group in steady.group_by("category", "function"):
            mine = dict(zip(group["rank"].to_list(), group["time_s"].to_list(), strict=True))
            values = np.array([mine.get(r, 0.0) for r in ranks])
            for hit in rank_excesses(values, floor):
                rank, cost, score = ranks[hit.index], hit.cost, hit.score
                victims = slack.evidence(rank, exclude=pl.col("function") == function)
                step_rows = ctx.steps.filter((pl.col("domain") == "host") & (pl.col("function") == function))
                steady = steady_share(step_rows, rank, cost)
                findings.append(
                    Finding(
                        rank=rank,
                        function=function,
                        category=str(category),
                        cost_s_per_step=cost,
                        score=score,
                        evidence={
                            "position": _position(str(function)),
                            "steps_with_excess": round(steady, 3),
                            "this_rank_s_per_step": round(hit.value, 6),
                            "median_rank_s_per_step": round(hit.others, 6),
                            **victims,
                        },
                        localiser=self.name,
                        alarm=alarm(score, cost, ctx)
                        and delays_others(victims["others_slack_s_per_step"], cost, ctx, score),
                    )
                )
        return findings
