"""A diagnose finding: which rank, which function, which resource, how much time per step, and why we think so."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Finding", "merge_findings"]


@dataclass
class Finding:
    """One localised cause of lost time.

    ``rank`` is None when every rank shares the problem (an expected-pattern rule). ``score`` is a
    robust z-score (or, for rules, the observed level scaled so that the alarm threshold means the
    same); ``alarm`` says whether it passed both the score and the cost thresholds. ``weight`` scales the
    cost for ranking where a trace shows less than the problem costs (a needless sync: see
    ``Thresholds.sync_cost_factor``); it is the inverse of the factor its alarm threshold was lowered by.
    """

    rank: int | None
    function: str
    category: str
    cost_s_per_step: float
    score: float
    evidence: dict[str, Any] = field(default_factory=dict)
    localiser: str = ""
    alarm: bool = False
    weight: float = 1.0

    @property
    def priority_s_per_step(self) -> float:
        """The cost findings are ranked by: ``cost_s_per_step`` times ``weight``."""
        return self.cost_s_per_step * self.weight

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with rounded figures."""
        out = asdict(self)
        out["cost_s_per_step"] = round(self.cost_s_per_step, 6)
        out["score"] = round(float(self.score), 3) if self.score == self.score else None
        return out

    def headline(self) -> str:
        """One line a person reads first."""
        who = "all ranks" if self.rank is None else f"rank {self.rank}"
        return f"{who}: {self.category} in {self.function} costs {self.cost_s_per_step * 1e3:.1f} ms/step"


def _rank_key(f: Finding) -> tuple[bool, float]:
    """What decides between two findings of one (rank, category): alarm first, then cost rounded to the nanosecond."""
    return f.alarm, round(f.cost_s_per_step, 9)


def merge_findings(findings: list[Finding]) -> list[Finding]:
    """One finding per (rank, category): the costlier wins, the other's evidence is kept under its localiser.

    Ranked alarms first, then by weighted cost (``priority_s_per_step``).
    """
    best: dict[tuple[int | None, str], Finding] = {}
    for f in findings:
        key = (f.rank, f.category)
        kept = best.get(key)
        if kept is None:
            best[key] = f
            continue
        # costs equal to the nanosecond (two localisers reading one gap, summed in a different order) are a tie: the
        # later localiser, the more specific one (``untraced`` after ``cross-rank``), wins it, whatever the rounding
        winner, other = (f, kept) if _rank_key(f) >= _rank_key(kept) else (kept, f)
        winner.evidence.setdefault("also", {})[other.localiser] = {
            "function": other.function,
            "cost_s_per_step": round(other.cost_s_per_step, 6),
            "score": round(float(other.score), 3),
        }
        best[key] = winner
    return sorted(best.values(), key=lambda f: (not f.alarm, -f.priority_s_per_step))
