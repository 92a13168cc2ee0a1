"""A trained failure predictor as one file: the model, its feature windows, its alert budget, a calibration.

The file is a zip archive of JSON, safetensors arrays and LightGBM model text
(:mod:`gpufleet.health.models.persist`): opening a model file from elsewhere never runs code from it.

``train_predictor`` fits a model on the most recent telemetry, as an operator would run it every period
(sliding training in production). Before the final fit it holds out the last ``calibrate_days`` to learn
how often a score turned out right (isotonic regression), so that ``predict`` can say "72 % likely to
fail within 48 h" rather than print a bare score.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from gpufleet.errors import HealthError
from gpufleet.health.features import FeatureConfig, build_samples, candidate_instances, training_samples
from gpufleet.health.fleet_arrays import FleetArrays
from gpufleet.health.models.base import FailureModel, make_model
from gpufleet.health.models.ensembles import DEFAULT_BUDGET, CascadeEnsemble, ParallelEnsemble, top_k_per_round
from gpufleet.health.models.persist import load_file, save_file

#: bumped whenever the feature columns or the file layout change (2: the pcie_vs_node channel; 3: a data-only
#: archive instead of a pickle); an older file must be retrained
_FORMAT = "gpufleet.health.predictor/3"
_WHAT = "gpufleet failure model"


@dataclass
class Predictor:
    """What ``health train`` writes and ``health predict`` / ``simulate --predictor`` read."""

    model: FailureModel
    model_name: str
    features: FeatureConfig
    bin_h: int
    budget: float
    trained: dict[str, Any] = field(default_factory=dict)  # span, instances, positives, source
    calibration: tuple[np.ndarray, np.ndarray] | None = None  # isotonic knots: score -> probability
    format: str = _FORMAT

    def save(self, path: str | Path) -> Path:
        """Write the predictor as a data-only model archive at ``path`` (any name: ``model.zip`` by convention)."""
        content = {
            "model_name": self.model_name,
            "features": asdict(self.features),
            "bin_h": self.bin_h,
            "budget": self.budget,
            "trained": self.trained,
            "calibration": self.calibration,
            "model": self.model,
        }
        return save_file(path, _FORMAT, content)

    @staticmethod
    def load(path: str | Path) -> Predictor:
        """Read a file ``save`` wrote; HealthError naming the file for anything else (a pickle is never opened)."""
        path = Path(path)
        if not path.is_file():
            raise HealthError(f"{path}: no such model file; write one with `gpufleet health train`")
        c = load_file(path, _WHAT, lambda fmt: _check_format(path, fmt))
        try:
            if not isinstance(c["model"], FailureModel):
                raise TypeError(f"its model is a {type(c['model']).__name__}, not a failure model")
            calibration = c["calibration"]
            if calibration is not None:
                x, y = calibration
                calibration = (np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
            bin_h, budget = c["bin_h"], c["budget"]
            if type(bin_h) is not int or bin_h <= 0:
                raise TypeError(f"its bin_h {bin_h!r} is not a positive whole number of hours")
            if type(budget) not in (int, float) or not math.isfinite(budget) or budget < 0:
                raise TypeError(f"its budget {budget!r} is not a finite share")
            return Predictor(
                model=c["model"],
                model_name=str(c["model_name"]),
                features=_features(c["features"], bin_h),
                bin_h=bin_h,
                budget=float(budget),
                trained=dict(c["trained"]),
                calibration=calibration,
            )
        except (KeyError, TypeError, ValueError, HealthError) as exc:
            raise HealthError(
                f"{path}: not a valid {_WHAT} ({type(exc).__name__}: {exc}); write one with `gpufleet health train`"
            ) from None

    def probability(self, scores: np.ndarray) -> np.ndarray:
        """Calibrated probability of failure within the horizon (NaN without a calibration)."""
        if self.calibration is None:
            return np.full(len(scores), np.nan)
        x, y = self.calibration
        finite = np.where(np.isfinite(scores), scores, x[0] - 1.0)
        return np.interp(finite, x, y, left=y[0], right=y[-1])

    def scores(self, arrays: FleetArrays, gpu: np.ndarray, hour: np.ndarray) -> np.ndarray:
        if arrays.bin_h != self.bin_h:
            raise HealthError(f"telemetry binned at {arrays.bin_h} h but the model expects {self.bin_h} h")
        samples = build_samples(arrays, gpu, hour, self.features, with_labels=False)
        return np.asarray(self.model.score(samples), dtype=np.float64)


def _features(raw: Any, bin_h: int) -> FeatureConfig:
    """The FeatureConfig of a file's ``features``: exactly its fields, each a whole number of hours that fits the
    bins (TypeError or HealthError otherwise)."""
    names = [f.name for f in fields(FeatureConfig)]
    if not isinstance(raw, dict) or set(raw) != set(names):
        raise TypeError(f"its features are not {', '.join(names)}")
    bad = [name for name in names if type(raw[name]) is not int]
    if bad:
        raise TypeError(f"its features {', '.join(bad)} are not whole numbers of hours")
    fc = FeatureConfig(**raw)
    fc.validate(bin_h)
    return fc


def _check_format(path: Path, fmt: str) -> None:
    """HealthError unless ``fmt`` is the format this gpufleet reads (an older one asks for retraining)."""
    if fmt == _FORMAT:
        return
    prefix, _, version = fmt.rpartition("/")
    if prefix == _FORMAT.rpartition("/")[0] and version.isdigit() and int(version) > int(_FORMAT.rpartition("/")[2]):
        raise HealthError(
            f"{path}: a failure model from a newer gpufleet ({fmt}; this one reads {_FORMAT}); "
            "upgrade gpufleet or retrain it with this one"
        )
    if fmt.startswith("gpufleet.health.predictor/"):
        raise HealthError(
            f"{path}: a failure model from an older gpufleet ({fmt}; this one reads {_FORMAT}, "
            "whose features differ); retrain it with `gpufleet health train`"
        )
    raise HealthError(f"{path}: not a {_WHAT} (format {fmt!r}); write one with `gpufleet health train`")


def _fit(
    name: str, train: Any, budget: float, seed: int, torch_options: dict, negative_rate: float = 1.0
) -> FailureModel:
    if name == "parallel":
        return ParallelEnsemble(budget=budget, seed=seed).fit(train)
    if name == "cascade":
        return CascadeEnsemble(seed=seed, negative_rate=negative_rate).fit(train)
    return make_model(name, seed=seed, torch_options=torch_options).fit(train)


def train_predictor(
    arrays: FleetArrays,
    model: str = "gbdt",
    features: FeatureConfig | None = None,
    train_days: float = 28.0,
    calibrate_days: float = 14.0,
    budget: float = DEFAULT_BUDGET,
    negative_rate: float = 0.03,
    seed: int = 0,
    source: str = "",
    torch_options: dict | None = None,
) -> Predictor:
    """Fit ``model`` on the last ``train_days`` whose labels are known, calibrated on a held-out tail."""
    fc = features or FeatureConfig()
    fc.validate(arrays.bin_h)
    torch_options = torch_options or {}
    end = arrays.n_bins * arrays.bin_h  # labels of instances before end - horizon are known
    train_h, cal_h = round(train_days * 24), round(calibrate_days * 24)
    if train_h < fc.window_h + fc.horizon_h:
        raise HealthError(
            f"--train-days {train_days:g} is shorter than a window plus the horizon "
            f"({(fc.window_h + fc.horizon_h) / 24:g} days)"
        )
    if train_h + cal_h + fc.horizon_h > end:
        raise HealthError(
            f"the telemetry covers {arrays.hours / 24:.1f} days, too few for {train_days:g} training "
            f"+ {calibrate_days:g} calibration days + the {fc.horizon_h} h horizon"
        )
    calibration = None
    if cal_h:
        cal_start = end - fc.horizon_h - cal_h
        early = _fit(
            model,
            training_samples(arrays, fc, cal_start - train_h, cal_start, negative_rate, seed),
            budget,
            seed,
            torch_options,
            negative_rate,
        )
        gpu, hour = candidate_instances(arrays, fc, cal_start, end - fc.horizon_h, every_h=24)
        held = build_samples(arrays, gpu, hour, fc)
        s = np.asarray(early.score(held), dtype=np.float64)
        calibration = _isotonic(s, held.y)
    train = training_samples(arrays, fc, end - train_h, end, negative_rate, seed)
    fitted = _fit(model, train, budget, seed, torch_options, negative_rate)
    start = arrays.start
    return Predictor(
        model=fitted,
        model_name=model,
        features=fc,
        bin_h=arrays.bin_h,
        budget=budget,
        calibration=calibration,
        trained={
            "source": source,
            "gpus": arrays.gpus,
            "instances": len(train),
            "positives": int(train.y.sum()),
            "from": (start + timedelta(hours=end - train_h)).isoformat(),
            "to": (start + timedelta(hours=end)).isoformat(),
            "end_hour": end,
            "fleet_start": start.isoformat(),
            "fleet_meta": arrays.meta,
        },
    )


def _isotonic(scores: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Knots of an increasing score -> frequency-of-failure map (None when the held-out span has no failure)."""
    from sklearn.isotonic import IsotonicRegression

    if y.sum() == 0:
        return None
    finite = np.isfinite(scores)
    floor = np.min(scores[finite]) - 1.0 if finite.any() else 0.0
    x = np.where(finite, scores, floor)
    iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(x, y)
    return np.asarray(iso.X_thresholds_, dtype=np.float64), np.asarray(iso.y_thresholds_, dtype=np.float64)


