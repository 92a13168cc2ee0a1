"""Leave-one-source-out cross-validation of the fitted constants: the model's error on a publication no fit saw.

Every split of the published-measurement table has been looked at, so none can judge the model any more. Grouped
cross-validation can: the rows are grouped by the document they come from (``source_document``), and each
document's rows are predicted with constants refitted (``calibrate``'s least squares, same constants, bounds and
weights) on the pooled rows of every *other* document. A stack whose rows all sit in the left-out document has no
fitted constants in that fold and falls back to its relative, as ``perf validate`` does for a stack without
calibration rows.

A full refit per document costs about 9 s (17 documents: 2.5 minutes on 2 cores), so the default is a cheaper
refit: one full fit on all pooled rows, its Jacobian (forward differences), then per fold a trust-region refit
from that point that re-evaluates the model exactly but reuses the pooled Jacobian (a chord method, ``max_nfev``
model passes). ``exact=True`` runs the full refit per fold instead.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy.optimize import least_squares

from gpufleet.perf.calibrate import BOUNDS, calibrate, fit_weights, fitted_values, log_residuals, with_values
from gpufleet.perf.efficiency import Efficiency
from gpufleet.perf.ground_truth import Case
from gpufleet.perf.stacks import resolve_stack
from gpufleet.perf.validate import predict_case, seen_cases, signed_error_pct, split_of

__all__ = ["CrossValidation", "leave_one_source_out", "source_document"]

#: (regex on the row's ``src``, document). Releases of one vendor's performance summary are one document, and so
#: are the tables and figures of one paper; distinct benchmark files of one repository are distinct documents.
_DOCUMENTS: tuple[tuple[str, str], ...] = (
    (r"^Narayanan21", "Narayanan et al. 2021 (Megatron-LM)"),
    (r"^Korthikanti22", "Korthikanti et al. 2022"),
    (r"^MegaScale", "MegaScale 2024"),
    (r"^MT-NLG", "MT-NLG 2022"),
    (r"^BigScience BLOOM", "BLOOM"),
    (r"^DeepSeek-V3", "DeepSeek-V3 report"),
    (r"^Llama 3 paper", "Llama 3 paper"),
    (r"^MLPerf", "MLPerf Training v3.1"),
    (r"OPT", "OPT paper"),
    (r"^NVIDIA/Megatron-LM megatron/core/transformer/moe", "Megatron-Core MoE README"),
    (r"^NVIDIA/Megatron-LM README", "Megatron-LM README (r0.8 table)"),
    (r"Megatron-Bridge", "Megatron-Bridge performance summary"),
    (r"NeMo Framework", "NeMo performance summary"),
    (r"mosaicml/llm-foundry", "llm-foundry MPT benchmarks"),
    (r"torchtitan benchmarks/llama3_h100_202412", "torchtitan Llama 3 H100 (2024-12)"),
    (r"torchtitan benchmarks/asyncTP", "torchtitan async TP (2025-06)"),
    (r"torchtitan benchmarks/llama3-8b_h200", "torchtitan Llama 3 8B H200 (Trainy)"),
    (r"torchtitan docs/performance\.md \(Aug 2024", "torchtitan performance doc (2024-08)"),
    (r"^NVIDIA/dgxc-benchmarking v24\.11", "DGXC Benchmarking 24.11.1"),
    (r"^NVIDIA/dgxc-benchmarking v2[5-9]", "DGXC Benchmarking 25.x"),
)


def source_document(case: Case) -> str:
    """The publication or document ``case`` was read from: the unit cross-validation leaves out."""
    for pattern, name in _DOCUMENTS:
        if re.search(pattern, case.source):
            return name
    return case.source


@dataclass(frozen=True)
class CrossValidation:
    """Per-row errors under leave-one-source-out refits, and one line per fold."""

    rows: pl.DataFrame  # row, document, split, stack, case, measured, predicted, error_pct, signed_pct
    folds: pl.DataFrame  # document, rows, fallback (stacks that fell back), fit_mean_pct
    exact: bool

    @property
    def mean_pct(self) -> float:
        """Mean absolute error over every left-out prediction."""
        return float(self.rows["error_pct"].mean())

    @property
    def max_pct(self) -> float:
        """Largest absolute error over every left-out prediction."""
        return float(self.rows["error_pct"].max())


def _stack_table(case: Case, eff: Efficiency) -> str:
    return resolve_stack(case.options.stack, eff)[1]


def _drop_unseen_stacks(eff: Efficiency, train: Sequence[Case]) -> tuple[Efficiency, list[str]]:
    """``eff`` without the fitted stack tables that no training row resolves to: those stacks fall back."""
    used = {_stack_table(c, eff) for c in train}
    unseen = sorted(name for name in eff.stack if name not in used)
    if not unseen:
        return eff, []
    data = eff.model_dump()
    for name in unseen:
        del data["stack"][name]
    return Efficiency.model_validate(data), unseen


def _jacobian(cases: Sequence[Case], base: Efficiency, x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Forward-difference Jacobian of the weighted log residuals at ``x`` (backward at an upper bound)."""
    lower, upper = BOUNDS
    r0 = log_residuals(cases, with_values(base, x), weights)
    jac = np.zeros((len(cases), len(x)))
    for k in range(len(x)):
        h = 1e-3 * max(1.0, abs(x[k]))
        if x[k] + h > upper[k]:
            h = -h
        if x[k] + h < lower[k]:
            continue  # a constant pinned between bounds this narrow has no direction to move
        xk = x.copy()
        xk[k] += h
        jac[:, k] = (log_residuals(cases, with_values(base, xk), weights) - r0) / h
    return jac


