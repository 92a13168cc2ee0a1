"""Fit the achieved-efficiency constants to the calibration rows of the published-measurement table.

Only constants per GPU generation, per network class and of the training software's methods are fitted
(``FITTED``), by bounded least squares on the log of predicted / measured (SciPy's trust-region
reflective solver). The rows outside the calibration subset never enter the fit; ``perf validate``
reports their error separately.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from gpufleet.perf.efficiency import Efficiency, StackConstants
from gpufleet.perf.ground_truth import Case
from gpufleet.perf.validate import is_calibration, predict_case

__all__ = [
    "BOUNDS",
    "FITTED",
    "calibrate",
    "fit_weights",
    "fitted_values",
    "log_residuals",
    "with_values",
    "write_efficiency",
]

#: (section, key, lower, upper) of every fitted constant; sections are dotted TOML table names. The
#: bounds keep each constant physical: FlashAttention-2 reaches 35-70 % of peak on A100/H100 (Dao 2023),
#: NCCL ring collectives 50-95 % of NVLink and of NIC line rate (nccl-tests busbw); the unfused attention core
#: is batched GEMMs of head-dim width, which stay below large GEMMs' ~75 % of peak.
FITTED: tuple[tuple[str, str, float, float], ...] = (
    ("compute.ampere", "gemm", 0.5, 0.95),
    ("compute.ampere", "attention", 0.05, 0.75),
    ("compute.ampere", "flash_attention", 0.35, 0.8),
    ("compute.hopper", "gemm", 0.4, 0.95),
    ("compute.hopper", "flash_attention", 0.3, 0.8),
    ("compute.hopper", "fp8_gemm", 0.2, 0.95),
    # bytes per element of fp8 dynamic-scaling casts: 0 (fused away) to 8 (unfused amax, cast and transposed copy)
    ("compute.hopper", "fp8_cast_bytes", 0.0, 8.0),
    ("compute.*", "elementwise_bytes", 0.0, 48.0),
    ("intra", "nvlink", 0.5, 0.95),
    ("network.infiniband", "efficiency", 0.5, 0.95),
    ("network.roce", "efficiency", 0.5, 0.95),
    ("software", "tp_overlap_exposed", 0.0, 1.0),
    ("software", "layer_overhead_us", 0.0, 300.0),
    # fp8 only: about 30 extra kernels per layer (amax, scale update, cast per GEMM operand) at 5 us each
    ("software", "fp8_layer_overhead_us", 0.0, 150.0),
    # per training stack, relative to megatron-core (= 1, the generation constants): only stacks with
    # calibration rows; the bounds allow a stack half to one and a half times the reference's compute rate
    ("stack.megatron-2021", "compute", 0.5, 1.5),
    ("stack.deepspeed-megatron", "compute", 0.5, 1.5),
    ("stack.megascale", "compute", 0.5, 1.5),
    ("stack.fsdp", "compute", 0.5, 1.5),
    ("stack.metaseq", "compute", 0.5, 1.5),  # revision 7: fitted only where OPT-175B's row calibrates
    ("stack.torchtitan", "compute", 0.5, 1.5),
    ("stack.torchtitan", "fp8", 0.3, 1.5),  # torchao Float8 (dynamic scaling): calibrated on its own fp8 row
    # revision 8: NeMo / Megatron-Bridge recipes, bf16 (compute) and fp8 (TransformerEngine's recipe) apart
    ("stack.nemo", "compute", 0.5, 1.5),
    ("stack.nemo", "fp8", 0.3, 1.5),
)
#: Lower and upper bounds of the ``FITTED`` constants, in its order, as the least-squares fits take them.
BOUNDS: tuple[np.ndarray, np.ndarray] = (
    np.array([lo for _, _, lo, _ in FITTED]),
    np.array([hi for _, _, _, hi in FITTED]),
)


#: Weight of each Korthikanti 2022 row in the least-squares fit.
KORTHIKANTI_WEIGHT = 2.0


def _get(data: dict, section: str, key: str) -> float:
    node = data
    for part in section.split("."):
        node = node["ampere"] if part == "*" else node[part]
    return float(node[key])


def _set(data: dict, section: str, key: str, value: float) -> None:
    parts = section.split(".")
    if parts[-1] == "*":
        parent = data
        for part in parts[:-1]:
            parent = parent[part]
        for table in parent.values():
            table[key] = value
        return
    node = data
    for part in parts:
        node = node[part]
    node[key] = value


def _add_reference_stacks(data: dict) -> set[str]:
    """Give ``data`` (a dumped Efficiency) the reference table of every fitted stack it has none for; their names."""
    fitted = dict.fromkeys(s.split(".", 1)[1] for s, _, _, _ in FITTED if s.startswith("stack."))  # FITTED's order
    added = [name for name in fitted if name not in data["stack"]]
    for name in added:
        data["stack"][name] = StackConstants().model_dump()
    return set(added)


def with_values(base: Efficiency, x: np.ndarray) -> Efficiency:
    """``base`` with the ``FITTED`` constants set to ``x`` (in ``FITTED``'s order)."""
    data = base.model_dump()
    _add_reference_stacks(data)
    for (section, key, _, _), value in zip(FITTED, x, strict=True):
        _set(data, section, key, float(value))
    return Efficiency.model_validate(data)


def fit_weights(cases: Sequence[Case]) -> np.ndarray:
    """Each case's weight on its log residual (the square root of its least-squares weight)."""
    # Korthikanti's rows are the field's reference (Calculon's 3.65 %): weigh them as much as the rest
    return np.array([np.sqrt(KORTHIKANTI_WEIGHT) if c.group == "Korthikanti 2022" else 1.0 for c in cases])


def log_residuals(cases: Sequence[Case], eff: Efficiency, weights: np.ndarray) -> np.ndarray:
    """Each case's weighted log error of the prediction under ``eff`` (what the fits minimise in least squares)."""
    return weights * np.array([np.log(predict_case(c, eff)["predicted"] / c.target) for c in cases])


def fitted_values(eff: Efficiency) -> np.ndarray:
    """The ``FITTED`` constants of ``eff`` in ``FITTED``'s order (a missing stack table reads as the reference, 1)."""
    data = eff.model_dump()
    _add_reference_stacks(data)
    return np.array([_get(data, s, k) for s, k, _, _ in FITTED])


def _without_unfitted_stacks(eff: Efficiency, added: set[str], chosen: Sequence[Case]) -> Efficiency:
    """``eff`` without the stack tables the fit added that no calibration row uses: those stacks keep falling back."""
    used = {c.options.stack for c in chosen}
    unfitted = added - used
    if not unfitted:
        return eff
    data = eff.model_dump()
    for name in unfitted:
        del data["stack"][name]
    return Efficiency.model_validate(data)


def calibrate(cases: Sequence[Case], base: Efficiency, *, max_nfev: int = 400) -> tuple[Efficiency, dict[str, float]]:
    """Refit ``FITTED`` on the calibration cases; returns the new constants and a fit summary."""
    chosen = [c for c in cases if is_calibration(c)]
    if not chosen:
        raise ValueError("no calibration rows among the cases")
    weights = fit_weights(chosen)
    base_data = base.model_dump()
    added = _add_reference_stacks(base_data)  # a start file without a stack's table starts that stack at the reference
    base = Efficiency.model_validate(base_data)
    x0 = fitted_values(base)
    lower, upper = BOUNDS
    x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)

    def residuals(x: np.ndarray) -> np.ndarray:
        return log_residuals(chosen, with_values(base, x), weights)

    fit = least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac", diff_step=1e-3, max_nfev=max_nfev)
    eff = _without_unfitted_stacks(with_values(base, fit.x), added, chosen)
    res = np.abs(np.expm1(residuals(fit.x) / weights)) * 100.0
    summary = {"rows": float(len(chosen)), "mean_pct": float(res.mean()), "max_pct": float(res.max())}
    return eff, summary | {"nfev": float(fit.nfev)}


def write_efficiency(eff: Efficiency, template: str | Path, out: str | Path) -> None:
    """Write ``eff``'s fitted values into a copy of the TOML ``template``, keeping its comments."""
    text = Path(template).read_text(encoding="utf-8")
    data = eff.model_dump()
    section = ""
    lines = []
    for line in text.splitlines():
        head = re.match(r"\s*\[([^\]]+)\]", line)
        if head:
            section = head.group(1).strip()
        match = re.match(r"^(\s*)([A-Za-z_0-9]+)(\s*=\s*)([-+0-9.eE]+)(.*)$", line)
        if match and section:
            key = match.group(2)
            for fitted_section, fitted_key, _, _ in FITTED:
                pattern = fitted_section.replace(".", r"\.").replace("*", r"[a-z]+")
                if fitted_key == key and re.fullmatch(pattern, section):
                    value = _get(data, section, key)
                    line = f"{match.group(1)}{key}{match.group(3)}{value:.4g}{match.group(5)}"
        lines.append(line)
    Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")
