"""GPU-time analyses (temporal breakdown, comm/compute overlap, late-start stragglers, gaps, kernel stats).

Two kinds of test:

- Validation against a real reference tool. ``data/hta_reference.json`` holds what Holistic Trace Analysis 0.5.0
  (PyPI ``HolisticTraceAnalysis==0.5.0``, with pandas 3.1.1 on Python 3.11) reports on the real Kineto traces in
  ``tests/data/kineto`` (a 2-rank slice of a 128-GPU job with NCCL SendRecv kernels, analysed without and with
  its last ProfilerStep, and two single-rank benchmark traces); it was produced by ``python bench/hta_reference.py``,
  which runs ``TraceAnalysis(trace_dir=...)``, ``get_temporal_breakdown``, ``get_comm_comp_overlap``,
  ``get_potential_stragglers(num_candidates=1 and 2)`` and HTA's internal late-start metric. gpufleet's figures on
  the same traces must agree within 2 % (relative) for times and metrics, 0.5 percentage points for percentages,
  and exactly for the chosen ranks.
- Tiny hand-built event frames whose answers are obvious by construction, and hypothesis properties.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.diagnose.gpu_time import (
    COMMUNICATION,
    COMPUTE,
    MEMORY,
    OTHER,
    comm_comp_overlap,
    gpu_idle_gaps,
    gpu_kernels,
    hta_window,
    kernel_kind,
    kernel_summary,
    merge_intervals,
    temporal_breakdown,
)
from gpufleet.diagnose.kineto import EVENT_SCHEMA, read_folder
from gpufleet.diagnose.late_start import late_start_stragglers, profiler_steps
from gpufleet.errors import DiagnoseError

REFERENCE = json.loads((Path(__file__).parent / "data" / "hta_reference.json").read_text())


KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"  # HTA's test traces (MIT), see ATTRIBUTION.md
REL, PP = 0.02, 0.5


# ---------------------------------------------------------------- validation against HTA


@pytest.fixture(scope="module")
def case_events(tmp_path_factory: pytest.TempPathFactory):
    """The events of each reference case, read once (each job from a folder of its own, as HTA reads it)."""
    cache: dict[str, pl.DataFrame] = {}

    def get(case: str) -> pl.DataFrame:
        files = REFERENCE["cases"][case]["files"]
        paths = [KINETO / f for f in files]
        key = ",".join(files)
        if key not in cache:
            folder = tmp_path_factory.mktemp("job")
            for p in paths:
                (folder / p.name).symlink_to(p.resolve())
            cache[key] = read_folder(folder).events
        return cache[key]

    return get


def _close(ours: float, theirs: float, what: str) -> None:
    assert ours == pytest.approx(theirs, rel=REL, abs=1.0), f"{what}: gpufleet {ours} vs HTA {theirs}"


CASES = sorted(REFERENCE["cases"])


@pytest.mark.parametrize("case", CASES)
def test_temporal_breakdown_matches_hta(case: str, case_events: Any) -> None:
    ref = REFERENCE["cases"][case]
    events = case_events(case)
    ours = temporal_breakdown(events, include_last_step=ref["include_last_step"])
    if isinstance(ref["temporal_breakdown"], dict):  # HTA fails (no GPU kernels at all): we return no rows
        assert ours.height == 0
        return
    assert ours["rank"].to_list() == [r["rank"] for r in ref["temporal_breakdown"]]
    for mine, theirs in zip(ours.iter_rows(named=True), ref["temporal_breakdown"], strict=True):
        for col, hta_col in [("idle", "idle_time"), ("compute", "compute_time"), ("non_compute", "non_compute_time")]:
            _close(mine[f"{col}_ns"] / 1000, theirs[f"{hta_col}(us)"], f"{case} rank {mine['rank']} {col}")
            assert abs(mine[f"{col}_pct"] - theirs[f"{hta_col}_pctg"]) <= PP, (case, col)
        _close(mine["span_ns"] / 1000, theirs["kernel_time(us)"], f"{case} span")


@pytest.mark.parametrize("case", CASES)
def test_comm_comp_overlap_matches_hta(case: str, case_events: Any) -> None:
    ref = REFERENCE["cases"][case]
    ours = comm_comp_overlap(case_events(case), include_last_step=ref["include_last_step"])
    mine = dict(zip(ours["rank"].to_list(), ours["overlap_pct"].to_list(), strict=True))
    for row in ref["comm_comp_overlap"]:
        theirs = row["comp_comm_overlap_pctg"]
        if theirs is None:  # no communication kernel: HTA divides by zero
            assert mine.get(row["rank"]) is None
        else:
            assert abs(mine[row["rank"]] - theirs) <= PP, (case, row)


@pytest.mark.parametrize("case", CASES)
def test_late_start_stragglers_match_hta(case: str, case_events: Any) -> None:
    ref = REFERENCE["cases"][case]
    events = case_events(case)
    window = hta_window(events, include_last_step=ref["include_last_step"])
    metric_ref = ref["late_start_metric"]
    if "error" in metric_ref:  # no ProfilerStep in the trace: HTA raises, so do we, with a message
        assert profiler_steps(window) == []
        with pytest.raises(DiagnoseError, match="ProfilerStep"):
            late_start_stragglers(window)
        return
    assert profiler_steps(window) == metric_ref["steps"]
    for k in (1, 2):
        result = late_start_stragglers(window, num_candidates=k)
        theirs = ref[f"potential_stragglers_{k}"]
        assert sorted(result.candidates) == sorted(theirs), k  # HTA leaves the order of tied ranks unspecified
        if k == 1:
            assert result.candidates == theirs
    assert result.stream == metric_ref["stream"]
    assert result.kernel == metric_ref["kernel"]
    ours = {(r["rank"], r["iteration"]): r["normalized_start"] for r in result.metric.iter_rows(named=True)}
    assert set(ours) == {(r["rank"], r["iteration"]) for r in metric_ref["rows"]}
    for row in metric_ref["rows"]:
        assert ours[(row["rank"], row["iteration"])] == pytest.approx(row["normalized_start"], rel=REL)


def test_reference_was_produced_by_hta_0_5_0() -> None:
    assert REFERENCE["hta_version"] == "0.5.0"
    assert REFERENCE["produced_by"] == "python bench/hta_reference.py"
    assert "sampled_2rank" in REFERENCE["cases"]


# ---------------------------------------------------------------- hand-built frames


def _events(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """An events frame with the reader's schema; omitted columns are null, ``ph`` is X and ``rank`` 0."""
    full = [{"rank": 0, "ph": "X", **{k: None for k in EVENT_SCHEMA if k not in ("rank", "ph")}, **r} for r in rows]
    return pl.DataFrame(full, schema=EVENT_SCHEMA)