def predict_latest(
    predictor: Predictor, arrays: FleetArrays, top: int = 20, at_hour: int | None = None
) -> pl.DataFrame:
    """The ``top`` GPUs most likely to fail, scored at the last bin boundary (or ``at_hour``)."""
    hour = at_hour if at_hour is not None else arrays.n_bins * arrays.bin_h
    hour -= hour % arrays.bin_h
    gpu, hours = candidate_instances(arrays, predictor.features, hour, hour + 1)
    if len(gpu) == 0:
        raise HealthError(
            f"no GPU reported in the hour before {arrays.start + timedelta(hours=hour)} "
            f"or the telemetry is shorter than the {predictor.features.window_h} h window"
        )
    s = predictor.scores(arrays, gpu, hours)
    order = np.argsort(-s, kind="stable")[:top]
    prob = predictor.probability(s[order])
    return pl.DataFrame(
        {
            "rank": np.arange(1, len(order) + 1),
            "gpu": gpu[order],
            "node": arrays.node[gpu[order]],
            "time": [arrays.start + timedelta(hours=int(hour))] * len(order),
            "score": s[order],
            "probability": prob,
            # the predictor's own budget decides which of these it would alert on in a round
            "alert": (np.arange(len(order)) < max(1, round(predictor.budget * len(gpu)))) & np.isfinite(s[order]),
        }
    )


def rolling_alerts(predictor: Predictor, arrays: FleetArrays, start_h: int = 0, every_h: int = 24) -> pl.DataFrame:
    """The alerts the predictor raises in rounds every ``every_h`` hours from ``start_h``: gpu, node, hour, score."""
    end = arrays.n_bins * arrays.bin_h
    rows = []
    for s in range(start_h, end, every_h * 14):  # two weeks of rounds at a time bounds memory
        gpu, hour = candidate_instances(arrays, predictor.features, s, min(s + every_h * 14, end), every_h=every_h)
        if len(gpu) == 0:
            continue
        sc = predictor.scores(arrays, gpu, hour)
        hit = top_k_per_round(hour, sc, predictor.budget)
        rows.append(pl.DataFrame({"gpu": gpu[hit], "node": arrays.node[gpu[hit]], "hour": hour[hit], "score": sc[hit]}))
    if not rows:
        return pl.DataFrame(schema={"gpu": pl.Int64, "node": pl.Int64, "hour": pl.Int64, "score": pl.Float64})
    return pl.concat(rows)
