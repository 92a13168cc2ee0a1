"""Prediction instances: one row per (GPU, prediction time), in the two shapes the models read.

Tabular models (GBDT, MLP) read ``tabular`` (window aggregates); sequence models (LSTM, 1D-CNN) read
``sequence`` (the observation window resampled to a few steps). Ensembles read both, which is why the
instance set, not a bare matrix, is what a model's ``fit`` and ``score`` take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Samples:
    """Instances for failure prediction; row ``i`` of every array is the same (gpu, time)."""

    gpu: np.ndarray  # (n,) uint32 fleet GPU index
    time: np.ndarray  # (n,) int64 prediction time, hours since the fleet's first sample
    tabular: np.ndarray  # (n, f) float32 window aggregates; NaN where undefined
    sequence: np.ndarray  # (n, steps, c) float32 resampled window, oldest step first; NaN where missing
    y: np.ndarray | None = None  # (n,) int8: 1 if the GPU fails within the horizon after ``time``
    feature_names: list[str] = field(default_factory=list)
    channel_names: list[str] = field(default_factory=list)
    lead_h: np.ndarray | None = None  # (n,) float32 hours from ``time`` to the failure (NaN for negatives)

    def __post_init__(self) -> None:
        n = len(self.gpu)
        for name in ("time", "tabular", "sequence"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Samples.{name} has {len(getattr(self, name))} rows, gpu has {n}")
        if self.y is not None and len(self.y) != n:
            raise ValueError(f"Samples.y has {len(self.y)} rows, gpu has {n}")

    def __len__(self) -> int:
        return len(self.gpu)

    def take(self, index: np.ndarray) -> Samples:
        """The instances at ``index`` (an integer index or a boolean mask)."""
        return Samples(
            gpu=self.gpu[index],
            time=self.time[index],
            tabular=self.tabular[index],
            sequence=self.sequence[index],
            y=None if self.y is None else self.y[index],
            feature_names=self.feature_names,
            channel_names=self.channel_names,
            lead_h=None if self.lead_h is None else self.lead_h[index],
        )

    @staticmethod
    def concat(parts: list[Samples]) -> Samples:
        """Row-wise concatenation of instance sets with the same features."""
        if not parts:
            raise ValueError("Samples.concat needs at least one part")
        first = parts[0]
        has_y = all(p.y is not None for p in parts)
        has_lead = all(p.lead_h is not None for p in parts)
        return Samples(
            gpu=np.concatenate([p.gpu for p in parts]),
            time=np.concatenate([p.time for p in parts]),
            tabular=np.concatenate([p.tabular for p in parts]),
            sequence=np.concatenate([p.sequence for p in parts]),
            y=np.concatenate([p.y for p in parts]) if has_y else None,
            feature_names=first.feature_names,
            channel_names=first.channel_names,
            lead_h=np.concatenate([p.lead_h for p in parts]) if has_lead else None,
        )
