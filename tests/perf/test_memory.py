"""Activation and optimizer-state memory against Korthikanti 2022 and Megatron's distributed-optimizer table."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.perf.memory import activation_bytes_per_token_layer, state_bytes_per_param
from gpufleet.perf.model_spec import get_model, load_model

NONE, SELECTIVE, FULL = 0, 1, 2


def _act(model, seq, tp, code, sp, flash):
    return float(activation_bytes_per_token_layer(model, seq, np.asarray(tp), np.asarray(code), sp, flash))


@pytest.mark.parametrize("name", ["gpt3-175b", "gpt-22b", "gpt-1t", "gpt3-1.3b"])
def test_korthikanti_no_parallelism(name: str) -> None:
    m = get_model(name)
    s, b, h, a = m.seq, 1, m.hidden, m.heads
    per_layer = s * b * h * (34 + 5 * a * s / h)  # bytes, Korthikanti eq. 1
    assert _act(m, s, 1, NONE, False, False) == pytest.approx(per_layer / (b * s), rel=1e-12)
    # sequence parallelism changes nothing at TP = 1
    assert _act(m, s, 1, NONE, True, False) == pytest.approx(per_layer / (b * s), rel=1e-12)


def test_korthikanti_by_hand_175b() -> None:
    m = get_model("gpt3-175b")
    # 34·12288 + 5·96·2048 bytes per token per layer
    assert _act(m, 2048, 1, NONE, False, False) == 417_792 + 983_040


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_with_sequence_parallel(tp: int) -> None:
    m = get_model("gpt3-175b")
    h, a, s = m.hidden, m.heads, m.seq
    assert _act(m, s, tp, NONE, True, False) == pytest.approx(34 * h / tp + 5 * a * s / tp, rel=1e-12)


@pytest.mark.parametrize("tp", [2, 8])
def test_tp_without_sequence_parallel(tp: int) -> None:
    # Korthikanti eq. 2: s·b·h·(10 + 24/t + 5·a·s/(h·t))
    m = get_model("gpt-22b")
    h, a, s = m.hidden, m.heads, m.seq
    assert _act(m, s, tp, NONE, False, False) == pytest.approx(h * (10 + 24 / tp) + 5 * a * s / tp, rel=1e-12)


@pytest.mark.parametrize("tp", [1, 4, 8])
def test_selective_drops_score_term(tp: int) -> None:
    m = get_model("gpt3-175b")
    h = m.hidden
    assert _act(m, m.seq, tp, SELECTIVE, True, False) == pytest.approx(34 * h / tp, rel=1e-12)
    assert _act(m, m.seq, tp, SELECTIVE, False, False) == pytest.approx(h * (10 + 24 / tp), rel=1e-12)


def test_flash_drops_score_term_like_selective() -> None:
    m = get_model("gpt3-175b")
    for tp in (1, 8):
        assert _act(m, m.seq, tp, NONE, True, True) == _act(m, m.seq, tp, SELECTIVE, True, False)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_full_recompute_keeps_layer_input(tp: int) -> None:
    m = get_model("gpt3-175b")
    assert _act(m, m.seq, tp, FULL, True, False) == pytest.approx(2 * m.hidden / tp, rel=1e-12)
    assert _act(m, m.seq, tp, FULL, False, False) == pytest.approx(2 * m.hidden, rel=1e-12)


def test_ordering_full_selective_none() -> None:
    m = get_model("llama3-70b")
    full, sel, none = (_act(m, m.seq, 8, code, True, False) for code in (FULL, SELECTIVE, NONE))
    assert full < sel < none


def test_gqa_shrinks_kv_activations() -> None:
    mha = load_model(None, layers=2, hidden=4096, heads=32, vocab=100, seq=4096)
    gqa = mha.with_overrides(kv_heads=8)
    # K and V: 2 bytes x 2 tensors x (h - kv_width) less per token
    diff = _act(mha, 4096, 1, SELECTIVE, False, False) - _act(gqa, 4096, 1, SELECTIVE, False, False)
    assert diff == pytest.approx(4 * (4096 - 1024), rel=1e-12)


def test_vectorised_over_tp_and_recompute() -> None:
    m = get_model("gpt3-175b")
    tp = np.array([1, 2, 4, 8])
    code = np.array([NONE, SELECTIVE, FULL, NONE])
    out = activation_bytes_per_token_layer(m, 2048, tp, code, True, False)
    h, a, s = 12288, 96, 2048
    expected = [34 * h + 5 * a * s, 34 * h / 2, 2 * h / 4, 34 * h / 8 + 5 * a * s / 8]
    np.testing.assert_allclose(out, expected, rtol=1e-12)


@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_state_bytes_per_param(d: int) -> None:
    assert float(state_bytes_per_param(0, np.asarray(d))) == 18.0
    assert float(state_bytes_per_param(1, np.asarray(d))) == pytest.approx(6 + 12 / d)
    assert float(state_bytes_per_param(2, np.asarray(d))) == pytest.approx(2 + 16 / d)
    assert float(state_bytes_per_param(3, np.asarray(d))) == pytest.approx(18 / d)


def test_state_bytes_all_equal_without_data_parallelism() -> None:
    values = {float(state_bytes_per_param(z, np.asarray(1))) for z in (0, 1, 2, 3)}
    assert values == {18.0}


def test_state_bytes_vectorised_and_ordered() -> None:
    d = np.array([2, 4, 16, 128])
    z = [state_bytes_per_param(k, d) for k in range(4)]
    assert all(arr.shape == (4,) for arr in z)
    assert np.all(z[0] > z[1]) and np.all(z[1] > z[2]) and np.all(z[2] > z[3])
    np.testing.assert_allclose(z[1], [12, 9, 6.75, 6.09375])
