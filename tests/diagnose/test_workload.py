"""The diagnosis test workload: fault parsing, the fault mechanics, and real torchrun runs that write traces."""

from __future__ import annotations

import gzip
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

torch = pytest.importorskip("torch")

from gpufleet.diagnose import faults, workload_parts  # noqa: E402
from gpufleet.diagnose.faults import Fault, parse_fault  # noqa: E402
from gpufleet.diagnose.workload import COMM_WAIT, SECTIONS, Block, main, make_buckets, run_workload  # noqa: E402
from gpufleet.errors import ConfigError  # noqa: E402

LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _trace(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def _events(trace: dict[str, Any], name: str | None = None) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and (name is None or e["name"] == name)]


def _steps(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted((e for e in _events(trace) if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])


def _largest_idle_gap(trace: dict[str, Any], step: dict[str, Any]) -> float:
    """Longest stretch (µs) of a step on the main thread with no op or gpufleet::comm_wait running."""
    a, b = step["ts"], step["ts"] + step["dur"]
    busy = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in _events(trace)
        if e["tid"] == step["tid"] and e["name"] not in SECTIONS and not e["name"].startswith("ProfilerStep#")
        if e["ts"] < b and e["ts"] + e["dur"] > a
    )
    gap, cur = 0.0, a
    for s, e in busy:
        gap, cur = max(gap, s - cur), max(cur, e)
    return max(gap, b - cur)


# ---- faults ---------------------------------------------------------------------------------------------------------
def test_parse_fault() -> None:
    assert parse_fault("none") == Fault() and Fault().category is None
    f = parse_fault("slow-rank:2", world_size=4)
    assert (f.kind, f.rank, f.magnitude, f.category) == ("slow-rank", 2, 0.5, "compute")
    assert parse_fault("SLOW-DATA:1:0.2").magnitude == 0.2
    assert {parse_fault(f"{k}:0").category for k in faults.FAULTS} == {
        "compute", "data_loading", "cpu_stall", "communication", "sync", "hang"
    }  # fmt: skip
    assert parse_fault("hang:1").to_dict()["category"] == "hang"


@pytest.mark.parametrize(
    ("text", "match"),
    [("slow:1", "unknown kind"), ("slow-rank", "KIND:RANK"), ("slow-rank:x", "integer"), ("sync:4", "outside")],
)
def test_parse_fault_errors(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_fault(text, world_size=4)


def test_python_pause_lasts_as_asked() -> None:
    t = time.perf_counter()
    faults.python_pause(0.05)
    assert time.perf_counter() - t >= 0.05


def test_buckets_cover_the_parameters_in_order() -> None:
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (10, 30, 5, 5, 50)]
    buckets = make_buckets(params, 3)
    assert len(buckets) == 3
    assert [id(p) for b in buckets for p in b] == [id(p) for p in params]


def test_slow_rank_throttles_every_linear_forward_and_backward_with_the_same_result(monkeypatch) -> None:
    waits: list[float] = []
    ticks = itertools.count()
    monkeypatch.setattr(faults, "sleep", waits.append)
    monkeypatch.setattr(workload_parts, "_now", lambda: float(next(ticks)))  # 1 s passes between two readings

    def run(throttle: float) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        blk = Block(32, 4)
        blk.throttle = throttle
        h = torch.randn(2, 8, 32, requires_grad=True)
        out = blk(h)
        out.sum().backward()
        return out, blk.fc1.weight.grad

    ref, g_ref = run(0.0)
    healthy, waits[:] = list(waits), []
    out, g = run(0.5)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(g, g_ref)
    assert len(waits) == len(healthy) == 2 * 4  # 4 linears, forward and backward: the same ops on every rank
    assert healthy == [0.0] * 8  # a healthy rank's device never waits
    assert all(w > 0 and (2 * w).is_integer() for w in waits)  # half of each layer's own (whole-second) time