_corr = iter(range(1, 10**9))


def _kernel(ts: int, dur: int, name: str = "gemm", stream: int = 7, rank: int = 0, corr: int | None = None):
    return {
        "rank": rank,
        "cat": "kernel",
        "name": name,
        "ts_ns": ts,
        "dur_ns": dur,
        "stream": stream,
        "correlation": next(_corr) if corr is None else corr,
    }


def _launch(ts: int, corr: int, rank: int = 0) -> dict[str, Any]:
    return {
        "rank": rank,
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "ts_ns": ts,
        "dur_ns": 1,
        "correlation": corr,
    }


def _step(n: int, ts: int, dur: int, rank: int = 0) -> dict[str, Any]:
    return {"rank": rank, "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts_ns": ts, "dur_ns": dur}


def test_kernel_kinds_follow_hta_name_patterns() -> None:
    names = {
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)": COMMUNICATION,
        "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)": COMMUNICATION,
        "Memcpy HtoD (Pinned -> Device)": MEMORY,
        "Memset (Device)": MEMORY,
        "dma_copy": MEMORY,
        "Stream Sync": OTHER,
        "Context Sync": OTHER,
        "void at::native::batch_norm_SyncBN_kernel": OTHER,  # HTA: any name containing "Sync"
        "void my_Memcpy_kernel": OTHER,  # HTA: any name containing "Memcpy"
        "ampere_sgemm_128x64_nn": COMPUTE,
        "void at::native::vectorized_elementwise_kernel<4>": COMPUTE,
        "nccl_helper": COMPUTE,  # "nccl" without a following "Kernel"
    }
    got = pl.DataFrame({"name": list(names)}).select(kernel_kind())["kind"].to_list()
    assert dict(zip(names, got, strict=True)) == names