def leave_one_source_out(
    cases: Sequence[Case], base: Efficiency, *, exact: bool = False, max_nfev: int | None = None
) -> CrossValidation:
    """Predict each document's rows with constants refitted on every other document's rows (all splits pooled).

    ``exact`` refits from ``base`` with ``calibrate`` per fold (``max_nfev`` iterations, default its 400); otherwise
    (the default) each fold is a chord refit (``max_nfev`` exact model passes, default 8, with the pooled fit's
    Jacobian) from the fit on all rows. Rows of an unseen split (``UNSEEN_SPLITS``) are left out: no fold fits or
    predicts them.
    """
    pooled = [dataclasses.replace(c, split="calibration") for c in seen_cases(cases)]
    docs = [source_document(c) for c in pooled]
    weights = fit_weights(pooled)
    lower, upper = BOUNDS
    if not exact:
        start, _ = calibrate(pooled, base)
        x_star = fitted_values(start)
        jac = _jacobian(pooled, start, x_star, weights)
    out_rows, folds = [], []
    for doc in dict.fromkeys(docs):
        held = [i for i, d in enumerate(docs) if d == doc]
        train_idx = [i for i, d in enumerate(docs) if d != doc]
        train = [pooled[i] for i in train_idx]
        if exact:
            eff, _ = calibrate(train, base, max_nfev=max_nfev or 400)
        else:
            sub_jac = jac[train_idx]
            free = np.flatnonzero(np.abs(sub_jac).sum(axis=0) > 0)
            w = weights[train_idx]

            def fold_residuals(
                z: np.ndarray, free: np.ndarray = free, w: np.ndarray = w, train: list[Case] = train
            ) -> np.ndarray:
                x = x_star.copy()
                x[free] = z
                return log_residuals(train, with_values(start, x), w)

            fit = least_squares(
                fold_residuals,
                np.clip(x_star[free], lower[free] + 1e-12, upper[free] - 1e-12),
                jac=lambda z, sub=sub_jac[:, free]: sub,
                bounds=(lower[free], upper[free]),
                max_nfev=max_nfev or 8,
            )
            x = x_star.copy()
            x[free] = fit.x
            eff = with_values(start, x)
        eff, fallback = _drop_unseen_stacks(eff, train)
        fit_err = np.abs(np.expm1(log_residuals(train, eff, np.ones(len(train))))) * 100.0
        folds.append(
            {
                "document": doc,
                "rows": len(held),
                "fallback": ", ".join(fallback),
                "fit_mean_pct": float(fit_err.mean()),
            }
        )
        for i in held:
            case = cases[i]
            predicted = predict_case(case, eff)["predicted"]
            signed = signed_error_pct(case, predicted)
            out_rows.append(
                {
                    "row": case.row,
                    "document": doc,
                    "split": split_of(case),
                    "stack": case.options.stack or "megatron-core",
                    "case": case.label,
                    "measured": case.target,
                    "predicted": predicted,
                    "error_pct": abs(signed),
                    "signed_pct": signed,
                }
            )
    return CrossValidation(pl.DataFrame(out_rows), pl.DataFrame(folds), exact)
