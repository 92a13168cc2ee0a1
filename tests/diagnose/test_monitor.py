"""StepMonitor: CPU timings add up, the timings file's wide format, lazy CUDA-event resolution, a 2-rank gather."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import polars as pl
import pytest

torch = pytest.importorskip("torch")

from gpufleet.diagnose import monitor as monitor_mod  # noqa: E402
from gpufleet.diagnose.monitor import TOTAL, StepMonitor  # noqa: E402
from gpufleet.diagnose.workload import free_port  # noqa: E402
from gpufleet.errors import ConfigError  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_cpu_sections_add_up_to_the_step(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    mon = StepMonitor(every=100, out=out, device="cpu")
    for _ in range(4):
        with mon.section("a"):
            _spin(0.004)
        with mon.section("b"):
            _spin(0.008)
        mon.step()
    mon.close()
    df = pl.read_csv(out)
    assert df.columns == ["rank", "step", "a", "b", TOTAL]
    assert df["step"].to_list() == [0, 1, 2, 3] and set(df["rank"]) == {0}
    assert (df["a"] >= 0.004).all() and (df["b"] >= 0.008).all()
    gap = df[TOTAL] - df["a"] - df["b"]  # the loop does nothing outside the two sections
    assert (gap >= 0).all() and gap.median() < 0.005  # median: a busy CI machine may preempt us anywhere


def test_sections_accumulate_within_a_step(tmp_path: Path) -> None:
    mon = StepMonitor(every=100, out=tmp_path / "t.csv", device="cpu")
    for _ in range(3):
        with mon.section("a"):
            _spin(0.002)
    mon.step()
    mon.close()
    assert pl.read_csv(tmp_path / "t.csv")["a"][0] >= 0.006


def test_flush_every_n_steps_appends_without_repeating_the_header(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    mon = StepMonitor(every=2, out=out, device="cpu")
    for i in range(5):
        with mon.section("fwd"):
            pass
        mon.step()
        written = len(pl.read_csv(out)) if out.exists() else 0
        assert written == 2 * ((i + 1) // 2)  # rows reach the file only at every 2nd step
    mon.close()
    assert pl.read_csv(out)["step"].to_list() == [0, 1, 2, 3, 4]
    assert out.read_text().count("rank,step") == 1


def test_a_new_section_widens_the_file(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    mon = StepMonitor(every=1, out=out, device="cpu")
    for i in range(3):
        with mon.section("fwd"):
            pass
        if i == 2:
            with mon.section("eval"):
                pass
        mon.step()
    mon.close()
    df = pl.read_csv(out)
    assert df.columns == ["rank", "step", "fwd", "eval", TOTAL]
    assert df["eval"].null_count() == 2 and df["eval"][2] is not None


def test_parquet_output_and_no_output(tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    with StepMonitor(every=2, out=out, device="cpu") as mon:
        for _ in range(3):
            with mon.section("fwd"):
                pass
            mon.step()
    assert pl.read_parquet(out)["step"].to_list() == [0, 1, 2]
    with StepMonitor(every=1, device="cpu") as mon:  # out=None: timing only, nothing written
        mon.step()


def test_bad_arguments_raise_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\.csv or \.parquet"):
        StepMonitor(out=tmp_path / "t.txt")
    with pytest.raises(ConfigError, match="every"):
        StepMonitor(every=0)
    with pytest.raises(ConfigError, match="device"):
        StepMonitor(device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA"):
            StepMonitor(device="cuda")


class _FakeEvent:
    """A CUDA event on one stream: completes, in order, once ``lag`` later events have been recorded."""

    made = 0
    recorded = 0
    synced = 0
    lag = 6

    def __init__(self, enable_timing: bool = True) -> None:
        _FakeEvent.made += 1
        self.t, self.seq = 0.0, 0

    def record(self) -> None:
        _FakeEvent.recorded += 1
        self.t, self.seq = time.perf_counter(), _FakeEvent.recorded

    def query(self) -> bool:
        return self.seq <= max(_FakeEvent.recorded - _FakeEvent.lag, _FakeEvent.synced)

    def synchronize(self) -> None:
        _FakeEvent.synced = max(_FakeEvent.synced, self.seq)

    def elapsed_time(self, end: _FakeEvent) -> float:
        assert self.query() and end.query(), "elapsed_time on an event that has not completed"
        return (end.t - self.t) * 1e3


def test_cuda_path_resolves_events_lazily_and_reuses_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda = type("C", (), {"Event": _FakeEvent, "is_available": staticmethod(lambda: True)})
    fake_torch = type("T", (), {"cuda": fake_cuda, "distributed": torch.distributed, "profiler": torch.profiler})
    monkeypatch.setattr(monitor_mod, "_torch", lambda: fake_torch)
    _FakeEvent.made = 0
    out = tmp_path / "t.csv"
    mon = StepMonitor(every=50, out=out, device="cuda")
    for _ in range(20):
        with mon.section("fwd"):
            _spin(0.002)
        with mon.section("bwd"):
            _spin(0.001)
        mon.step()
    assert mon._pending, "events still running must not be waited for on the hot path"
    assert _FakeEvent.made < 20 * 5, "resolved steps give their events back to the pool"
    mon.close()
    df = pl.read_csv(out)
    assert df["step"].to_list() == list(range(20))
    assert (df["fwd"] >= 0.002).all() and (df["bwd"] >= 0.001).all()
    assert (df[TOTAL][1:] >= df["fwd"][1:] + df["bwd"][1:]).all()


_WORKER = textwrap.dedent(
    """
    import os, sys, time
    import torch.distributed as dist
    from gpufleet.diagnose.monitor import StepMonitor
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mon = StepMonitor(every=3, out=sys.argv[1])
    for step in range(7):
        with mon.section("compute"):
            time.sleep(0.002 + 0.01 * rank)
        with mon.section("comm"):
            dist.barrier()
        mon.step()
    mon.close()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # skip teardown, which gloo's threads can abort ("terminate called without an active exception")
    """
)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_rank_gloo_gather_writes_every_rank_and_step(tmp_path: Path) -> None:
    out = tmp_path / "timings.csv"
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    port = str(free_port())
    base = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(out)],
            env={**base, "RANK": str(r), "WORLD_SIZE": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    for p in procs:
        text, _ = p.communicate(timeout=120)
        assert p.returncode == 0, text
    df = pl.read_csv(out)
    assert df.columns == ["rank", "step", "compute", "comm", TOTAL]
    assert len(df) == 14 and sorted(set(df["rank"])) == [0, 1]
    assert df.filter(pl.col("rank") == 1)["step"].to_list() == list(range(7))
    med = df.group_by("rank").agg(pl.col("compute").median()).sort("rank")["compute"].to_list()
    assert med[1] > med[0] + 0.005  # rank 1 sleeps 10 ms longer per step


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_events_time_gpu_work(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    a = torch.randn(2048, 2048, device="cuda")
    mon = StepMonitor(every=4, out=out, device="cuda")
    for _ in range(6):
        with mon.section("matmul"):
            for _ in range(8):
                a = (a @ a).clamp_(-1, 1)
        mon.step()
    mon.close()
    df = pl.read_csv(out)
    assert df["step"].to_list() == list(range(6))
    assert (df["matmul"] > 0).all() and (df[TOTAL] >= df["matmul"] * 0.99).all()
