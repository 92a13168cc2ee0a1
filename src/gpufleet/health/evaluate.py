"""Honest evaluation of failure models: time-based splits, a fixed alert budget, train-once vs sliding.

Prediction rounds run every ``round_h`` hours over the test span; in each round a model alerts on at most
``budget x GPUs up`` GPUs (its top-K). An alert is right when the GPU fails within the horizon. Precision
counts right alerts; recall counts failures of the test span that at least one alert foresaw; lead time
is the hours from a failure's first right alert to the failure. Nothing is shuffled across time: a model
is trained only on instances whose labels were known before the period it is scored on.

- **train-once**: fit on the first ``train_days`` and score every later period with that model;
- **sliding**: refit at the start of every ``period_days`` period on the most recent ``train_days``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from gpufleet.errors import HealthError
from gpufleet.health.features import FeatureConfig, build_samples, candidate_instances, training_samples
from gpufleet.health.fleet_arrays import FleetArrays
from gpufleet.health.models.base import FailureModel, make_model, model_names
from gpufleet.health.models.ensembles import DEFAULT_BUDGET, CascadeEnsemble, ParallelEnsemble, top_k_per_round

ENSEMBLES = ("parallel", "cascade")


@dataclass(frozen=True)
class EvalConfig:
    """Splits, budget and training options of an evaluation."""

    features: FeatureConfig = field(default_factory=FeatureConfig)
    train_days: float = 28.0
    period_days: float = 14.0
    round_h: int = 24
    budget: float = DEFAULT_BUDGET
    negative_rate: float = 0.03
    parallel_members: tuple[str, ...] = ("gbdt", "mlp", "cnn1d")
    cascade_keep: float = 0.03
    seed: int = 0
    #: options passed to the torch models (e.g. epochs, max_train), so a bench can bound their cost
    torch_options: dict = field(default_factory=dict)


@dataclass
class EvalResult:
    """Per (model, mode): the metrics, the monthly precision, and every alert raised."""

    table: pl.DataFrame  # model, mode, alerts, true_alerts, precision, recall, f1, lead_h_median, ...
    monthly: pl.DataFrame  # model, mode, month, alerts, precision
    alerts: pl.DataFrame  # model, mode, gpu, hour, score, true, lead_h
    failures: int  # failures in the test span
    timings: dict[str, float]
    scores: pl.DataFrame | None = None  # with keep_scores: mode, gpu, hour, y, lead_h and one column per model


def _needed_models(models: Sequence[str], cfg: EvalConfig) -> list[str]:
    """Base models to fit: the requested singles plus the members the ensembles need."""
    need: list[str] = []
    for m in models:
        parts = list(cfg.parallel_members) if m == "parallel" else ["cnn1d", "mlp"] if m == "cascade" else [m]
        for p in parts:
            if p not in need:
                need.append(p)
    return need


def _make(name: str, cfg: EvalConfig) -> FailureModel:
    return make_model(name, seed=cfg.seed, torch_options=cfg.torch_options)


def evaluate(
    arrays: FleetArrays,
    models: Sequence[str],
    cfg: EvalConfig | None = None,
    modes: Sequence[str] = ("once", "sliding"),
    progress: Callable[[str], None] | None = None,
    keep_scores: bool = False,
) -> EvalResult:
    """Fit and score ``models`` (single and ensemble names) in each mode; see the module docstring."""
    cfg = cfg or EvalConfig()
    known = set(model_names())
    unknown = [m for m in models if m not in known]
    if unknown:
        raise HealthError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    bad_modes = [m for m in modes if m not in ("once", "sliding")]
    if bad_modes:
        raise HealthError(f"unknown mode(s) {', '.join(bad_modes)}; use once and/or sliding")
    fc = cfg.features
    train_h = round(cfg.train_days * 24)
    period_h = round(cfg.period_days * 24)
    end_h = arrays.n_bins * arrays.bin_h - fc.horizon_h  # rounds whose horizon the telemetry still covers
    if train_h < fc.window_h + fc.horizon_h or train_h >= end_h:
        raise HealthError(
            f"train_days={cfg.train_days} leaves no room: the telemetry covers {arrays.hours} h, "
            f"a window is {fc.window_h} h and the horizon {fc.horizon_h} h"
        )
    periods = [(s, min(s + period_h, end_h)) for s in range(train_h, end_h, period_h)]
    base = _needed_models(models, cfg)
    say = progress or (lambda _msg: None)
    timings: dict[str, float] = {}

    cache: dict[tuple[int, int], dict[str, FailureModel]] = {}

    def fit_all(start: int, stop: int, label: str) -> dict[str, FailureModel]:
        if (max(0, start), stop) in cache:  # the first sliding window is the train-once window
            return cache[(max(0, start), stop)]
        t0 = time.perf_counter()
        train = training_samples(arrays, fc, max(0, start), stop, cfg.negative_rate, cfg.seed)
        timings["features"] = timings.get("features", 0.0) + time.perf_counter() - t0
        if train.y is None or train.y.sum() == 0:
            raise HealthError(f"no failure in the training window {label}; use more days or GPUs")
        fitted: dict[str, FailureModel] = {}
        for name in base:
            say(f"fit {name} on {label} ({len(train):,} instances, {int(train.y.sum()):,} positive)")
            t0 = time.perf_counter()
            fitted[name] = _make(name, cfg).fit(train)
            timings[f"fit {name}"] = timings.get(f"fit {name}", 0.0) + time.perf_counter() - t0
        if "cascade" in models:
            t0 = time.perf_counter()
            casc = CascadeEnsemble(
                filter=fitted["cnn1d"],
                classifier=_make("mlp", cfg),
                keep=cfg.cascade_keep,
                negative_rate=cfg.negative_rate,
                seed=cfg.seed,
            )
            fitted["cascade"] = casc.with_fitted_filter(fitted["cnn1d"]).fit(train)
            timings["fit cascade"] = timings.get("fit cascade", 0.0) + time.perf_counter() - t0
        cache.clear()
        cache[(max(0, start), stop)] = fitted
        return fitted

    rows: list[pl.DataFrame] = []
    kept: list[pl.DataFrame] = []
    once = fit_all(0, train_h, f"days 0-{train_h / 24:g}") if "once" in modes else None
    for p_start, p_end in periods:
        t0 = time.perf_counter()
        gpu, hour = candidate_instances(arrays, fc, p_start, p_end, every_h=cfg.round_h)
        test = build_samples(arrays, gpu, hour, fc)
        timings["features"] = timings.get("features", 0.0) + time.perf_counter() - t0
        for mode in modes:
            if mode == "once":
                fitted = once
            else:
                fitted = fit_all(p_start - train_h, p_start, f"days {(p_start - train_h) / 24:g}-{p_start / 24:g}")
            say(f"score {mode} models on days {p_start / 24:g}-{p_end / 24:g} ({len(test):,} instances)")
            scores: dict[str, np.ndarray] = {}
            for name in base:
                t0 = time.perf_counter()
                scores[name] = np.asarray(fitted[name].score(test), dtype=np.float64)
                timings[f"score {name}"] = timings.get(f"score {name}", 0.0) + time.perf_counter() - t0
            if "parallel" in models:
                ens = ParallelEnsemble([fitted[m] for m in cfg.parallel_members], budget=cfg.budget)
                scores["parallel"] = ens.combine(test.time, [scores[m] for m in cfg.parallel_members])
            if "cascade" in models:
                t0 = time.perf_counter()
                scores["cascade"] = fitted["cascade"].combine(test, scores["cnn1d"])
                timings["score cascade"] = timings.get("score cascade", 0.0) + time.perf_counter() - t0
            if keep_scores:
                kept.append(
                    pl.DataFrame(
                        {
                            "mode": [mode] * len(test),
                            "gpu": test.gpu.astype(np.int64),
                            "hour": test.time,
                            "y": test.y,
                            "lead_h": test.lead_h,
                            **{k: v.astype(np.float32) for k, v in scores.items()},
                        }
                    )
                )
            for name in models:
                hit = top_k_per_round(test.time, scores[name], cfg.budget)
                idx = np.flatnonzero(hit)
                rows.append(
                    pl.DataFrame(
                        {
                            "model": [name] * len(idx),
                            "mode": [mode] * len(idx),
                            "gpu": test.gpu[idx].astype(np.int64),
                            "hour": test.time[idx],
                            "score": scores[name][idx],
                            "true": test.y[idx].astype(bool),
                            "lead_h": test.lead_h[idx],
                        }
                    )
                )
        del test
    alerts = pl.concat(rows) if rows else pl.DataFrame()
    test_start, test_end = periods[0][0], periods[-1][1]
    in_span = (arrays.failure_hour >= test_start) & (arrays.failure_hour < test_end)
    n_fail = int(in_span.sum())
    table, monthly = _metrics(alerts, models, modes, n_fail, arrays, test_start, test_end)
    return EvalResult(
        table=table,
        monthly=monthly,
        alerts=alerts,
        failures=n_fail,
        timings=timings,
        scores=pl.concat(kept) if kept else None,
    )


def _metrics(
    alerts: pl.DataFrame,
    models: Sequence[str],
    modes: Sequence[str],
    n_fail: int,
    arrays: FleetArrays,
    test_start: int,
    test_end: int,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Precision, recall, F1 and lead time per (model, mode), and precision per calendar month.

    Recall counts only failures inside the test span; a right alert in the last rounds may foresee one
    just after it, which counts for precision but not for recall.
    """
    if alerts.is_empty():
        raise HealthError("no alerts were raised: the test span holds no prediction round")
    caught = (
        alerts.filter(pl.col("true"))
        .with_columns(fail_hour=pl.col("hour") + pl.col("lead_h").cast(pl.Int64))
        .filter((pl.col("fail_hour") >= test_start) & (pl.col("fail_hour") < test_end))
        .group_by("model", "mode", "gpu", "fail_hour")
        .agg(lead=pl.col("lead_h").max())
    )
    per_fail = caught.group_by("model", "mode").agg(
        caught=pl.len(), lead_h_median=pl.col("lead").median(), lead_h_mean=pl.col("lead").mean()
    )
    table = (
        alerts.group_by("model", "mode")
        .agg(alerts=pl.len(), true_alerts=pl.col("true").sum())
        .join(per_fail, on=["model", "mode"], how="left")
        .with_columns(caught=pl.col("caught").fill_null(0))
        .with_columns(precision=pl.col("true_alerts") / pl.col("alerts"), recall=pl.col("caught") / max(n_fail, 1))
        .with_columns(
            f1=(2 * pl.col("precision") * pl.col("recall") / (pl.col("precision") + pl.col("recall"))).fill_nan(0.0)
        )
    )
    order = {m: i for i, m in enumerate(models)}
    morder = {m: i for i, m in enumerate(modes)}
    table = (
        table.with_columns(
            _o=pl.col("model").replace_strict(order, default=99), _m=pl.col("mode").replace_strict(morder, default=9)
        )
        .sort("_o", "_m")
        .drop("_o", "_m")
        .select(
            "model",
            "mode",
            "alerts",
            "true_alerts",
            "precision",
            "recall",
            "f1",
            "caught",
            "lead_h_median",
            "lead_h_mean",
        )
    )
    start = arrays.start
    month = (pl.lit(start).cast(pl.Datetime("ms", "UTC")) + pl.duration(hours=pl.col("hour"))).dt.strftime("%Y-%m")
    monthly = (
        alerts.with_columns(month=month)
        .group_by("model", "mode", "month")
        .agg(alerts=pl.len(), precision=pl.col("true").mean())
        .sort("model", "mode", "month")
    )
    return table, monthly
