"""What ``gpufleet contention fit`` and ``show`` compute over :mod:`gpufleet.perf.contention`: a fit to DeepShare's
co-location matrix held to an error bar, a model's constants, its predicted model-pair ratios, and the plain data
that :func:`gpufleet.report.contention_report.write_contention_report` draws."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.errors import ConfigError

if TYPE_CHECKING:
    from gpufleet.perf.contention import ContentionModel, FitReport

__all__ = [
    "HOLD_BY",
    "MAE_BAR",
    "SHOW_PLACEMENT",
    "ContentionFit",
    "fit_deepshare",
    "model_constants",
    "pair_matrix",
    "report_data",
]

#: The accuracy the model is held to: mean absolute error of the throughput ratio on held-back cells.
MAE_BAR = 0.08
#: The placement of ``show``'s model-pair table: 8 GPUs over 2 nodes.
SHOW_PLACEMENT = (8, 2)
#: What a fit holds back: random cells of the matrix, or whole victim job types (rows).
HOLD_BY = ("cells", "types")


@dataclass(frozen=True)
class ContentionFit:
    """A fit with its headline figures (``summary``, which says whether it meets :data:`MAE_BAR`) and per-type
    held-back errors."""

    fit: FitReport
    summary: dict[str, Any]
    per_type: list[dict[str, Any]]


def fit_deepshare(
    folder: str | Path | None = None, holdout: float = 0.3, seed: int = 0, by: str = "cells"
) -> ContentionFit:
    """Fit the contention model to DeepShare's tables in ``folder`` (None: the shipped ones), holding back
    ``holdout`` of the cells (``by="cells"``) or of the victim job types (``by="types"``)."""
    from gpufleet.perf.contention import fit_contention, load_deepshare, victim_type_mask

    if not 0.0 < holdout < 1.0:
        raise ConfigError(f"--holdout must be in (0, 1), got {holdout}")
    if by not in HOLD_BY:
        raise ConfigError(f"--by must be one of {', '.join(HOLD_BY)}, got {by!r}")
    data = load_deepshare(folder)
    mask = victim_type_mask(len(data.keys), holdout, seed) if by == "types" else None
    fit = fit_contention(data, holdout=holdout, seed=seed, train_mask=mask)
    summary = {**fit.summary(), "by": by, "bar": MAE_BAR, "meets_bar": bool(fit.test_mae <= MAE_BAR)}
    return ContentionFit(fit, summary, fit.per_type())


def model_constants(model: ContentionModel) -> dict[str, dict[str, float]]:
    """The fitted constants of ``model``, keyed as in its JSON form."""
    full = model.to_dict()
    return {
        k: full[k] for k in ("model_sensitivity", "model_intensity", "placement_sensitivity", "placement_intensity")
    }


def pair_matrix(model: ContentionModel, gpus: int, nodes: int) -> tuple[list[str], list[list[float]]]:
    """The model's predicted ratio of each victim model (rows) beside each aggressor model (columns)."""
    names = model.models
    return names, [[model.pair_ratio((v, gpus, nodes), (a, gpus, nodes)) for a in names] for v in names]


def report_data(result: ContentionFit) -> dict[str, Any]:
    """The keyword arguments of ``write_contention_report`` for ``result``: arrays, dicts and strings only."""
    import math

    fit, model = result.fit, result.fit.model
    return {
        "labels": [f"{m},{g},{n}" for m, g, n in fit.keys],
        "measured": fit.measured,
        "predicted": fit.predicted,
        "train_mask": fit.train_mask,
        "summary": result.summary,
        "per_type": result.per_type,
        "model_constants": {m: (model.model_s[m], model.model_p[m]) for m in model.models},
        "placement_constants": {
            f"{g} GPUs / {n} nodes": (s, model.place_p.get((g, n), math.nan)) for (g, n), s in model.place_s.items()
        },
        "source": model.source,
    }