def test_breakdown_two_overlapping_kernels_and_a_gap() -> None:
    # compute [0,10) and [5,15) overlap on two streams; idle [15,20); communication [20,30)
    ev = _events([_kernel(0, 10), _kernel(5, 10, stream=8), _kernel(20, 10, "ncclKernel_SendRecv", stream=9)])
    row = temporal_breakdown(ev).row(0, named=True)
    assert (row["span_ns"], row["idle_ns"], row["compute_ns"], row["non_compute_ns"]) == (30, 5, 15, 10)
    assert row["idle_pct"] + row["compute_pct"] + row["non_compute_pct"] == pytest.approx(100.0)


def test_breakdown_non_compute_is_time_with_no_compute_kernel() -> None:
    # memcpy [0,10) under compute [5,15): non-compute is only [0,5); a sync on a stream counts as non-compute
    ev = _events([_kernel(0, 10, "Memcpy DtoD"), _kernel(5, 10, stream=8), _kernel(15, 5, "Stream Sync")])
    row = temporal_breakdown(ev).row(0, named=True)
    assert (row["span_ns"], row["idle_ns"], row["compute_ns"], row["non_compute_ns"]) == (20, 0, 10, 10)


def test_breakdown_is_per_rank_and_ignores_cpu_events() -> None:
    ev = _events(
        [
            _kernel(0, 10, rank=0),
            _kernel(100, 4, rank=1),
            _kernel(110, 6, rank=1),
            {"cat": "cpu_op", "name": "aten::mm", "ts_ns": -50, "dur_ns": 500},
            {"cat": "gpu_user_annotation", "name": "fwd", "ts_ns": 0, "dur_ns": 1000},  # no stream in Kineto
        ]
    )
    out = temporal_breakdown(ev)
    assert out.select("rank", "span_ns", "idle_ns").rows() == [(0, 10, 0), (1, 16, 6)]


def test_overlap_half_of_communication_hidden() -> None:
    # communication [0,10) and [30,40); compute [5,20) and [35,36)
    ev = _events(
        [
            _kernel(0, 10, "ncclKernel_AllReduce", stream=20),
            _kernel(30, 10, "ncclKernel_AllReduce", stream=20),
            _kernel(5, 15),
            _kernel(35, 1),
            _kernel(0, 40, "Memcpy HtoD", stream=3),  # memory counts for neither side
        ]
    )
    row = comm_comp_overlap(ev).row(0, named=True)
    assert (row["comm_ns"], row["overlap_ns"]) == (20, 6)
    assert row["overlap_pct"] == pytest.approx(30.0)


def test_overlap_without_communication_is_null() -> None:
    assert comm_comp_overlap(_events([_kernel(0, 10)]))["overlap_pct"].to_list() == [None]


def _two_step_trace() -> pl.DataFrame:
    """Steps #1 [0,100) and #2 [100,200) on the CPU; one kernel launched in each; one launched before; one orphan."""
    return _events(
        [
            _step(1, 0, 100),
            _step(2, 100, 100),
            _launch(-10, corr=500),
            _launch(10, corr=501),
            _launch(110, corr=502),
            _kernel(20, 30, corr=500),
            _kernel(60, 30, corr=501),
            _kernel(150, 30, corr=502),
            _kernel(190, 5, corr=999),  # its launch is not in the trace
            _kernel(70, 5, stream=0, corr=503),
            _launch(70, corr=503),
        ]
    )


