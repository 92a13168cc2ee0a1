"""HTML report of a failure-prediction evaluation: the metrics table, precision by month, lead times.

The evaluation comes in through :class:`EvaluationLike`, so ``gpufleet.report`` does not import
``gpufleet.health``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import plotly.graph_objects as go
import polars as pl

from gpufleet.report import html
from gpufleet.report.plots import house_layout, series_colors

__all__ = ["EvaluationLike", "write_health_report"]


class EvaluationLike(Protocol):
    """What the report reads of an evaluation (``gpufleet.health.evaluate.EvalResult``).

    ``table``: model, mode, alerts, true_alerts, precision, recall, f1, caught, lead_h_median;
    ``monthly``: model, mode, month, precision; ``alerts``: model, mode, true, lead_h.
    """

    @property
    def table(self) -> pl.DataFrame: ...
    @property
    def monthly(self) -> pl.DataFrame: ...
    @property
    def alerts(self) -> pl.DataFrame: ...
    @property
    def failures(self) -> int: ...


def _metrics_table(table: pl.DataFrame) -> str:
    header = ["model", "mode", "alerts", "right", "precision", "recall", "F1", "failures foreseen", "lead h (median)"]
    best = table["precision"].max()
    rows, classes = [], []
    for r in table.iter_rows(named=True):
        rows.append(
            [
                r["model"],
                r["mode"],
                f"{r['alerts']:,}",
                f"{r['true_alerts']:,}",
                f"{100 * r['precision']:.1f} %",
                f"{100 * r['recall']:.1f} %",
                f"{r['f1']:.3f}",
                f"{r['caught']:,}",
                "-" if r["lead_h_median"] is None else f"{r['lead_h_median']:.0f}",
            ]
        )
        classes.append(["", "", "", "", "best" if r["precision"] == best else "", "", "", "", ""])
    return html.table(header, rows, cell_classes=classes, text_columns=(1,))


def _model_colors(*frames: pl.DataFrame) -> dict[str, str]:
    """One colour per model, the same in both figures; the mode shows as the line style."""
    return series_colors(m for frame in frames for m in frame["model"].to_list())


def _monthly_figure(monthly: pl.DataFrame, colors: dict[str, str]) -> go.Figure:
    traces: list[dict[str, Any]] = []
    for (model, mode), part in monthly.sort("month").group_by(["model", "mode"], maintain_order=True):
        traces.append(
            {
                "type": "scatter",
                "x": part["month"].to_list(),
                "y": (100 * part["precision"]).to_list(),
                "mode": "lines+markers",
                "name": f"{model} ({mode})",
                "line": {"dash": "dot" if mode == "once" else "solid", "color": colors[model]},
            }
        )
    layout = house_layout(
        title="Precision by month", x_title="month", y_title="precision %", xaxis={"type": "category"}
    )
    return go.Figure(data=traces, layout=layout)


def _lead_figure(alerts: pl.DataFrame, colors: dict[str, str]) -> go.Figure:
    traces: list[dict[str, Any]] = []
    right = alerts.filter(pl.col("true"))
    for (model, mode), part in right.group_by(["model", "mode"], maintain_order=True):
        traces.append(
            {
                "type": "box",
                "y": part["lead_h"].to_list(),
                "name": f"{model} ({mode})",
                "boxmean": True,
                "marker": {"color": colors[model]},
            }
        )
    layout = house_layout(title="Hours from a right alert to the failure", y_title="hours", xaxis={"type": "category"})
    return go.Figure(data=traces, layout=layout)


def write_health_report(
    result: EvaluationLike, path: str | Path, *, context: dict[str, str] | None = None, title: str = "gpufleet health"
) -> Path:
    """Write the self-contained HTML report of an evaluation to ``path``; return the path."""
    colors = _model_colors(result.table)
    figs = [_monthly_figure(result.monthly, colors), _lead_figure(result.alerts, colors)]
    divs = [html.figure_div(fig, div_id=f"fig-{i}", include_plotlyjs=i == 0) for i, fig in enumerate(figs)]
    body = [
        html.kv_table({**(context or {}), "failures in the test span": f"{result.failures:,}"}),
        html.section(
            "Models",
            _metrics_table(result.table),
            note="Each model alerts on at most its budget of GPUs per round; an alert is right when the GPU "
            "fails within the horizon. Ensembles raise fewer alerts than the budget by design.",
        ),
        html.section(
            "Over time",
            html.grid(divs[0], divs[1]),
            note="Dotted: trained once on the first weeks; solid: refit at the start of every period on the "
            "most recent weeks (sliding).",
        ),
    ]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html.page(title, body, footer="gpufleet health"), encoding="utf-8")
    return out
