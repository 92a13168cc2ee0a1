"""Hang detection: ranks whose traces stop before a collective that the other ranks entered.

In a blocking collective every rank must arrive; when one never does, the others sit inside it until
a timeout and their traces end inside that call. We count each rank's outermost collective calls on
its host timeline: the ranks with fewer calls than the others are the ones the job is waiting for,
and the others' last collective (far longer than its usual duration) is the evidence.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from gpufleet.diagnose.categories import COMMUNICATION, HANG
from gpufleet.diagnose.findings import Finding
from gpufleet.diagnose.localize import Localiser, LocaliserContext, localiser
from gpufleet.diagnose.timeline import COLLECTIVE_IMPL

__all__ = ["HangLocaliser", "collective_calls"]

_COLLECTIVE_CATS = ["cpu_op", "cuda_runtime"]


def collective_calls(host: pl.DataFrame, device: pl.DataFrame | None = None) -> pl.DataFrame:
    """Blocking collective calls per rank, in order: rank, seq, function, ts_ns, dur_ns.

    The collective itself is what waits for the peers: gloo's ``gloo:all_reduce`` on its worker thread,
    or the NCCL kernel on the GPU. Host ops (``c10d::allreduce_``) only launch it and return.
    """
    calls = host.filter(pl.col("name").str.contains(COLLECTIVE_IMPL)).select("rank", "name", "ts_ns", "dur_ns")
    if calls.is_empty() and device is not None:
        calls = device.filter(pl.col("category") == COMMUNICATION).select("rank", "name", "ts_ns", "dur_ns")
    if calls.is_empty():
        calls = host.filter(pl.col("cat").is_in(_COLLECTIVE_CATS) & (pl.col("category") == COMMUNICATION)).select(
            "rank", "name", "ts_ns", "dur_ns"
        )
    calls = calls.sort("rank", "ts_ns")
    return calls.select(
        "rank", pl.int_range(pl.len()).over("rank").alias("seq"), pl.col("name").alias("function"), "ts_ns", "dur_ns"
    )


@localiser("hang")
class HangLocaliser(Localiser):
    """Ranks missing from a collective that the others entered and never left."""

    order = 0

    def find(self, ctx: LocaliserContext) -> list[Finding]:
        if ctx.host is None or ctx.n_ranks < 2:
            return []
        calls = collective_calls(ctx.host, ctx.device)
        if calls.is_empty():
            return []
        counts = calls.group_by("rank").agg(pl.len().alias("n"))
        all_ranks = ctx.spans.select("rank").unique().join(counts, on="rank", how="left").fill_null(0)
        most = int(all_ranks["n"].max())
        behind = all_ranks.filter(pl.col("n") < most)
        if behind.is_empty() or behind.height * 2 > all_ranks.height:
            return []  # no rank behind, or most ranks behind: not one rank blocking a collective
        ahead = calls.join(all_ranks.filter(pl.col("n") == most).select("rank"), on="rank")
        # the collectives the ranks behind never entered: the first of them holds the others until the timeout
        # (DDP enqueues a step's buckets at once; the later ones may fail fast once the first has timed out)
        entered = int(behind["n"].min())
        missed = ahead.filter(pl.col("seq") >= entered)
        stuck = missed.sort("dur_ns", descending=True).group_by("rank", maintain_order=True).first()
        usual = float(ahead.filter(pl.col("seq") < entered)["dur_ns"].median() or 0.0)
        stuck_s = float(np.median(stuck["dur_ns"].to_numpy())) / 1e9
        if stuck_s * 1e9 < 10 * max(usual, 1.0) and stuck_s < ctx.step_s:
            return []  # the last collective ended normally: a trace cut short, not a hang
        findings = []
        for row in behind.iter_rows(named=True):
            findings.append(
                Finding(
                    rank=int(row["rank"]),
                    function=str(stuck["function"][0]),
                    category=HANG,
                    cost_s_per_step=stuck_s,
                    score=float("inf") if usual == 0 else stuck_s * 1e9 / usual,
                    evidence={
                        "collectives_entered": int(row["n"]),
                        "collectives_entered_by_others": most,
                        "others_stuck_s": round(stuck_s, 6),
                        "usual_duration_s": round(usual / 1e9, 6),
                        "waiting_ranks": sorted(stuck["rank"].to_list()),
                    },
                    localiser=self.name,
                    alarm=True,
                )
            )
        return findings
