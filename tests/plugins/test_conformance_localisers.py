"""Every registered localiser, on a tiny hand-made profiler summary (4 ranks x 6 steps, rank 2 slow in
compute, rank 1 calling an extra sync, rank 3 stopping before the last collective): it returns findings in
the Finding contract, and an unknown option is a one-line DiagnoseError. A new localiser file is picked up."""

from __future__ import annotations

import math

import polars as pl
import pytest

from gpufleet.diagnose.categories import CATEGORIES, COMMUNICATION, COMPUTE, CPU_STALL, DATA_LOADING, SYNC
from gpufleet.diagnose.findings import Finding
from gpufleet.diagnose.localize import LOCALISERS, Localiser, LocaliserContext, Thresholds, default_localisers
from gpufleet.errors import DiagnoseError

RANKS, STEPS = 4, 6
STEP_NS = 100_000_000


def _context() -> LocaliserContext:
    steps, spans, sites, host = [], [], [], []
    for r in range(RANKS):
        for s in range(STEPS):
            spans.append({"rank": r, "step": s, "dur_ns": STEP_NS})
            compute = 0.06 if r == 2 else 0.03 + 0.0005 * s
            rows = [
                ("host", COMPUTE, "aten::mm", 10, compute, 0.0),
                ("host", COMMUNICATION, "c10d::allreduce_", 1, 0.002, 0.04 - compute / 2),
                ("host", DATA_LOADING, "DataLoader.__next__", 1, 0.004, 0.0),
                ("host", CPU_STALL, "<host outside ops>", 1, 0.001, 0.0),
            ]
            rows.append(("host", SYNC, "aten::item", 12 if r == 1 else 1, 0.003 if r == 1 else 0.0003, 0.0))
            steps += [
                dict(
                    zip(("domain", "category", "function", "calls", "time_s", "wait_s"), row, strict=True),
                    rank=r,
                    step=s,
                )
                for row in rows
            ]
            if not (r == 3 and s == STEPS - 1):
                host.append(
                    {
                        "rank": r,
                        "name": "gloo:all_reduce",
                        "ts_ns": s * STEP_NS + 50_000_000,
                        "dur_ns": 5_000_000 if s < STEPS - 1 else 900_000_000,
                        "cat": "cpu_op",
                        "category": COMMUNICATION,
                    }
                )
    step_frame = pl.DataFrame(steps)
    for (r, d, c, f), g in step_frame.group_by("rank", "domain", "category", "function"):
        sites.append({"rank": r, "domain": d, "category": c, "function": f, "site": f, "time_s": g["time_s"].median()})
    return LocaliserContext(
        steps=step_frame,
        spans=pl.DataFrame(spans),
        thresholds=Thresholds(),
        sites=pl.DataFrame(sites),
        host=pl.DataFrame(host),
        device=None,
    )


def test_defaults_are_registered_localisers_in_run_order() -> None:
    names = default_localisers()
    assert set(names) <= set(LOCALISERS.names()) and len(names) == len(set(names))


@pytest.mark.parametrize("name", LOCALISERS.plugin_names())
def test_localiser_returns_findings_in_the_contract(name: str) -> None:
    cls = LOCALISERS[name]
    assert issubclass(cls, Localiser) and cls.name == name
    summary = LOCALISERS.summary(name)
    assert summary and "\n" not in summary
    findings = LOCALISERS.create(name).find(_context())
    assert isinstance(findings, list)
    for f in findings:
        assert isinstance(f, Finding) and f.localiser == name
        assert f.rank is None or 0 <= f.rank < RANKS
        assert f.category in CATEGORIES and isinstance(f.function, str) and f.function
        assert math.isfinite(f.cost_s_per_step) and math.isfinite(float(f.score)) and f.weight > 0


def test_the_tiny_summary_makes_each_builtin_localiser_find_something() -> None:
    """Guards the fixture: an empty result everywhere would make the contract test vacuous."""
    ctx = _context()
    found = {name: LOCALISERS.create(name).find(ctx) for name in ("cross-rank", "extra-calls", "hang")}
    assert {f.rank for f in found["cross-rank"]} >= {2}
    assert any(f.rank == 1 and f.category == SYNC for f in found["extra-calls"])
    assert [f.rank for f in found["hang"]] == [3]


@pytest.mark.parametrize("name", LOCALISERS.plugin_names())
def test_localiser_rejects_an_unknown_option_in_one_line(name: str) -> None:
    with pytest.raises(DiagnoseError) as info:
        LOCALISERS.create(name, no_such_option=1)
    assert "no_such_option" in str(info.value) and "\n" not in str(info.value)
