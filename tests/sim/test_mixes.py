"""DeepShare-style job mixes: determinism, per-intensity model shares, durations, arrivals, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import typer
from typer.testing import CliRunner

from gpufleet.errors import TraceError
from gpufleet.perf.contention import DEEPSHARE_MODELS, ContentionModel
from gpufleet.sim.mixes import (
    DEMANDS,
    MIX_MODELS,
    default_rate_per_h,
    generate_mix,
    mean_gpu_hours,
    mix_weights,
)
from gpufleet.traces.schema import CANONICAL_COLUMNS, POLARS_SCHEMA


def _share(frame: pl.DataFrame, models: tuple[str, ...]) -> float:
    return frame.filter(pl.col("model").is_in(list(models))).height / frame.height


def test_models_are_deepshare_workloads() -> None:
    assert MIX_MODELS == DEEPSHARE_MODELS


def test_same_seed_same_frame_other_seed_other_frame() -> None:
    a = generate_mix("random", jobs=300, seed=7, arrival="poisson")
    b = generate_mix("random", jobs=300, seed=7, arrival="poisson")
    c = generate_mix("random", jobs=300, seed=8, arrival="poisson")
    assert a.equals(b)
    assert not a.equals(c)


def test_frame_is_canonical_with_a_model_column() -> None:
    frame = generate_mix(jobs=50)
    assert frame.columns == [*CANONICAL_COLUMNS, "model"]
    assert dict(frame.schema) == {**POLARS_SCHEMA, "model": pl.String()}
    assert frame["job_id"].n_unique() == 50
    assert frame["kind"].unique().to_list() == ["train"]
    assert frame.select(pl.col("gpu_type", "user", "vc").null_count().sum()).row(0) == (50, 50, 50)
    assert set(frame["num_gpus"].unique()) <= set(DEMANDS)
    assert set(frame["model"].unique()) <= set(MIX_MODELS)
    empty = generate_mix(jobs=0)
    assert empty.height == 0 and empty.columns == frame.columns


def test_intensity_shifts_the_model_shares() -> None:
    heavy = generate_mix("heavy", jobs=2000, seed=1)
    light = generate_mix("light", jobs=2000, seed=1)
    medium = generate_mix("medium", jobs=2000, seed=1)
    big = ("FSDP", "MoE")
    assert _share(heavy, big) > _share(light, big) + 0.2
    # upstream's ratios: the favoured pair gets 0.25 + 0.25, the other four 0.125 each
    assert _share(heavy, big) == pytest.approx(0.5, abs=0.04)
    assert _share(light, ("MobileNetV3", "GraphSage")) == pytest.approx(0.5, abs=0.04)
    assert _share(medium, ("Transformer-XL", "DLRM")) == pytest.approx(0.5, abs=0.04)
    assert _share(light, big) == pytest.approx(0.25, abs=0.04)


def test_aliases_and_bad_intensity() -> None:
    assert generate_mix("low", jobs=40, seed=2).equals(generate_mix("light", jobs=40, seed=2))
    assert generate_mix("MED", jobs=40, seed=2).equals(generate_mix("medium", jobs=40, seed=2))
    with pytest.raises(TraceError, match=r"unknown intensity 'extreme'.*light, medium, heavy"):
        generate_mix("extreme")


def test_weights_follow_upstream() -> None:
    models, demands = mix_weights("heavy", seed=0)
    assert models == {
        "MobileNetV3": 0.125,
        "GraphSage": 0.125,
        "FSDP": 0.25,
        "Transformer-XL": 0.125,
        "DLRM": 0.125,
        "MoE": 0.25,
    }
    # per-trace multinomial(100, 1/3) demand weights, shared by every intensity for one seed
    assert list(demands) == list(DEMANDS) and sum(demands.values()) == pytest.approx(1.0)
    assert all(abs(w * 100 - round(w * 100)) < 1e-9 for w in demands.values())
    assert mix_weights("light", seed=0)[1] == demands
    random_a, _ = mix_weights("random", seed=0)
    random_b, _ = mix_weights("random", seed=1)
    assert random_a != random_b and sum(random_a.values()) == pytest.approx(1.0)
    assert all(abs(w * 100 - round(w * 100)) < 1e-9 for w in random_a.values())


def test_durations_are_the_contention_models() -> None:
    model = ContentionModel.default()
    for gpn in (8, 2):
        frame = generate_mix("equal", jobs=400, seed=3, gpus_per_node=gpn)
        pairs = frame.select("model", "num_gpus", "duration_s").unique()
        assert pairs.height == 18
        for name, gpus, duration in pairs.iter_rows():
            assert duration == model.duration_s(name, gpus, gpn)


def test_batch_arrivals_are_at_zero() -> None:
    assert generate_mix(jobs=64)["submit_s"].to_list() == [0.0] * 64
    with pytest.raises(TraceError, match="poisson"):
        generate_mix(jobs=4, rate_per_h=3.0)


def test_poisson_arrivals_increase_at_the_requested_rate() -> None:
    frame = generate_mix("heavy", jobs=2000, seed=4, arrival="poisson", rate_per_h=20.0)
    submit = frame["submit_s"].to_numpy()
    assert (np.diff(submit) > 0).all() and submit[0] > 0
    observed = 2000 / (submit[-1] / 3600.0)
    assert observed == pytest.approx(20.0, rel=0.1)


def test_default_poisson_rate_offers_full_load_on_32_gpus() -> None:
    rate = default_rate_per_h("equal", seed=0)
    assert rate * mean_gpu_hours("equal", seed=0) == pytest.approx(32.0)
    assert 5.0 < rate < 20.0
    frame = generate_mix("equal", jobs=2000, seed=0, arrival="poisson")
    observed = 2000 / (frame["submit_s"].max() / 3600.0)
    assert observed == pytest.approx(rate, rel=0.1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"jobs": -1}, "jobs must be"),
        ({"arrival": "fitted"}, "unknown arrival"),
        ({"arrival": "poisson", "rate_per_h": 0.0}, "rate_per_h must be"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"seed": -3}, "seed must be"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(TraceError, match=match):
        generate_mix(**kwargs)


def _cli() -> typer.Typer:
    from gpufleet.cli import app

    return app


def test_cli_writes_parquet_that_loads_with_its_model_column(tmp_path: Path) -> None:
    from gpufleet.traces import load_trace

    out = tmp_path / "mix.parquet"
    result = CliRunner().invoke(
        _cli(),
        ["traces", "mix", "-o", str(out), "--intensity", "low", "--jobs", "32", "--arrival", "poisson", "--json"],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["jobs"] == 32 and summary["intensity"] == "light"
    assert summary["rate_per_h"] == pytest.approx(default_rate_per_h("light", 0))
    loaded = load_trace(out).jobs
    assert loaded.equals(generate_mix("light", jobs=32, arrival="poisson").sort(["submit_s", "job_id"]))
    assert sum(summary["models"].values()) == 32


def test_cli_rejects_a_non_parquet_output(tmp_path: Path) -> None:
    result = CliRunner().invoke(_cli(), ["traces", "mix", "-o", str(tmp_path / "mix.csv")])
    assert isinstance(result.exception, TraceError)
    assert "Parquet" in str(result.exception)
