"""The performance model against a table of published training runs: predict every row (``perf validate``) and
refit the efficiency constants on the calibration rows (``perf calibrate``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.errors import ConfigError

if TYPE_CHECKING:
    import polars as pl

    from gpufleet.perf.efficiency import Efficiency

__all__ = ["CalibrationRun", "ValidationRun", "calibrate_table", "load_reference_cases", "validate_table"]


def load_reference_cases(table: str | Path | None = None) -> tuple[Path, list, list]:
    """(path, predictable cases, skipped rows) of the table at ``table`` (None: the one shipped in the wheel)."""
    from gpufleet.perf.ground_truth import default_ground_truth_path, read_cases

    path = Path(table) if table else default_ground_truth_path()
    cases, skipped = read_cases(path)
    if not cases:
        raise ConfigError(f"{path}: no row of the table can be predicted (all {len(skipped)} skipped)")
    return path, cases, skipped


def _efficiency(path: Path | None) -> Efficiency | None:
    if path is None:
        return None
    from gpufleet.perf.efficiency import load_efficiency

    return load_efficiency(path)


@dataclass(frozen=True)
class ValidationRun:
    """Every predictable row of ``path`` with its error (``table``), the error summary and the skipped rows."""

    path: Path
    table: pl.DataFrame
    summary: pl.DataFrame
    skipped: list
    planner: pl.DataFrame | None = None  # the planner's best layout beside each published one


def validate_table(
    table: str | Path | None = None, efficiency: Path | None = None, stack: str | None = None, planner: bool = False
) -> ValidationRun:
    """Predict every published measurement of ``table`` with the constants of ``efficiency`` (None: shipped);
    ``stack`` keeps the rows of one training stack; ``planner`` also plans every run (``perf.planner_check``)."""
    from gpufleet.perf.validate import error_summary, validate_cases

    path, cases, skipped = load_reference_cases(table)
    if stack is not None:
        from gpufleet.perf.stacks import get_stack

        get_stack(stack)
        cases = [c for c in cases if (c.options.stack or "megatron-core") == stack]
        if not cases:
            raise ConfigError(f"{path}: no predictable row names the stack {stack!r} in its stack column")
    eff = _efficiency(efficiency)
    rows = validate_cases(cases, eff)
    gaps = None
    if planner:
        from gpufleet.perf.planner_check import planner_gaps

        gaps = planner_gaps(cases, eff)
    return ValidationRun(path, rows, error_summary(rows), skipped, gaps)


@dataclass(frozen=True)
class CalibrationRun:
    """A refit: constants before and after (as dicts), the fitted keys with bounds, errors before and after, the
    fit's own figures, and the file written from ``template``."""

    path: Path
    calibration_rows: int
    before_constants: dict[str, Any]
    after_constants: dict[str, Any]
    fitted: list[tuple[str, str, float, float, float, float]]
    before: pl.DataFrame
    after: pl.DataFrame
    fit: dict[str, float]
    template: Path
    target: Path


def calibrate_table(
    out: Path, table: str | Path | None = None, efficiency: Path | None = None, status: Any = None
) -> CalibrationRun:
    """Refit the efficiency constants to the calibration rows of ``table``, starting from (and templated on)
    ``efficiency`` or the shipped file, and write them to ``out``. ``status(text)`` is an optional context
    manager shown while fitting."""
    import contextlib

    from gpufleet.perf.calibrate import FITTED, calibrate, fitted_values, write_efficiency
    from gpufleet.perf.efficiency import default_efficiency
    from gpufleet.perf.validate import error_summary, is_calibration, seen_cases, validate_cases
    from gpufleet.spec.catalog import data_file

    path, cases, _ = load_reference_cases(table)
    cases = seen_cases(cases)  # the before / after table never predicts an unseen split (UNSEEN_SPLITS)
    n_cal = sum(1 for c in cases if is_calibration(c))
    if not n_cal:
        raise ConfigError(f"{path}: none of its {len(cases)} predictable rows is a calibration row; nothing to fit")
    base = _efficiency(efficiency) or default_efficiency()
    template = Path(efficiency) if efficiency else Path(str(data_file("perf_efficiency.toml")))
    target = Path(out)
    before = error_summary(validate_cases(cases, base))
    label = f"fitting {len(FITTED)} efficiency constants to {n_cal} calibration rows of {path.name} ..."
    with status(label) if status is not None else contextlib.nullcontext():
        eff, fit = calibrate(cases, base)
        after = error_summary(validate_cases(cases, eff))
    target.parent.mkdir(parents=True, exist_ok=True)
    write_efficiency(eff, template, target)
    old, new = base.model_dump(), eff.model_dump()
    # a stack without a table (no calibration row, e.g. metaseq) reads as the reference, 1, before and after
    fitted = [
        (section, key, lo, hi, float(x0), float(x1))
        for (section, key, lo, hi), x0, x1 in zip(FITTED, fitted_values(base), fitted_values(eff), strict=True)
    ]
    return CalibrationRun(path, n_cal, old, new, fitted, before, after, fit, template, target)
