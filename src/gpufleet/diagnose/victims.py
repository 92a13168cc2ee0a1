"""Who waits for whom: the evidence that one rank's extra time holds the others back, from any kind of waiting.

In synchronous data-parallel training every rank's step is as long as the slowest rank's own work: the others
fill the rest of their step waiting. That waiting shows in many forms -- a traced blocking collective
(``gloo:all_reduce``, an NCCL kernel), a host-device sync, or no event at all (DDP's reducer waiting inside the
autograd engine on gloo, a blocked ``work.wait()``): untraced host time inside the step. A rank's *slack* per step is
all of it together; a straggler's is the smallest, since it waits for nobody. So the victims' evidence for a finding
on rank r is how much more slack the other ranks have than r, not counting the finding's own time (an untraced pause
on r is its work, not its waiting). Per rank the median over steps, so one descheduled moment does not count.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from gpufleet.diagnose.categories import CPU_STALL
from gpufleet.diagnose.summary import UNTRACED

__all__ = ["Slack", "slack_table"]


def _untraced() -> pl.Expr:
    """Host time the trace shows no op for: the step's gaps and annotations' self time (both ``cpu_stall`` or gaps)."""
    return (pl.col("domain") == "host") & (
        pl.col("function").str.starts_with(UNTRACED) | (pl.col("category") == CPU_STALL)
    )


class Slack:
    """Per (rank, step): seconds waiting (traced waits on the training thread and device) and untraced host seconds."""

    def __init__(self, steps: pl.DataFrame, spans: pl.DataFrame) -> None:
        rows = steps.filter(pl.col("domain") != "host-thread")  # gloo's threads wait in the same moments
        self._rows = rows.select(
            "rank",
            "step",
            "function",
            "category",
            pl.col("wait_s").alias("wait"),
            pl.when(_untraced()).then(pl.col("time_s")).otherwise(0.0).alias("untraced"),
        )
        self._spans = spans.select("rank", "step", (pl.col("dur_ns") / 1e9).alias("step_s"))
        self.ranks = sorted(self._spans["rank"].unique().to_list())

    def per_step(self, exclude: pl.Expr | None = None) -> pl.DataFrame:
        """Per (rank, step): ``wait`` (traced), ``untraced``, ``slack`` (their sum) and ``step_s``, in seconds.

        ``exclude`` selects rows whose untraced time is the finding's own work, not slack (their waits still count).
        """
        rows = self._rows
        if exclude is not None:
            rows = rows.with_columns(pl.when(exclude).then(0.0).otherwise(pl.col("untraced")).alias("untraced"))
        return (
            rows.group_by("rank", "step")
            .agg(pl.col("wait").sum(), pl.col("untraced").sum())
            .join(self._spans, on=["rank", "step"], how="right")
            .with_columns(pl.col("wait", "untraced").fill_null(0.0))
            .with_columns((pl.col("wait") + pl.col("untraced")).alias("slack"))
        )

    def per_rank(self, exclude: pl.Expr | None = None) -> dict[int, dict[str, float]]:
        """Per rank, medians over its steps: ``wait`` (traced), ``untraced``, ``slack`` (their sum) and ``step``."""
        med = self.per_step(exclude).group_by("rank").agg(pl.col("wait", "untraced", "slack", "step_s").median())
        return {
            int(r["rank"]): {"wait": r["wait"], "untraced": r["untraced"], "slack": r["slack"], "step": r["step_s"]}
            for r in med.iter_rows(named=True)
        }

    def in_steps(self, rank: int, steps: list[int], exclude: pl.Expr | None = None) -> float | None:
        """How much more the other ranks wait than ``rank`` in the given steps than in its other steps (None when
        there are no other ranks or no other steps).

        Per step, the others' median slack minus ``rank``'s; its mean over ``steps`` less its median over the rest.
        A pause in some steps of one rank holds the others in exactly those steps, over and above how much more
        they usually wait than that rank (a rank that is a little slower all along is not what paused).
        """
        per = self.per_step(exclude)
        mine = per.filter(pl.col("rank") == rank).select("step", pl.col("slack").alias("mine"))
        others = per.filter(pl.col("rank") != rank).group_by("step").agg(pl.col("slack").median().alias("others"))
        both = mine.join(others, on="step").with_columns((pl.col("others") - pl.col("mine")).alias("gap"))
        inside = both.filter(pl.col("step").is_in(steps))["gap"]
        outside = both.filter(~pl.col("step").is_in(steps))["gap"]
        if inside.is_empty() or outside.is_empty():
            return None
        return round(float(inside.mean()) - float(outside.median()), 6)

    def evidence(self, rank: int, exclude: pl.Expr | None = None) -> dict[str, float | None]:
        """How much more the other ranks wait than ``rank``, by source, and how much of each step is own work.

        ``others_slack_s_per_step`` is the victims' figure a finding is judged by; ``others_wait_s_per_step`` is
        the traced waiting alone (blocking collectives, syncs) and ``others_untraced_s_per_step`` the rest.
        ``own_share_of_step`` is the step-time alignment: a straggler's own work fills its step (near 1), the
        others' does not.
        """
        per = self.per_rank(exclude)
        if rank not in per or len(per) < 2:
            return {"others_slack_s_per_step": None, "others_wait_s_per_step": None}
        others = [q for q in per if q != rank]

        def excess(key: str) -> float:
            return round(float(np.median([per[q][key] for q in others])) - per[rank][key], 6)

        def own_share(q: int) -> float:
            step = per[q]["step"]
            return 1.0 - per[q]["slack"] / step if step > 0 else 0.0

        return {
            "others_slack_s_per_step": excess("slack"),
            "others_wait_s_per_step": excess("wait"),
            "others_untraced_s_per_step": excess("untraced"),
            "own_share_of_step": round(own_share(rank), 4),
            "others_own_share_of_step": round(float(np.median([own_share(q) for q in others])), 4),
        }


def slack_table(steps: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """Per rank: median traced wait, untraced host time and slack per step, in seconds (for reports)."""
    per = Slack(steps, spans).per_rank()
    return pl.DataFrame(
        [{"rank": r, **{k: round(v, 6) for k, v in d.items()}} for r, d in sorted(per.items())],
        schema={"rank": pl.Int64, "wait": pl.Float64, "untraced": pl.Float64, "slack": pl.Float64, "step": pl.Float64},
    )