def test_window_drops_the_last_step_and_kernels_without_launch() -> None:
    kernels = gpu_kernels(_two_step_trace())
    assert sorted(kernels["correlation"].to_list()) == [500, 501, 503]
    with_last = gpu_kernels(_two_step_trace(), include_last_step=True)
    assert sorted(with_last["correlation"].to_list()) == [500, 501, 502, 503]


def test_iterations_come_from_the_launch() -> None:
    window = hta_window(_two_step_trace(), include_last_step=True)
    gpu = dict(window.filter(pl.col("is_gpu")).select("correlation", "iteration").rows())
    assert gpu == {500: -1, 501: 1, 502: 2, 503: None}  # launched before any step: -1; stream 0: none (as HTA)
    assert profiler_steps(window) == [1, 2]
    assert profiler_steps(hta_window(_two_step_trace())) == [1]


def test_without_steps_nothing_is_dropped() -> None:
    ev = _events([_kernel(0, 10, corr=1), _kernel(20, 10, corr=2)])
    assert gpu_kernels(ev).height == 2


def test_idle_gaps_per_stream() -> None:
    ev = _events([_kernel(0, 10), _kernel(15, 5), _kernel(30, 10), _kernel(2, 3, stream=8)])
    gaps = gpu_idle_gaps(ev).row(0, named=True)
    assert (gaps["stream"], gaps["events"], gaps["span_ns"], gaps["busy_ns"]) == (7, 3, 40, 25)
    assert (gaps["gaps"], gaps["idle_ns"], gaps["max_gap_ns"]) == (2, 15, 10)
    assert gaps["p95_gap_ns"] == pytest.approx(5 + 0.95 * 5)
    other = gpu_idle_gaps(ev).row(1, named=True)
    assert (other["stream"], other["gaps"], other["idle_ns"], other["p95_gap_ns"]) == (8, 0, 0, None)


def test_kernel_summary_statistics() -> None:
    ev = _events([_kernel(i * 100, d) for i, d in enumerate([10, 20, 30, 40])] + [_kernel(1000, 5, "Memset x")])
    out = kernel_summary(ev)
    gemm = out.row(0, named=True)
    assert (gemm["name"], gemm["kind"], gemm["count"], gemm["total_ns"]) == ("gemm", COMPUTE, 4, 100)
    assert (gemm["mean_ns"], gemm["p50_ns"], gemm["min_ns"], gemm["max_ns"]) == (25.0, 25.0, 10, 40)
    assert gemm["p95_ns"] == pytest.approx(np.percentile([10, 20, 30, 40], 95))
    assert out.row(1, named=True)["kind"] == MEMORY


def _straggler_job(starts: dict[int, list[int]], name: str = "ncclKernel_AllReduce_RING") -> pl.DataFrame:
    """Ranks with 3 steps of 1000 ns each (the last is dropped); per step one long collective starting at ``starts``."""
    rows: list[dict[str, Any]] = []
    for rank, step_starts in starts.items():
        for i in range(3):
            rows.append(_step(i + 1, i * 1000, 1000, rank=rank))
            corr = rank * 100 + i
            rows.append(_launch(i * 1000 + 1, corr=corr, rank=rank))
            start = i * 1000 + (step_starts[i] if i < len(step_starts) else 0)
            rows.append(_kernel(start, 900 - (start - i * 1000), name, stream=20, rank=rank, corr=corr))
    return _events(rows)


def test_late_start_picks_the_rank_that_starts_last() -> None:
    job = _straggler_job({0: [100, 100], 1: [120, 110], 2: [400, 300], 3: [110, 120]})
    result = late_start_stragglers(job, num_candidates=1)
    assert result.candidates == [2]
    assert result.iterations == [1, 2]
    assert (result.stream, result.kernel) == (20, "ncclKernel_AllReduce_RING")
    assert result.counts.row(0) == (2, 2)
    two = late_start_stragglers(job, num_candidates=2)
    assert two.candidates == [2, 1]  # rank 1 is second latest in step 1, rank 3 in step 2: tie, lower rank first


