"""HTML reports and plots shared by every capability; ``write_sim_report`` compares simulation runs.

The export loads on first use, so ``import gpufleet.report`` pulls in neither plotly nor polars.
Building blocks live in their modules: ``report.breakdown.breakdown``, ``report.plots``,
``report.resample``, ``report.html`` and ``report.fmt``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufleet.report.sim_report import write_sim_report

__all__ = ["write_sim_report"]


def __getattr__(name: str) -> Any:
    if name == "write_sim_report":
        from gpufleet.report.sim_report import write_sim_report

        return write_sim_report
    raise AttributeError(f"module 'gpufleet.report' has no attribute {name!r}")
