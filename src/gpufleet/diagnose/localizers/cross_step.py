"""A rank's own steps against its median step: periodic long host pauses (``cross-step``)."""

from __future__ import annotations

import numpy as np
import polars as pl

from gpufleet.diagnose.categories import CPU_STALL, DATA_LOADING
from gpufleet.diagnose.findings import Finding
from gpufleet.diagnose.localize import Localiser, LocaliserContext, alarm, localiser, robust_z
from gpufleet.diagnose.summary import UNTRACED


@localiser("cross-step")
class CrossStep(Localiser):
    """Long pauses in some steps of a rank: host time outside ops, or the input pipeline, far above its median step."""

    order = 30

    def find(self, ctx: LocaliserContext) -> list[Finding]:
        # every untraced host moment: a pause in some steps is a stall wherever it falls (a steady gap before the
        # first op, every step, is the input pipeline's: the ``untraced`` localiser's)
        untraced = (pl.col("category") == CPU_STALL) | pl.col("function").str.starts_with(UNTRACED)
        # a loader with worker processes falls behind in bursts: the prefetched batches hide it in the other steps
        loader = (pl.col("category") == DATA_LOADING) & ~pl.col("function").str.starts_with(UNTRACED)
        return self._pauses(ctx, untraced, CPU_STALL) + self._pauses(ctx, loader, DATA_LOADING)

    def _pauses(self, ctx: LocaliserContext, rows: pl.Expr, category: str) -> list[Finding]:
        host = ctx.steps.filter(rows & (pl.col("domain") == "host"))
        stall = host.group_by("rank", "step").agg(pl.col("time_s").sum())
        findings = []
        spiky_ranks: set[int] = set()
        shared_only: list[int] = []
        for (rank,), group in stall.group_by("rank"):
            t = group.sort("step")["time_s"].to_numpy()
            if len(t) < 3:
                continue
            med = float(np.median(t))
            floor = ctx.thresholds.noise_share * ctx.step_s
            own = max(ctx.thresholds.pause_ratio * med, med + 5 * floor)
            spikes = t > own
            if spikes.sum() < 2:
                continue
            spiky_ranks.add(int(rank))
            others = stall.filter(pl.col("rank") != rank)["time_s"]
            # a pause of this rank alone must stand above everything the other ranks ever show (noise)
            alone = t > max(own, float(others.max()) if others.len() else 0.0)
            if alone.sum() >= 2:
                spikes = alone
            else:
                shared_only.append(int(rank))
            cost = float((t[spikes] - med).sum() / len(t))
            z = robust_z(t, floor)
            score = float(np.median(z[spikes]))
            steps = group.sort("step")["step"].to_numpy()[spikes]
            period = float(np.median(np.diff(steps))) if len(steps) > 1 else None
            function = "<untraced host time>"
            if category != CPU_STALL:
                mine = host.filter(pl.col("rank") == rank).group_by("function").agg(pl.col("time_s").sum())
                function = str(mine.sort("time_s", descending=True)["function"][0])
            findings.append(
                Finding(
                    rank=int(rank),
                    function=function,
                    category=category,
                    cost_s_per_step=cost,
                    score=score,
                    evidence={
                        "pause_steps": steps.tolist(),
                        "period_steps": period,
                        "median_pause_s": round(float(np.median(t[spikes])), 6),
                        "median_step_s": round(med, 6),
                    },
                    localiser=self.name,
                    alarm=alarm(score, cost, ctx),
                )
            )
        if len(spiky_ranks) < ctx.n_ranks:  # not every rank pauses: keep only the pauses that stand alone
            findings = [f for f in findings if f.rank not in shared_only]
        if findings and len(findings) == ctx.n_ranks >= 2:  # every rank pauses: one shared finding
            shared = min(findings, key=lambda f: f.cost_s_per_step)
            shared.rank = None
            shared.evidence["ranks"] = "all"
            return [shared]
        return findings