def test_late_start_ignores_nccl_dev_kernels_as_hta_does() -> None:
    job = _straggler_job({0: [100, 100], 1: [400, 400]}, name="ncclDevKernel_AllReduce")
    with pytest.raises(DiagnoseError, match="ncclKernel"):
        late_start_stragglers(job)


def test_late_start_without_steps_raises() -> None:
    with pytest.raises(DiagnoseError, match="ProfilerStep"):
        late_start_stragglers(_events([_kernel(0, 10, "ncclKernel_x", stream=20)]))


def test_missing_columns_raise_a_diagnose_error() -> None:
    with pytest.raises(DiagnoseError, match="missing column"):
        temporal_breakdown(pl.DataFrame({"rank": [0], "name": ["gemm"]}))


# ---------------------------------------------------------------- properties

_NAMES = ["gemm", "ncclKernel_AllReduce", "Memcpy HtoD", "Stream Sync"]
_kernels = st.lists(
    st.tuples(st.integers(0, 200), st.integers(0, 60), st.sampled_from(_NAMES), st.sampled_from([7, 8, 20])),
    min_size=1,
    max_size=25,
)


def _measure(intervals: list[tuple[int, int]]) -> int:
    """Brute-force length of a union of integer intervals, on a grid of 1 ns."""
    grid = np.zeros(300, dtype=bool)
    for a, b in intervals:
        grid[a:b] = True
    return int(grid.sum())


@settings(max_examples=150, deadline=None)
@given(_kernels)
def test_breakdown_adds_up_to_the_span(kernels: list[tuple[int, int, str, int]]) -> None:
    ev = _events([_kernel(ts, dur, name, stream) for ts, dur, name, stream in kernels])
    row = temporal_breakdown(ev).row(0, named=True)
    assert row["idle_ns"] + row["compute_ns"] + row["non_compute_ns"] == row["span_ns"]
    assert min(row["idle_ns"], row["compute_ns"], row["non_compute_ns"]) >= 0
    assert row["span_ns"] - row["idle_ns"] == _measure([(ts, ts + dur) for ts, dur, _, _ in kernels])
    assert row["compute_ns"] == _measure([(ts, ts + dur) for ts, dur, name, _ in kernels if name == "gemm"])


@settings(max_examples=150, deadline=None)
@given(_kernels)
def test_overlap_is_the_intersection_of_the_unions(kernels: list[tuple[int, int, str, int]]) -> None:
    ev = _events([_kernel(ts, dur, name, stream) for ts, dur, name, stream in kernels])
    comm = [(ts, ts + dur) for ts, dur, name, _ in kernels if name.startswith("nccl")]
    comp = [(ts, ts + dur) for ts, dur, name, _ in kernels if name == "gemm"]
    both = _measure(comm) + _measure(comp) - _measure(comm + comp)
    row = comm_comp_overlap(ev).row(0, named=True)
    assert (row["comm_ns"], row["overlap_ns"]) == (_measure(comm), both)


@settings(max_examples=100, deadline=None)
@given(_kernels)
def test_merged_intervals_are_disjoint_and_cover_the_same_time(kernels: list[tuple[int, int, str, int]]) -> None:
    frame = pl.DataFrame(
        {"rank": [0] * len(kernels), "ts_ns": [k[0] for k in kernels], "end_ns": [k[0] + k[1] for k in kernels]}
    )
    merged = merge_intervals(frame, ["rank"])
    starts, ends = merged["ts_ns"].to_list(), merged["end_ns"].to_list()
    assert all(e < s for e, s in zip(ends[:-1], starts[1:], strict=True))  # disjoint, not even touching
    assert sum(e - s for s, e in zip(starts, ends, strict=True)) == _measure([(k[0], k[0] + k[1]) for k in kernels])
