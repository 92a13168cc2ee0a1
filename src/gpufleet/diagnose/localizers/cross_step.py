"""A rank's own steps against its median step: periodic long host pauses (``cross-step``)."""

from __future__ import annotations

import numpy as np
import polars as pl

from gpufleet.diagnose.categories import CPU_STALL, DATA_LOADING
from gpufleet.diagnose.findings import Finding
from gpufleet.diagnose.localize import MAD_TO_SIGMA, Localiser, LocaliserContext, alarm, localiser
from gpufleet.diagnose.summary import UNTRACED
from gpufleet.diagnose.victims import Slack


def baseline(t: np.ndarray, floor: float, pause_ratio: float, others_max: float) -> tuple[float, float, np.ndarray]:
    """A rank's usual per-step time, its spread and its pause steps (times far above the usual).

    The usual time is the median over the steps, robust to pauses in fewer than half of them. A pause that comes
    every other step (a worker DataLoader that falls behind on alternate batches) fills half the steps, and the
    median sits among the pauses; so when the median finds none, the steps at or below it (the quiet half) are the
    baseline, and it is taken only if pauses of this rank alone (above anything the others show, ``others_max``) fill
    at least half of the steps -- the case the median cannot see.
    """

    def pauses(usual: np.ndarray) -> tuple[float, float, np.ndarray]:
        base = float(np.median(usual))
        scale = max(MAD_TO_SIGMA * float(np.median(np.abs(usual - base))), floor, 1e-12)
        return base, scale, t > max(pause_ratio * base, base + 5 * floor)

    base, scale, spikes = pauses(t)
    if spikes.sum() >= 2:
        return base, scale, spikes
    quiet = pauses(t[t <= np.median(t)])
    alone = quiet[2] & (t > others_max)
    return quiet if 2 * alone.sum() >= len(t) else (base, scale, spikes)


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
        slack = Slack(ctx.steps, ctx.spans)
        findings = []
        spiky_ranks: set[int] = set()
        shared_only: list[int] = []
        for (rank,), group in stall.group_by("rank"):
            t = group.sort("step")["time_s"].to_numpy()
            if len(t) < 3:
                continue
            floor = ctx.thresholds.noise_share * ctx.step_s
            others = stall.filter(pl.col("rank") != rank)["time_s"]
            others_max = float(others.max()) if others.len() else 0.0  # type: ignore[arg-type]
            med, scale, spikes = baseline(t, floor, ctx.thresholds.pause_ratio, others_max)
            own = max(ctx.thresholds.pause_ratio * med, med + 5 * floor)
            if spikes.sum() < 2:
                continue
            spiky_ranks.add(int(rank))
            # a pause of this rank alone must stand above everything the other ranks ever show (noise)
            alone = t > max(own, others_max)
            if alone.sum() >= 2:
                spikes = alone
            else:
                shared_only.append(int(rank))
            cost = float((t[spikes] - med).sum() / len(t))
            score = float(np.median((t[spikes] - med) / scale))
            steps = group.sort("step")["step"].to_numpy()[spikes]
            period = float(np.median(np.diff(steps))) if len(steps) > 1 else None
            # victims: in the pause steps the other ranks wait for it (its own untraced pause is its work)
            victims = slack.in_steps(int(rank), steps.tolist(), exclude=rows)
            pause = float(np.mean(t[spikes] - med))
            waited = victims is None or victims >= ctx.thresholds.victim_share * pause
            function = "<untraced host time>"
            if category != CPU_STALL:
                mine = host.filter(pl.col("rank") == rank).group_by("function").agg(pl.col("time_s").sum())
                function = str(mine.sort(["time_s", "function"], descending=[True, False])["function"][0])
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
                        "others_slack_in_pause_steps_s": victims,
                    },
                    localiser=self.name,
                    alarm=alarm(score, cost, ctx) and waited,
                )
            )
        if len(spiky_ranks) < ctx.n_ranks:  # not every rank pauses: keep only the pauses that stand alone
            findings = [f for f in findings if f.rank not in shared_only]
        if findings and len(findings) == ctx.n_ranks >= 2:  # every rank pauses: one shared finding
            shared = min(findings, key=lambda f: f.cost_s_per_step)
            shared.rank = None
            shared.evidence["ranks"] = "all"
            shared.alarm = alarm(shared.score, shared.cost_s_per_step, ctx)  # nobody waits for a shared pause
            return [shared]
        return findings
