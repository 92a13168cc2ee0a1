"""Differential localisation (PerfTracker): compare each function's behaviour across ranks and steps.

Localisers are small classes registered by name, each turning the per-step function table into
:class:`Finding` objects:

- ``cross-rank``: per (domain, category) a rank's steady *active* time per step (time outside blocking
  collectives and syncs, where it waits for others; per call site, the median over steps) against the
  other ranks: robust z-score over median/MAD, cost = its excess over the other ranks' median, named
  after the function with the largest excess.
- ``extra-calls``: functions one rank calls more often than the others (an unnecessary ``.item()``
  per layer, a debug check); a sync among them makes the finding a ``sync``.
- ``cross-step``: a rank's own steps against its median step: periodic long pauses.
- ``patterns``: expected patterns every rank shares, which differential analysis cannot see: data
  loading or exposed communication taking a large share of every rank's step.
- ``hang``: ranks whose traces stop inside a collective that the others entered (see hang.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from gpufleet.diagnose.categories import COMMUNICATION, CPU_STALL, DATA_LOADING, SYNC
from gpufleet.diagnose.findings import Finding

__all__ = ["LOCALISERS", "LocaliserContext", "Thresholds", "localiser", "robust_z"]

MAD_TO_SIGMA = 1.4826
#: a cross-rank excess alarms only when the other ranks wait at least this share of it
VICTIM_SHARE = 0.25


@dataclass(frozen=True)
class Thresholds:
    """Alarm thresholds: a finding alarms when its score and its cost both reach them."""

    z: float = 3.5
    cost_share: float = 0.05  # of the median step time
    # a needless sync stalls a GPU pipeline more than a trace shows (on CPU it costs next to nothing), so
    # its finding alarms at this fraction of the usual cost threshold
    sync_cost_factor: float = 0.2
    noise_share: float = 0.01  # floor of the robust spread, as a share of the median step time
    data_share: float = 0.30  # data loading above this share of every rank's step is a pattern finding
    comm_share: float = 0.50  # exposed communication above this share of every rank's step
    pause_ratio: float = 3.0  # a step with this many times the median host stall is a pause


@dataclass
class LocaliserContext:
    """What every localiser reads: the per-step function table and the step spans."""

    steps: pl.DataFrame  # per (rank, step, domain, category, function): calls, time_s (own), wait_s
    spans: pl.DataFrame  # per (rank, step): dur_ns
    thresholds: Thresholds
    sites: pl.DataFrame | None = None  # per (rank, domain, category, function, site): median own time_s
    host: pl.DataFrame | None = None  # the host timeline, for localisers that read single calls (hang)
    device: pl.DataFrame | None = None  # the device timeline (kernels, copies)

    @property
    def step_s(self) -> float:
        """Median step time over all ranks and steps, in seconds."""
        return float(self.spans["dur_ns"].median() or 0.0) / 1e9

    @property
    def n_ranks(self) -> int:
        """How many ranks the traces hold."""
        return self.spans["rank"].n_unique()


LOCALISERS: dict[str, type[Localiser]] = {}


def localiser(name: str):
    """Class decorator: register a localiser under ``name``."""

    def register(cls: type[Localiser]) -> type[Localiser]:
        cls.name = name
        LOCALISERS[name] = cls
        return cls

    return register


class Localiser:
    """Turns the per-step function table into findings."""

    name: ClassVar[str] = ""

    def find(self, ctx: LocaliserContext) -> list[Finding]:  # pragma: no cover - interface
        raise NotImplementedError


def robust_z(values: np.ndarray, floor: float) -> np.ndarray:
    """(x - median) / max(1.4826 MAD, floor): how far each value sits from the others, robust to the outlier."""
    med = np.median(values)
    scale = max(MAD_TO_SIGMA * float(np.median(np.abs(values - med))), floor, 1e-12)
    return (values - med) / scale


def _alarm(score: float, cost: float, ctx: LocaliserContext, category: str | None = None) -> bool:
    t = ctx.thresholds
    share = t.cost_share * (t.sync_cost_factor if category == SYNC else 1.0)
    return score >= t.z and cost >= share * ctx.step_s


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
        .with_columns((pl.col("time_s") - pl.col("others")).alias("excess"))
        .sort(["excess", "function"], descending=[True, False])
        .head(k)
    )
    return [
        {
            "function": r["function"],
            "excess_s_per_step": round(r["excess"], 6),
            "this_rank_s_per_step": round(r["time_s"], 6),
            "calls_per_step": int(r["sites"]),
        }
        for r in excess.iter_rows(named=True)
    ]


@localiser("cross-rank")
class CrossRank(Localiser):
    """A rank whose steady own time in one category exceeds the other ranks' (they then wait for it).

    A rank's steady time is the sum, over its call sites, of each site's median over the steps (see
    :func:`gpufleet.diagnose.summary.call_sites`). Per-step sums swing with every moment a process is
    descheduled; the per-site medians do not, yet move with a slowdown that every step shares.
    """

    def find(self, ctx: LocaliserContext) -> list[Finding]:
        if ctx.n_ranks < 3 or ctx.sites is None:
            return []
        ranks = sorted(ctx.spans["rank"].unique().to_list())
        steady = ctx.sites.group_by("rank", "domain", "category").agg(pl.col("time_s").sum())
        waits = self._victims(ctx)
        floor = ctx.thresholds.noise_share * ctx.step_s
        findings = []
        for (domain, category), group in steady.group_by("domain", "category"):
            mine = dict(zip(group["rank"].to_list(), group["time_s"].to_list(), strict=True))
            values = np.array([mine.get(r, 0.0) for r in ranks])
            med = float(np.median(values))
            scale = max(MAD_TO_SIGMA * float(np.median(np.abs(values - med))), floor, 1e-12)
            for i, rank in enumerate(ranks):
                others = float(np.median(np.delete(values, i)))
                cost = float(values[i]) - others
                score = cost / scale
                if score < 2.0 or cost <= 0:
                    continue
                rows = ctx.sites.filter((pl.col("domain") == domain) & (pl.col("category") == category))
                top = _top_functions(rows, ranks, rank)
                findings.append(
                    Finding(
                        rank=rank,
                        function=top[0]["function"] if top else category,
                        category=category,
                        cost_s_per_step=cost,
                        score=score,
                        evidence={
                            "domain": domain,
                            "this_rank_s_per_step": round(float(values[i]), 6),
                            "median_rank_s_per_step": round(others, 6),
                            "top_functions": top,
                            "others_wait_s_per_step": waits.get(rank),
                        },
                        localiser=self.name,
                        alarm=_alarm(score, cost, ctx) and self._delays_others(waits.get(rank), cost),
                    )
                )
        return findings

    @staticmethod
    def _delays_others(others_wait: float | None, cost: float) -> bool:
        """Whether the other ranks wait for this rank's excess: at least a quarter of it (or no wait is known).

        A straggler's extra work holds the others in the next collective. An excess nobody waits for is
        overlapped, or the rank was itself descheduled while the others waited anyway: not a straggler.
        """
        return others_wait is None or others_wait >= VICTIM_SHARE * cost

    @staticmethod
    def _victims(ctx: LocaliserContext) -> dict[int, float]:
        """Per rank: how much longer the *other* ranks wait (blocking collectives, syncs) than this rank does."""
        waits = (
            ctx.steps.filter(pl.col("domain") != "host-thread")  # gloo's thread waits in the same moments as the step's
            .group_by("rank")
            .agg(pl.col("wait_s").sum().alias("time_s"))
        )
        if waits.height < 2:
            return {}
        steps = ctx.spans.group_by("rank").agg(pl.len().alias("n"))
        per = waits.join(steps, on="rank").with_columns((pl.col("time_s") / pl.col("n")).alias("w"))
        values = dict(zip(per["rank"].to_list(), per["w"].to_list(), strict=True))
        return {r: round(float(np.median([w for q, w in values.items() if q != r])) - w, 6) for r, w in values.items()}


@localiser("extra-calls")
class ExtraCalls(Localiser):
    """Functions one rank calls more often than the others; a sync among them names the finding ``sync``."""

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
                    alarm=_alarm(score, cost, ctx, category),
                    weight=1.0 / ctx.thresholds.sync_cost_factor if category == SYNC else 1.0,
                )
            )
        return findings


@localiser("cross-step")
class CrossStep(Localiser):
    """Long host pauses in some steps of a rank: host time outside ops far above the rank's median step."""

    def find(self, ctx: LocaliserContext) -> list[Finding]:
        stall = (
            ctx.steps.filter((pl.col("category") == CPU_STALL) & (pl.col("domain") == "host"))
            .group_by("rank", "step")
            .agg(pl.col("time_s").sum())
        )
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
            findings.append(
                Finding(
                    rank=int(rank),
                    function="<host outside ops>",
                    category=CPU_STALL,
                    cost_s_per_step=cost,
                    score=score,
                    evidence={
                        "pause_steps": steps.tolist(),
                        "period_steps": period,
                        "median_pause_s": round(float(np.median(t[spikes])), 6),
                        "median_step_stall_s": round(med, 6),
                    },
                    localiser=self.name,
                    alarm=_alarm(score, cost, ctx),
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


@localiser("patterns")
class ExpectedPatterns(Localiser):
    """Problems every rank shares: data loading or exposed communication dominating the step."""

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
                .sort("time_s", descending=True)
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