# ---- single-process runs (world of one, no torchrun) ---------------------------------------------------------------
def _run_here(tmp_path: Path, fault: str, *extra: str) -> dict[str, Any]:
    threads = torch.get_num_threads()  # the workload pins torch to one thread; give the test session its own back
    try:
        args = ["--out", str(tmp_path), "--fault", fault, "--steps", "3", "--wait", "0", "--warmup", "1", *extra]
        assert main(args) == 0
    finally:
        torch.set_num_threads(threads)
    return _trace(tmp_path / "rank-0.json.gz")


def test_sync_fault_adds_item_calls_in_every_layer(tmp_path: Path) -> None:
    trace = _run_here(tmp_path, "sync:0:3", "--layers", "2")
    assert len(_events(trace, "aten::item")) == 3 * 2 * 3  # syncs per layer x layers x profiled steps
    assert len(_events(trace, "aten::_local_scalar_dense")) == 18


def test_python_pause_is_an_idle_gap_between_sections(tmp_path: Path) -> None:
    trace = _run_here(tmp_path, "python-pause:0:0.08", "--pause-every", "2")
    truth = json.loads((tmp_path / "fault.json").read_text())
    assert truth["affected_steps"] == [1, 3]  # profiled steps are 1..3; every 2nd step pauses
    gaps = {int(s["name"].split("#")[1]): _largest_idle_gap(trace, s) for s in _steps(trace)}
    assert gaps[1] >= 80_000 and gaps[3] >= 80_000


def test_slow_collective_is_a_delay_inside_the_allreduce_section(tmp_path: Path) -> None:
    trace = _run_here(tmp_path, "slow-collective:0:0.08", "--buckets", "2")
    ar = _events(trace, "gpufleet::allreduce")
    assert len(ar) == 3 and min(e["dur"] for e in ar) >= 80_000
    assert len(_events(trace, COMM_WAIT)) == 6  # one wait per bucket per step
    assert len(_events(trace, "c10d::allreduce_")) == 6


def test_run_workload_rejects_a_bad_fault_before_launching(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="outside"):
        run_workload(tmp_path, fault="slow-rank:5", nproc=2)


# ---- torchrun runs ------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_ranks_without_fault_write_traces_truth_and_timings(tmp_path: Path) -> None:
    out = run_workload(tmp_path / "run", nproc=2, steps=3, extra=["--timings", str(tmp_path / "timings.csv")])
    truth = json.loads((out / "fault.json").read_text())
    assert truth["kind"] == "none" and truth["rank"] is None and truth["category"] is None
    assert truth["world_size"] == 2 and truth["backend"] == "gloo" and truth["profiled_steps"] == [3, 4, 5]
    for rank in range(2):
        trace = _trace(out / f"rank-{rank}.json.gz")
        info = trace["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, 2, "gloo")
        assert [s["name"] for s in _steps(trace)] == ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]
        for name in (*SECTIONS, LOADER):
            assert len(_events(trace, name)) == 3, name
        assert len(_events(trace, COMM_WAIT)) == 3 * 2  # 2 buckets (the default)
        assert len(_events(trace, "gloo:all_reduce")) == 3 * 2  # on gloo's own threads
        flushes = [(e["ts"], e["ts"] + e["dur"]) for e in _events(trace, "gpufleet::monitor_flush")]
        assert flushes  # StepMonitor gathers every 4 steps; its .item() calls sit inside this annotation
        for e in _events(trace, "aten::item"):  # outside it, only the sync fault makes these
            assert any(a <= e["ts"] <= b for a, b in flushes)
        assert len(json.loads((out / f"steps-rank-{rank}.json").read_text())["step_s"]) == 6
    timings = pl.read_csv(tmp_path / "timings.csv")
    assert timings.columns == ["rank", "step", "data", "forward", "backward", "allreduce", "optimizer", "total"]
    assert len(timings) == 2 * 6


