"""The model catalog and ``load_model``: shapes, aliases, files, overrides and validation errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.errors import SpecError
from gpufleet.perf.model_spec import ModelSpec, get_model, load_model, model_names

SMALL = {"layers": 4, "hidden": 256, "heads": 8, "vocab": 1000}


def test_gpt3_175b_shape() -> None:
    m = get_model("gpt3-175b")
    assert (m.layers, m.hidden, m.heads, m.vocab, m.seq) == (96, 12288, 96, 51200, 2048)
    assert m.head_dim == 128
    assert m.kv_heads_eff == 96
    assert m.ffn == 4 * 12288
    assert m.kv_width == 12288


def test_llama3_405b_shape() -> None:
    m = get_model("llama3-405b")
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn) == (126, 16384, 128, 8, 53248)
    assert m.head_dim == 128
    assert m.kv_width == 8 * 128
    assert m.glu and not m.bias and not m.tied_embeddings


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [("GPT3", "gpt3-175b"), ("gpt3", "gpt3-175b"), ("llama3.1-405b", "llama3-405b"), ("MT-NLG-530B", "gpt-529.6b")],
)
def test_alias_lookup(alias: str, canonical: str) -> None:
    assert get_model(alias).name == canonical


def test_catalog_names_sorted_and_complete() -> None:
    names = model_names()
    assert names == sorted(names)
    for required in ("gpt3-175b", "gpt-22b", "gpt-1t", "llama2-7b", "llama3-405b", "gpt3-1.3b"):
        assert required in names


def test_unknown_name_suggests_closest() -> None:
    with pytest.raises(SpecError, match=r"did you mean 'gpt3-175b'"):
        get_model("gpt3-175")


def test_unknown_name_via_load_model() -> None:
    with pytest.raises(SpecError, match=r"llama3-405b"):
        load_model("lama3-405b")


def test_load_model_json(tmp_path: Path) -> None:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"name": "tiny", **SMALL, "kv_heads": 2, "glu": True}), encoding="utf-8")
    m = load_model(path)
    assert m.name == "tiny"
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.vocab) == (4, 256, 8, 2, 1000)
    assert m.glu
    assert m.kv_width == 2 * 32
    # a str path works too
    assert load_model(str(path)) == m


def test_load_model_toml(tmp_path: Path) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(
        'name = "tiny-toml"\nlayers = 6\nhidden = 512\nheads = 8\nvocab = 32000\nseq = 1024\nnorm = "rmsnorm"\n',
        encoding="utf-8",
    )
    m = load_model(path)
    assert (m.name, m.layers, m.hidden, m.heads) == ("tiny-toml", 6, 512, 8)
    assert (m.vocab, m.seq, m.norm) == (32000, 1024, "rmsnorm")


def test_file_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(SMALL), encoding="utf-8")
    m = load_model(path, layers=12, seq=512)
    assert (m.layers, m.hidden, m.seq) == (12, 256, 512)


def test_missing_json_file_raises(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="not found"):
        load_model(tmp_path / "nope.json")


def test_bad_json_raises(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{layers: 4", encoding="utf-8")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_model(path)


def test_unknown_field_in_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "extra.json"
    path.write_text(json.dumps({**SMALL, "hiden": 7}), encoding="utf-8")
    with pytest.raises(SpecError, match="hiden"):
        load_model(path)


def test_explicit_seq_override_wins() -> None:
    base = get_model("gpt3-175b")
    m = load_model("gpt3-175b", seq=4096)
    assert m.seq == 4096
    assert (m.layers, m.hidden, m.heads, m.vocab) == (base.layers, base.hidden, base.heads, base.vocab)
    assert m.name == "gpt3-175b"  # a sequence-length change keeps the name
    assert base.seq == 2048  # the catalog entry is untouched


def test_shape_override_marks_name() -> None:
    m = load_model("gpt3-175b", layers=48, seq=None)
    assert m.layers == 48
    assert m.name == "gpt3-175b*"
    assert m.aliases == ()


def test_none_overrides_are_ignored() -> None:
    assert load_model("gpt3-175b", layers=None, hidden=None) == get_model("gpt3-175b")


def test_flags_only_full_shape() -> None:
    m = load_model(None, **SMALL, seq=128)
    assert isinstance(m, ModelSpec)
    assert (m.layers, m.hidden, m.heads, m.vocab, m.seq) == (4, 256, 8, 1000, 128)
    assert m.name == "custom"


def test_flags_only_incomplete_names_missing() -> None:
    with pytest.raises(SpecError) as info:
        load_model(None, layers=4, hidden=256)
    msg = str(info.value)
    assert "--heads" in msg and "--vocab" in msg
    assert "--layers" not in msg and "--hidden" not in msg


def test_flags_only_none_counts_as_missing() -> None:
    with pytest.raises(SpecError, match="--vocab"):
        load_model(None, layers=4, hidden=256, heads=8, vocab=None)


def test_hidden_not_multiple_of_heads() -> None:
    with pytest.raises(SpecError, match="multiple of heads"):
        load_model(None, layers=2, hidden=100, heads=8, vocab=10)


@pytest.mark.parametrize("kv_heads", [3, 16])
def test_kv_heads_must_divide_heads(kv_heads: int) -> None:
    with pytest.raises(SpecError, match="kv_heads"):
        load_model(None, layers=2, hidden=64, heads=8, kv_heads=kv_heads, vocab=10)


def test_invalid_override_of_catalog_model() -> None:
    with pytest.raises(SpecError, match="multiple of heads"):
        load_model("gpt3-175b", heads=7)


@pytest.mark.parametrize("field", ["layers", "hidden", "vocab"])
def test_non_positive_shape_rejected(field: str) -> None:
    with pytest.raises(SpecError):
        load_model(None, **{**SMALL, field: 0})
