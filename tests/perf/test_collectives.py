"""Alpha-beta collective costs: ring closed forms, decompositions and the hierarchical split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.perf import collectives as coll

GB = 1e9
S = 1.5 * GB  # bytes
BW = 25 * GB  # bytes/s per rank per direction
ALPHA = 10e-6


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16, 64, 1024])
def test_ring_all_reduce_closed_form(n: int) -> None:
    expected = 2 * (n - 1) / n * S / BW + 2 * (n - 1) * ALPHA
    assert float(coll.ring_all_reduce(S, n, BW, ALPHA)) == pytest.approx(expected, rel=1e-12)


def test_ring_all_reduce_by_hand() -> None:
    # n = 4, 1 GB at 10 GB/s, alpha 1 ms: 2·3/4·0.1 s + 6 ms = 0.156 s
    assert float(coll.ring_all_reduce(1e9, 4, 10e9, 1e-3)) == pytest.approx(0.156, rel=1e-12)


def test_ring_all_reduce_vectorised() -> None:
    n = np.array([1, 2, 4, 8, 32])
    size = np.array([1e6, 1e7, 1e8, 1e9, 1e10])
    expected = 2 * (n - 1) / n * size / BW + 2 * (n - 1) * ALPHA
    out = coll.ring_all_reduce(size, n, BW, ALPHA)
    assert out.shape == (5,)
    np.testing.assert_allclose(out, expected, rtol=1e-12)


def test_ring_all_reduce_broadcasts() -> None:
    n = np.array([2, 8])[:, None]
    size = np.array([1e6, 1e9])[None, :]
    out = coll.ring_all_reduce(size, n, BW, ALPHA)
    assert out.shape == (2, 2)
    assert out[1, 1] == pytest.approx(2 * 7 / 8 * 1e9 / BW + 14 * ALPHA, rel=1e-12)


@pytest.mark.parametrize("n", [2, 5, 8, 128])
def test_reduce_scatter_and_all_gather_closed_form(n: int) -> None:
    expected = (n - 1) / n * S / BW + (n - 1) * ALPHA
    assert float(coll.reduce_scatter(S, n, BW, ALPHA)) == pytest.approx(expected, rel=1e-12)
    assert float(coll.all_gather(S, n, BW, ALPHA)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 8, 96])
def test_reduce_scatter_plus_all_gather_is_all_reduce(n: int) -> None:
    rs_ag = coll.reduce_scatter(S, n, BW, ALPHA) + coll.all_gather(S, n, BW, ALPHA)
    assert float(rs_ag) == pytest.approx(float(coll.ring_all_reduce(S, n, BW, ALPHA)), rel=1e-12, abs=0)


def test_group_of_one_costs_nothing() -> None:
    assert float(coll.ring_all_reduce(S, 1, BW, ALPHA)) == 0.0
    assert float(coll.reduce_scatter(S, 1, BW, ALPHA)) == 0.0
    assert float(coll.all_gather(S, 1, BW, ALPHA)) == 0.0
    assert float(coll.hierarchical_all_reduce(S, 1, 8, 10 * BW, BW, ALPHA, ALPHA)) == 0.0


def test_p2p() -> None:
    assert float(coll.p2p(1e9, 50e9, 5e-6)) == pytest.approx(0.02 + 5e-6, rel=1e-12)


@pytest.mark.parametrize("n", [2, 8])
def test_hierarchical_all_in_one_node_is_intra_ring(n: int) -> None:
    hier = coll.hierarchical_all_reduce(S, n, n, 10 * BW, BW, 3e-6, 50e-6)
    assert float(hier) == pytest.approx(float(coll.ring_all_reduce(S, n, 10 * BW, 3e-6)), rel=1e-12)
    rs = coll.hierarchical_reduce_scatter(S, n, n, 10 * BW, BW, 3e-6, 50e-6)
    assert float(rs) == pytest.approx(float(coll.reduce_scatter(S, n, 10 * BW, 3e-6)), rel=1e-12)


@pytest.mark.parametrize("n", [2, 16, 64])
def test_hierarchical_one_per_node_is_inter_ring(n: int) -> None:
    hier = coll.hierarchical_all_reduce(S, n, 1, 10 * BW, BW, 3e-6, 50e-6)
    assert float(hier) == pytest.approx(float(coll.ring_all_reduce(S, n, BW, 50e-6)), rel=1e-12)
    ag = coll.hierarchical_all_gather(S, n, 1, 10 * BW, BW, 3e-6, 50e-6)
    assert float(ag) == pytest.approx(float(coll.all_gather(S, n, BW, 50e-6)), rel=1e-12)


def test_hierarchical_by_hand_and_cheaper_than_flat() -> None:
    n, g, inter = 64, 8, BW
    intra = 10 * inter
    hier = float(coll.hierarchical_all_reduce(S, n, g, intra, inter))
    # RS + AG inside the node over NVLink, then an all-reduce of S/8 across 8 nodes
    expected = 2 * (7 / 8) * S / intra + 2 * (7 / 8) * (S / 8) / inter
    assert hier == pytest.approx(expected, rel=1e-12)
    flat = float(coll.ring_all_reduce(S, n, inter))
    assert hier < flat
    assert flat / hier == pytest.approx((2 * 63 / 64) / (0.175 + 0.21875), rel=1e-12)


def test_hierarchical_vectorised_matches_scalar() -> None:
    ns = np.array([8, 16, 64, 256])
    out = coll.hierarchical_all_reduce(S, ns, 8, 10 * BW, BW, ALPHA, 2 * ALPHA)
    for n, value in zip(ns, out, strict=True):
        assert value == pytest.approx(float(coll.hierarchical_all_reduce(S, int(n), 8, 10 * BW, BW, ALPHA, 2 * ALPHA)))


@given(
    small=st.floats(min_value=0.0, max_value=1e11, allow_nan=False),
    extra=st.floats(min_value=0.0, max_value=1e11, allow_nan=False),
    n=st.integers(min_value=1, max_value=4096),
    per_node=st.integers(min_value=1, max_value=16),
    alpha=st.floats(min_value=0.0, max_value=1e-3),
)
def test_costs_non_negative_and_monotone_in_size(
    small: float, extra: float, n: int, per_node: int, alpha: float
) -> None:
    large = small + extra
    for fn in (coll.ring_all_reduce, coll.reduce_scatter, coll.all_gather):
        lo, hi = float(fn(small, n, BW, alpha)), float(fn(large, n, BW, alpha))
        assert 0.0 <= lo <= hi
    lo = float(coll.hierarchical_all_reduce(small, n, per_node, 10 * BW, BW, alpha, alpha))
    hi = float(coll.hierarchical_all_reduce(large, n, per_node, 10 * BW, BW, alpha, alpha))
    assert 0.0 <= lo <= hi
    # never more than the flat ring over the slow links when the fast links are 10x faster
    if n % per_node == 0:
        assert lo <= float(coll.ring_all_reduce(small, n, BW, alpha)) * (1 + 1e-12) + 1e-15
