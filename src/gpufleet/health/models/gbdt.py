"""Gradient-boosted trees (LightGBM) over the window aggregates: the paper's GBDT baseline."""

from __future__ import annotations

import numpy as np

from gpufleet.health.models.base import register_model
from gpufleet.health.samples import Samples


@register_model("gbdt", "LightGBM gradient-boosted trees on window aggregates")
class GBDTModel:
    """LightGBM binary classifier on ``samples.tabular`` (NaN is LightGBM's native missing value)."""

    name = "gbdt"

    def __init__(
        self,
        n_estimators: int = 200,
        learning_rate: float = 0.05,
        num_leaves: int = 15,
        min_child_samples: int = 40,
        subsample: float = 0.8,
        colsample: float = 0.5,
        max_pos_weight: float = 20.0,
        threads: int = 1,
        seed: int = 0,
    ) -> None:
        self.params = {
            "objective": "binary",
            "learning_rate": learning_rate,
            "num_leaves": num_leaves,
            "min_child_samples": min_child_samples,
            "bagging_fraction": subsample,
            "bagging_freq": 1,
            "feature_fraction": colsample,
            "num_threads": threads,
            "seed": seed,
            "verbose": -1,
            "deterministic": True,
            "force_col_wise": True,
        }
        self.n_estimators = n_estimators
        self.max_pos_weight = max_pos_weight
        self.booster = None

    def fit(self, samples: Samples) -> GBDTModel:
        import lightgbm as lgb

        if samples.y is None or len(samples) == 0:
            raise ValueError("GBDTModel.fit needs labelled samples")
        pos = int(samples.y.sum())
        if pos == 0:
            raise ValueError("GBDTModel.fit: the training window holds no failure; widen it")
        # positives are scarce: weight them up, but not to the full ratio, which over-fits a handful of failures
        params = dict(self.params, scale_pos_weight=min((len(samples) - pos) / pos, self.max_pos_weight))
        data = lgb.Dataset(
            samples.tabular, label=samples.y, feature_name=_safe_names(samples.feature_names), free_raw_data=True
        )
        self.booster = lgb.train(params, data, num_boost_round=self.n_estimators)
        return self

    def score(self, samples: Samples) -> np.ndarray:
        if self.booster is None:
            raise ValueError("GBDTModel.score called before fit")
        # prediction has no thread contention to fear: use every core
        return self.booster.predict(samples.tabular, num_threads=0).astype(np.float32)

    def feature_importance(self) -> dict[str, float]:
        """Total gain per feature, highest first: what the trees split on."""
        if self.booster is None:
            return {}
        gain = self.booster.feature_importance("gain")
        names = self.booster.feature_name()
        return dict(sorted(zip(names, gain.tolist(), strict=True), key=lambda kv: -kv[1]))


def _safe_names(names: list[str]) -> list[str] | str:
    return names if names else "auto"