@pytest.mark.slow
@pytest.mark.multiprocess
def test_slow_data_on_rank_1_shows_in_its_dataloader_op(tmp_path: Path) -> None:
    out = run_workload(tmp_path, fault="slow-data:1:0.05", nproc=2, steps=3)
    truth = json.loads((out / "fault.json").read_text())
    assert [truth[k] for k in ("kind", "rank", "magnitude", "category")] == ["slow-data", 1, 0.05, "data_loading"]
    med = [statistics.median(e["dur"] for e in _events(_trace(out / f"rank-{r}.json.gz"), LOADER)) for r in (0, 1)]
    assert med[1] >= 50_000 and med[1] > med[0] + 40_000  # µs


# ---- end to end: the workload's faults, found by the analyser (bench/diagnose_accuracy.py runs the full matrix) -----
@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_throttled_rank_is_the_top_compute_finding(tmp_path: Path) -> None:
    from gpufleet.diagnose.analyzer import TraceAnalyzer

    # twice the bench's magnitude (bench/diagnose_accuracy.py runs slow-rank:R:1 over 8 steps): in 2 of 5 fresh-clone
    # CI runs on 2 shared cores the 8-step run at magnitude 1 raised no alarm (never alone, nor beside CPU hogs)
    out = run_workload(tmp_path, fault="slow-rank:2:2", nproc=4, steps=12)
    diagnosis = TraceAnalyzer(out).diagnose()
    assert diagnosis.alarms, "no alarm; top findings: " + "; ".join(
        f"rank {f.rank} {f.category} {f.function} {f.cost_s_per_step * 1e3:.1f} ms/step {f.evidence}"
        for f in diagnosis.findings[:4]
    )
    top = diagnosis.alarms[0]
    assert (top.rank, top.category, top.function) == (2, "compute", "gpufleet::device_wait")
    assert top.evidence["others_wait_s_per_step"] > 0  # the other ranks wait for it


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_hung_rank_is_found_in_the_collective_it_never_entered(tmp_path: Path) -> None:
    from gpufleet.diagnose.analyzer import TraceAnalyzer

    out = run_workload(tmp_path, fault="hang:1", nproc=2, steps=4)
    top = TraceAnalyzer(out).diagnose().alarms[0]
    assert (top.rank, top.category) == (1, "hang")


# ---- the DDP families (docs/diagnose_workload.md) -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("family", "extra", "loader"),
    [
        ("lm-ddp", (), LOADER),
        (
            "cnn-ddp",
            ("--workers", "1", "--batch", "4"),
            "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
        ),
        ("lm-accum", ("--accum", "3"), LOADER),
    ],
)
def test_ddp_families_trace_ddp_without_gpufleet_sections(
    tmp_path: Path, family: str, extra: tuple, loader: str
) -> None:
    trace = _run_here(tmp_path, "host-after:0:0.03", "--family", family, *extra)
    assert json.loads((tmp_path / "fault.json").read_text())["family"] == family
    names = {e["name"] for e in _events(trace)}
    assert "DistributedDataParallel.forward" in names and not set(SECTIONS) & names
    per_step = 3 if family == "lm-accum" else 1  # micro-batches per step
    assert len(_events(trace, loader)) == 3 * per_step
    assert len(_events(trace, "DistributedDataParallel.forward")) == 3 * per_step
    for step in _steps(trace):  # the pause sits after the step's last op, before the step closes
        end = step["ts"] + step["dur"]
        last = max(e["ts"] + e["dur"] for e in _events(trace) if e["tid"] == step["tid"] and e is not step
                   and step["ts"] <= e["ts"] < end)  # fmt: skip
        assert end - last >= 30_000


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_pause_after_the_optimizer_under_ddp_is_found_on_its_rank(tmp_path: Path) -> None:
    from gpufleet.diagnose.analyzer import TraceAnalyzer

    out = run_workload(tmp_path, fault="host-after:1:0.08", nproc=3, steps=5, extra=["--family", "lm-ddp"])
    top = TraceAnalyzer(out).diagnose().alarms[0]
    assert (top.rank, top.category, top.function) == (1, "cpu_stall", "<untraced: step end>")
    assert top.evidence["others_slack_s_per_step"] > 0.02  # the others wait in DDP's reducer, untraced
