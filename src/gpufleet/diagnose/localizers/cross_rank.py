"""A rank whose steady own time in a category exceeds the other ranks' (``cross-rank``)."""

from __future__ import annotations

import math

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
from gpufleet.diagnose.summary import UNTRACED
from gpufleet.diagnose.victims import Slack


def _top_functions(sites: pl.DataFrame, ranks: list[int], rank: int, k: int = 3) -> list[dict]:
    """The functions with the largest excess on ``rank``: its steady seconds per step over the other ranks' median.

    A rank that never calls a function spends 0 s in it, so a function only the slow rank runs (a debug check)
    counts in full rather than being compared with itself.
    """
    per_rank = sites.group_by("rank", "function").agg(pl.col("time_s").sum(), pl.len().alias("sites"))
    grid = pl.DataFrame({"rank": ranks}, schema={"rank": per_rank.schema["rank"]}).join(
        per_rank.select("function").unique(), how="cross"
    )
    full = grid.join(per_rank, on=["rank", "function"], how="left").fill_null(0)
    others = full.filter(pl.col("rank") != rank).group_by("function").agg(pl.col("time_s").median().alias("others"))
    excess = (
        full.filter(pl.col("rank") == rank)
        .join(others, on="function")
        # to the nanosecond: sums that group_by adds in another order must not reorder ties from run to run
        .with_columns((pl.col("time_s") - pl.col("others")).round(9).alias("excess"))
        .sort(["excess", "function"], descending=[True, False])
        .head(k)
    )
    return [
        {
            "function": r["function"],
            "excess_s_per_step": round(r["excess"], 6) + 0.0,  # no -0.0
            "this_rank_s_per_step": round(r["time_s"], 6),
            "calls_per_step": int(r["sites"]),
        }
        for r in excess.iter_rows(named=True)
    ]


def slowest_sites(sites: pl.DataFrame, ranks: list[int], rank: int, function: str) -> dict[str, float | int]:
    """At how many of ``function``'s call sites ``rank`` is the slowest of all ranks, and how unlikely that is.

    A slower device or host slows every call the same way, so its rank is the slowest at every site of the function;
    a process the OS descheduled now and then is slow at some sites, and any rank may be. If ranks were alike, a
    given rank would be the slowest at a site with chance 1/n: ``sign_p`` is the binomial tail of seeing at least
    that many such sites (a sign test over sites, robust to how much slower each one is).
    """
    rows = sites.filter(pl.col("function") == function)
    wide = rows.pivot(on="rank", index=["domain", "category", "site"], values="time_s").fill_null(0.0)
    cols = [str(r) for r in ranks if str(r) in wide.columns]
    if str(rank) not in cols or len(cols) < 2 or wide.height == 0:
        return {"slowest_sites": 0, "sites": 0, "sign_p": 1.0}
    m = wide.select(cols).to_numpy()
    i = cols.index(str(rank))
    k = int(np.sum(m[:, i] > np.delete(m, i, axis=1).max(axis=1)))
    n, q = m.shape[0], 1.0 / len(ranks)
    p = sum(math.comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(k, n + 1))
    return {"slowest_sites": k, "sites": n, "sign_p": float(f"{p:.3g}")}


def delays_others(others_slack: float | None, cost: float, ctx: LocaliserContext, score: float = 0.0) -> bool:
    """Whether the other ranks wait for a rank's excess: at least ``victim_share`` of it (or no wait is known, or
    the excess is overwhelming: ``strong_z``).

    A straggler's extra work holds the others at the next point they synchronise, in whatever form their waiting
    takes (:mod:`gpufleet.diagnose.victims`). An excess nobody waits for is overlapped, or the rank was itself
    descheduled while the others waited anyway: not a straggler.
    """
    t = ctx.thresholds
    return others_slack is None or others_slack >= t.victim_share * cost or score >= t.strong_z


def _own_untraced() -> pl.Expr:
    """Rows of untraced host time: step gaps and annotations' self time."""
    return pl.col("function").str.starts_with(UNTRACED) | (pl.col("category") == "cpu_stall")


def _spread(top: list[dict], cost: float) -> dict[str, float | int]:
    """How the excess spreads over functions: the top one's share, and how many it takes to explain half of it.

    A throttled device or a slower CPU makes every op a little slower; no single op stands out, but their sum does
    (rank-level aggregation).
    """
    if cost <= 0 or not top:
        return {"top_function_share": 0.0}
    return {"top_function_share": round(max(top[0]["excess_s_per_step"], 0.0) / cost, 3)}


@localiser("cross-rank")
class CrossRank(Localiser):
    """A rank whose steady own time in one category exceeds the other ranks' (they then wait for it).

    A rank's steady time is the sum, over its call sites, of each site's low quantile over the steps (see
    :func:`gpufleet.diagnose.summary.call_sites`). Per-step sums swing with every moment a process is
    descheduled; the per-site medians do not, yet move with a slowdown that every step shares.
    """

    order = 10

    def find(self, ctx: LocaliserContext) -> list[Finding]:
        if ctx.n_ranks < 3 or ctx.sites is None:
            return []
        ranks = sorted(ctx.spans["rank"].unique().to_list())
        steady = ctx.sites.group_by("rank", "domain", "category").agg(pl.col("time_s").sum())
        slack = Slack(ctx.steps, ctx.spans)
        floor = ctx.thresholds.noise_share * ctx.step_s
        findings = []
        for (domain, category), group in steady.group_by("domain", "category"):
            mine = dict(zip(group["rank"].to_list(), group["time_s"].to_list(), strict=True))
            values = np.array([mine.get(r, 0.0) for r in ranks])
            for hit in rank_excesses(values, floor):
                rank, cost, score = ranks[hit.index], hit.cost, hit.score
                rows = ctx.sites.filter((pl.col("domain") == domain) & (pl.col("category") == category))
                step_rows = ctx.steps.filter((pl.col("domain") == domain) & (pl.col("category") == category))
                steady = steady_share(step_rows, rank, cost)
                top = _top_functions(rows, ranks, rank)
                # the finding's own untraced time is its work, not its waiting
                victims = slack.evidence(rank, exclude=(pl.col("category") == category) & _own_untraced())
                sign = slowest_sites(rows, ranks, rank, top[0]["function"]) if top else {"sign_p": 1.0}
                findings.append(
                    Finding(
                        rank=rank,
                        function=top[0]["function"] if top else category,
                        category=category,
                        cost_s_per_step=cost,
                        score=score,
                        evidence={
                            "domain": domain,
                            "this_rank_s_per_step": round(hit.value, 6),
                            "median_rank_s_per_step": round(hit.others, 6),
                            "top_functions": top,
                            "spread": _spread(top, cost),
                            "steps_with_excess": round(steady, 3),
                            **sign,
                            **victims,
                        },
                        localiser=self.name,
                        alarm=alarm(score, cost, ctx)
                        and (
                            delays_others(victims["others_slack_s_per_step"], cost, ctx, score)
                            or sign["sign_p"] <= ctx.thresholds.sign_p
                        ),
                    )
                )
        return findings
