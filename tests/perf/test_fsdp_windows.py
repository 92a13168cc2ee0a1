"""FSDP hides each layer's weight gather behind the previous layer's forward: with full recompute that forward is
a quarter of the layer's time (the backward runs it again), not a third."""

from __future__ import annotations

import numpy as np

from gpufleet.perf.step import _fsdp_per_layer


def _exposed(fwd_share: float) -> float:
    # a gather of 0.3 time units per layer against layers of 1.0: hidden behind a third, not behind a quarter
    _, exposed = _fsdp_per_layer(
        lambda size: 0.3 * size,
        lambda size: 0.1 * size,
        np.array(4.0),
        np.array(4.0),
        np.array(4.0),
        np.array(1.0),
        np.array(1.0),
        False,
        fwd_share,
    )
    return float(exposed)


def test_a_shorter_forward_window_exposes_more_of_the_gather() -> None:
    assert _exposed(0.25) > _exposed(1.0 / 3.0)
    assert np.isclose(_exposed(0.25) - _exposed(1.0 / 3.0), 4 * 0.05)  # 4 layers x (0.30 - 0.25)
