"""``diagnose diff``: per-op counts and times as HTA's TraceDiff counts them (checked against figures computed here
from the raw JSON of real traces), added/removed/slower ops, and the self-time deltas that explain a step change.
The comparison with HTA itself is bench/diagnose_diff_parity.py (HTA is not a test dependency)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest
from trace_builder import Fault, JobShape, write_job

from gpufleet.diagnose.diff import WAITING, diff_runs, op_totals
from gpufleet.diagnose.kineto import read_folder
from gpufleet.errors import DiagnoseError

KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"
SAMPLED = "trace_filter__sampled_rank-{}.json.gz"
_DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}


def _reference(path: Path) -> dict[tuple[int, str], tuple[int, float]]:
    """Per (step, name): count and total µs, from the raw events: host events by the step span holding their
    start, device events by the step of their launch (the runtime call with the same correlation id)."""
    with gzip.open(path, "rt") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X" and "dur" in e and e.get("cat")]
    steps = []
    for e in events:
        m = re.fullmatch(r"ProfilerStep#(\d+)", e["name"])
        if m:
            steps.append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), int(m.group(1))))

    def step_at(ts: float) -> int | None:
        return next((s for a, b, s in steps if a <= ts < b), None)

    on_stream = [e for e in events if e["cat"] in _DEVICE or (e.get("args") or {}).get("stream", -1) > 0]
    stream_ids = {id(e) for e in on_stream}
    launch = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if id(e) not in stream_ids and corr is not None:
            launch.setdefault(corr, step_at(float(e["ts"])))
    out: dict[tuple[int, str], list] = defaultdict(lambda: [0, 0.0])
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        step = launch.get(corr) if id(e) in stream_ids else step_at(float(e["ts"]))
        if step is not None:
            out[(step, e["name"])][0] += 1
            out[(step, e["name"])][1] += float(e["dur"])
    return {k: (v[0], v[1]) for k, v in out.items()}


@pytest.mark.parametrize("rank", [0, 1])
def test_op_totals_match_counts_and_times_computed_from_the_raw_trace(tmp_path, rank):
    folder = tmp_path / "t"
    folder.mkdir()
    shutil.copy(KINETO / SAMPLED.format(rank), folder)
    ours = op_totals(read_folder(folder).events)
    ref = _reference(folder / SAMPLED.format(rank))
    mine = {
        (r["step"], r["function"]): (r["calls"], r["total_ns"] / 1e3)
        for r in ours.group_by("step", "function").agg(pl.col("calls", "total_ns").sum()).iter_rows(named=True)
    }
    assert set(mine) == set(ref)
    assert ours["device"].any() and (~ours["device"]).any()  # kernels and host ops both counted
    for key, (count, us) in ref.items():
        assert mine[key][0] == count, key
        assert mine[key][1] == pytest.approx(us, rel=1e-6, abs=1e-3), key


def test_diff_names_the_slower_function_and_explains_the_step_change(tmp_path):
    control = write_job(tmp_path / "control", JobShape(noise=0.0))
    test = write_job(tmp_path / "test", JobShape(noise=0.0, faults=[Fault("compute", r, 0.012) for r in range(4)]))
    diff = diff_runs(control, test)
    assert diff.step_change_s == pytest.approx(0.012, rel=0.05)
    top = diff.ops.filter(pl.col("function") == "aten::mm").row(0, named=True)
    assert top["change"] == "slower" and top["test_calls_per_step"] == top["control_calls_per_step"] == 7
    assert top["delta_s_per_step"] == pytest.approx(0.012, rel=0.05)
    explains = diff.explain.filter(pl.col("explains"))
    assert explains["function"].to_list() == ["aten::mm"]
    assert explains["share_of_step_change"][0] == pytest.approx(1.0, abs=0.05)
    # self-time deltas add up to the step change: nothing is counted twice
    assert diff.explain["delta_s_per_step"].sum() == pytest.approx(diff.step_change_s, rel=1e-6)


def test_added_ops_and_waiting_moved_by_another_rank(tmp_path):
    control = write_job(tmp_path / "control", JobShape(noise=0.0))
    test = write_job(tmp_path / "test", JobShape(noise=0.0, faults=[Fault("data", 1, 0.02)]))
    diff = diff_runs(control, test)
    loader = diff.ops.filter(pl.col("function").str.starts_with("enumerate(DataLoader)")).row(0, named=True)
    assert loader["change"] == "slower"
    assert loader["delta_s_per_step"] == pytest.approx(0.02 / 4, rel=0.05)  # one rank of four
    explained = diff.explain.filter(pl.col("explains"))["function"].to_list()
    assert explained[0] == WAITING  # three ranks wait for the slow one: the largest share of the mean change
    assert any(f.startswith("enumerate(DataLoader)") for f in explained)
    synced = diff_runs(control, write_job(tmp_path / "sync", JobShape(noise=0.0, faults=[Fault("sync", 2, 0.006)])))
    item = synced.ops.filter(pl.col("function") == "aten::item").row(0, named=True)
    assert item["change"] == "added" and item["control_calls_per_step"] == 0
    assert synced.to_dict()["ops"][0]["function"] == synced.ops["function"][0]


def test_diff_of_an_empty_folder_is_an_error(tmp_path):
    control = write_job(tmp_path / "control", JobShape())
    with pytest.raises(DiagnoseError):
        diff_runs(control, tmp_path / "nothing")
