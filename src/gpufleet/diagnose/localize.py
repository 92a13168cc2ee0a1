"""Differential localisation (PerfTracker): compare each function's behaviour across ranks and steps.

Localisers are small classes registered by name, one module each in :mod:`gpufleet.diagnose.localizers`
(the registry imports them all, so a new one is one new file), each turning the per-step function table
into :class:`Finding` objects:

- ``cross-rank``: per (domain, category) a rank's steady *active* time per step (time outside blocking
  collectives and syncs, where it waits for others; per call site, the median over steps) against the
  other ranks: robust z-score over median/MAD, cost = its excess over the other ranks' median, named
  after the function with the largest excess.
- ``extra-calls``: functions one rank calls more often than the others (an unnecessary ``.item()``
  per layer, a debug check); a sync among them makes the finding a ``sync``.
- ``cross-step``: a rank's own steps against its median step: periodic long pauses.
- ``patterns``: expected patterns every rank shares, which differential analysis cannot see: data
  loading or exposed communication taking a large share of every rank's step.
- ``hang``: ranks whose traces stop inside a collective that the others entered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from gpufleet.diagnose.categories import SYNC
from gpufleet.diagnose.findings import Finding
from gpufleet.errors import DiagnoseError
from gpufleet.registry import Registry

__all__ = [
    "LOCALISERS",
    "Localiser",
    "LocaliserContext",
    "Thresholds",
    "alarm",
    "default_localisers",
    "localiser",
    "robust_z",
    "steady_share",
]

MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Thresholds:
    """Alarm thresholds: a finding alarms when its score and its cost both reach them."""

    z: float = 3.5
    # of the median step time; 0.08 was tuned on the tune half of bench/diagnose_accuracy.py (0.05 let a worker
    # DataLoader's jitter alarm in a clean run)
    cost_share: float = 0.08
    # a needless sync stalls a GPU pipeline more than a trace shows (on CPU it costs next to nothing), so
    # its finding alarms at this fraction of the usual cost threshold
    sync_cost_factor: float = 0.2
    noise_share: float = 0.01  # floor of the robust spread, as a share of the median step time
    data_share: float = 0.30  # data loading above this share of every rank's step is a pattern finding
    comm_share: float = 0.50  # exposed communication above this share of every rank's step
    pause_ratio: float = 3.0  # a step with this many times the median host stall is a pause
    # a call site's steady time is this quantile of its time over the steps: 0.25 means a site must be slow in three
    # steps of four (a process descheduled at the same place in half the steps is noise, a fault acts every step);
    # tuned on the tune half of bench/diagnose_accuracy.py (the median let 3 of 10 clean runs alarm)
    site_quantile: float = 0.25
    # a straggler's excess alarms only when the other ranks wait (in any form) at least this share of it ...
    victim_share: float = 0.25
    # ... or when its robust z reaches this: an overwhelming steady excess is its own evidence (4 ranks on 2 cores:
    # while a throttled rank sleeps, the others get its CPU and wait less); tuned on the tune half (the strongest
    # non-fault finding there scored 9.4, the weakest such fault 16)
    strong_z: float = 12.0
    # ... or when its rank is the slowest at so many call sites of its top function that chance explains it at most
    # this often (a sign test: a slow device slows every call; 4 ranks sharing 2 cores wait less for a rank that
    # sleeps, since it gives them its CPU). One in a thousand, a conventional level, not tuned
    sign_p: float = 0.001


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


class Localiser:
    """Turns the per-step function table into findings."""

    name: ClassVar[str] = ""
    #: position in the default run (lower runs first; findings merge in run order)
    order: ClassVar[int] = 100
    #: whether ``diagnose`` runs it when no localisers are named
    default: ClassVar[bool] = True

    def find(self, ctx: LocaliserContext) -> list[Finding]:  # pragma: no cover - interface
        raise NotImplementedError


LOCALISERS: Registry[Localiser] = Registry(
    "localiser", DiagnoseError, listing="choose from", package="gpufleet.diagnose.localizers"
)


def localiser(name: str) -> Callable[[type[Localiser]], type[Localiser]]:
    """Class decorator: register a localiser under ``name`` (its docstring's first line is its summary)."""
    return LOCALISERS.register(name)


def default_localisers() -> tuple[str, ...]:
    """The localisers ``diagnose`` runs by default, in run order."""
    chosen = [(cls.order, name) for name, cls in LOCALISERS.items() if cls.default]  # type: ignore[attr-defined]
    return tuple(name for _, name in sorted(chosen))


def robust_z(values: np.ndarray, floor: float) -> np.ndarray:
    """(x - median) / max(1.4826 MAD, floor): how far each value sits from the others, robust to the outlier."""
    med = np.median(values)
    scale = max(MAD_TO_SIGMA * float(np.median(np.abs(values - med))), floor, 1e-12)
    return (values - med) / scale


@dataclass(frozen=True)
class RankExcess:
    """One rank that spends more than the other ranks: its value, the others' median, the excess and its score."""

    index: int
    value: float
    others: float
    cost: float
    score: float


def rank_excesses(values: np.ndarray, floor: float, min_score: float = 2.0) -> list[RankExcess]:
    """The ranks whose value exceeds the median of the *other* ranks by a robust score of at least ``min_score``.

    The scale is max(1.4826 MAD of all ranks, ``floor``), as in :func:`robust_z`; the cost is measured against the
    others' median so that the slow rank is not compared with itself. Cross-rank localisers share this test.
    """
    med = float(np.median(values))
    scale = max(MAD_TO_SIGMA * float(np.median(np.abs(values - med))), floor, 1e-12)
    hits = []
    for i, value in enumerate(values):
        others = float(np.median(np.delete(values, i)))
        cost = float(value) - others
        score = cost / scale
        if score >= min_score and cost > 0:
            hits.append(RankExcess(i, float(value), others, cost, score))
    return hits


def steady_share(rows: pl.DataFrame, rank: int, cost: float) -> float:
    """Share of steps in which ``rank`` spends at least half of ``cost`` more than the other ranks' median that step.

    ``rows``: per-step rows (rank, step, time_s) of one category or function. A fault acts in every step it is in;
    a process descheduled at the same place in some steps (4 ranks on 2 cores) does so in some of them only.
    """
    per = rows.group_by("rank", "step").agg(pl.col("time_s").sum())
    wide = per.pivot(on="rank", index="step", values="time_s").fill_null(0.0)
    key = str(rank)
    others = [c for c in wide.columns if c not in ("step", key)]
    if key not in wide.columns or not others or wide.height == 0:
        return 0.0
    mine = wide[key].to_numpy()
    med = np.median(wide.select(others).to_numpy(), axis=1)
    return float(np.mean(mine - med >= 0.5 * cost))


def alarm(score: float, cost: float, ctx: LocaliserContext, category: str | None = None) -> bool:
    """Whether a finding alarms: its score and its cost (lower for syncs) reach the thresholds."""
    t = ctx.thresholds
    share = t.cost_share * (t.sync_cost_factor if category == SYNC else 1.0)
    return score >= t.z and cost >= share * ctx.step_s
