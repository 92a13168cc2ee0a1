"""Model names -> DeepShare communication profiles and volume scales; profile assignment to job frames."""

from __future__ import annotations

import math

import polars as pl
import pytest

from gpufleet.errors import ConfigError, TraceError
from gpufleet.perf.comm_profiles import (
    REFERENCE_PARAMS,
    SCALE_MAX,
    SCALE_MIN,
    assign_profiles,
    comm_scale,
    params_from_name,
    parse_mix,
    profile_for_model,
)
from gpufleet.perf.contention import DEEPSHARE_MODELS
from gpufleet.perf.flops import param_count
from gpufleet.perf.model_spec import get_model


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("gpt3-1.3b", "Transformer-XL"),
        ("llama2-7b", "Transformer-XL"),
        ("bert-large", "Transformer-XL"),
        ("megatron-1t", "Transformer-XL"),  # catalog alias, no keyword needed
        ("resnet50", "MobileNetV3"),
        ("EfficientNet-B0", "MobileNetV3"),
        ("mixtral-8x7b", "MoE"),
        ("switch-transformer-base", "MoE"),
        ("dlrm", "DLRM"),
        ("deepfm", "DLRM"),
        ("graphsage-reddit", "GraphSage"),
        ("gcn", "GraphSage"),
        ("llama2-7b-fsdp", "FSDP"),
        ("gpt-zero3", "FSDP"),
        ("MoE", "MoE"),
        ("transformer_xl", "Transformer-XL"),
    ],
)
def test_names_map_to_their_communication_pattern(name: str, profile: str) -> None:
    found = profile_for_model(name)
    assert found is not None and found[0] == profile


@pytest.mark.parametrize("name", [None, "", "   ", "unknown-job", "xyz-7b", "negative", "zero-shot"])
def test_unknown_names_give_none(name: str | None) -> None:
    assert profile_for_model(name) is None


def test_deepshare_workloads_map_to_themselves_at_scale_one() -> None:
    for name in DEEPSHARE_MODELS:
        assert profile_for_model(name) == (name, 1.0)
    assert set(REFERENCE_PARAMS) == set(DEEPSHARE_MODELS)


def test_parameters_from_the_catalog_else_the_name() -> None:
    expected = math.sqrt(param_count(get_model("gpt3-1.3b")) / REFERENCE_PARAMS["Transformer-XL"])
    assert profile_for_model("gpt3-1.3b") == ("Transformer-XL", pytest.approx(expected))
    assert params_from_name("opt-350m") == pytest.approx(3.5e8)
    assert params_from_name("Pythia-1.3B-deduped") == pytest.approx(1.3e9)
    assert params_from_name("mixtral-8x7b") == pytest.approx(5.6e10)
    assert params_from_name("llama-7b-32k") == pytest.approx(7e9)  # "k" is a context length
    assert params_from_name("resnet50") is None
    assert profile_for_model("resnet50") == ("MobileNetV3", 1.0)  # no size known: scale 1


def test_scale_is_monotone_in_parameters_and_clipped() -> None:
    ref = REFERENCE_PARAMS["Transformer-XL"]
    params = [ref / 1e3, ref / 20, ref / 4, ref, ref * 4, ref * 15, ref * 1e3]
    scales = [comm_scale("Transformer-XL", p) for p in params]
    assert scales == sorted(scales)
    assert scales[0] == SCALE_MIN and scales[-1] == SCALE_MAX
    assert comm_scale("Transformer-XL", ref * 4) == pytest.approx(2.0)
    assert comm_scale("Transformer-XL", None) == 1.0
    names = ["gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b"]
    by_name = [profile_for_model(n)[1] for n in names]  # type: ignore[index]
    assert by_name == sorted(by_name) and by_name[0] < by_name[-1]
    with pytest.raises(ConfigError, match="unknown communication profile"):
        comm_scale("ResNet", 1e6)


def _jobs(models: list[str | None] | None) -> pl.DataFrame:
    gpus = [1, 2, 4, 8, 16, 8]
    frame = pl.DataFrame({"job_id": [f"j{i}" for i in range(6)], "num_gpus": pl.Series(gpus, dtype=pl.Int32)})
    return frame if models is None else frame.with_columns(pl.Series("model", models, dtype=pl.String))


def test_assign_with_a_model_column() -> None:
    out = assign_profiles(_jobs(["llama2-7b", "llama2-7b", "mixtral-8x7b", None, "mystery", "MoE"]), seed=3)
    assert out.schema["comm_profile"] == pl.String and out.schema["comm_scale"] == pl.Float64
    prof, scale = out["comm_profile"].to_list(), out["comm_scale"].to_list()
    assert prof[0] is None and scale[0] == 0.0  # one GPU: never crosses a node
    assert prof[1:3] == ["Transformer-XL", "MoE"] and scale[1:3] == [SCALE_MAX, SCALE_MAX]
    assert prof[3] in DEEPSHARE_MODELS and prof[4] in DEEPSHARE_MODELS  # null and unknown: drawn
    assert scale[3:5] == [1.0, 1.0]
    assert (prof[5], scale[5]) == ("MoE", 1.0)
    assert out.drop("comm_profile", "comm_scale").equals(
        _jobs(["llama2-7b", "llama2-7b", "mixtral-8x7b", None, "mystery", "MoE"])
    )


def test_assign_without_a_model_column_draws_from_the_mix() -> None:
    jobs = pl.DataFrame({"num_gpus": pl.Series([1] * 10 + [4] * 990, dtype=pl.Int32)})
    out = assign_profiles(jobs, parse_mix("FSDP=1,MoE=3"), seed=5)
    assert out["comm_profile"].null_count() == 10
    assert out.filter(pl.col("num_gpus") == 1)["comm_scale"].to_list() == [0.0] * 10
    counts = dict(out["comm_profile"].drop_nulls().value_counts().iter_rows())
    assert set(counts) == {"FSDP", "MoE"}
    assert counts["MoE"] / 990 == pytest.approx(0.75, abs=0.05)
    assert out.equals(assign_profiles(jobs, {"FSDP": 0.25, "MoE": 0.75}, seed=5))
    default = assign_profiles(jobs, seed=5)["comm_profile"].drop_nulls()
    assert set(default.unique()) == set(DEEPSHARE_MODELS)


def test_assign_replaces_old_columns_and_needs_num_gpus() -> None:
    jobs = _jobs(["dlrm"] * 6).with_columns(pl.lit("MoE").alias("comm_profile"), pl.lit(9.0).alias("comm_scale"))
    out = assign_profiles(jobs)
    assert out.columns.count("comm_profile") == 1
    assert out["comm_profile"].to_list() == [None] + ["DLRM"] * 5
    with pytest.raises(TraceError, match="num_gpus"):
        assign_profiles(pl.DataFrame({"model": ["dlrm"]}))


def test_parse_mix() -> None:
    assert parse_mix("FSDP=0.5,MoE=0.5") == {"FSDP": 0.5, "MoE": 0.5}
    assert parse_mix(" transformer-xl = 3 , dlrm=1 ") == {"Transformer-XL": 0.75, "DLRM": 0.25}
    for bad, match in [
        ("", "empty"),
        ("FSDP", "malformed"),
        ("ResNet=1", "unknown profile"),
        ("FSDP=1,fsdp=2", "twice"),
        ("MoE=x", "not a number"),
        ("MoE=-1", "non-negative"),
        ("MoE=0", "not all zero"),
        ("MoE=nan", "finite"),
    ]:
        with pytest.raises(ConfigError, match=match):
            parse_mix(bad)
