"""HTML report of a failure-prediction evaluation: the metrics table, precision by month, lead times."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import plotly.graph_objects as go
import polars as pl

from gpufleet.report import html

if TYPE_CHECKING:
    from gpufleet.health.evaluate import EvalResult

__all__ = ["write_health_report"]


def _metrics_table(table: pl.DataFrame) -> str:
    header = ["model", "mode", "alerts", "right", "precision", "recall", "F1", "failures foreseen", "lead h (median)"]
    best = table["precision"].max()
    rows, classes = [], []
    for r in table.iter_rows(named=True):
        rows.append([r["model"], r["mode"], f"{r['alerts']:,}", f"{r['true_alerts']:,}",
                     f"{100 * r['precision']:.1f} %", f"{100 * r['recall']:.1f} %", f"{r['f1']:.3f}",
                     f"{r['caught']:,}",
                     "-" if r["lead_h_median"] is None else f"{r['lead_h_median']:.0f}"])
        classes.append(["", "", "", "", "best" if r["precision"] == best else "", "", "", "", ""])
    return html.table(header, rows, cell_classes=classes)


def _monthly_figure(monthly: pl.DataFrame) -> go.Figure:
    fig = go.Figure()
    for (model, mode), part in monthly.sort("month").group_by(["model", "mode"], maintain_order=True):
        fig.add_trace(go.Scatter(x=part["month"].to_list(), y=(100 * part["precision"]).to_list(),
                                 mode="lines+markers", name=f"{model} ({mode})",
                                 line={"dash": "dot" if mode == "once" else "solid"}))
    fig.update_layout(title="Precision by month: train-once (dotted) vs sliding training (solid)",
                      xaxis_title="month", yaxis_title="precision %", template="plotly_white")
    return fig


def _lead_figure(alerts: pl.DataFrame) -> go.Figure:
    fig = go.Figure()
    right = alerts.filter(pl.col("true"))
    for (model, mode), part in right.group_by(["model", "mode"], maintain_order=True):
        fig.add_trace(go.Box(y=part["lead_h"].to_list(), name=f"{model} ({mode})", boxmean=True))
    fig.update_layout(title="Hours from a right alert to the failure", yaxis_title="hours",
                      template="plotly_white", showlegend=False)
    return fig


def write_health_report(result: EvalResult, path: str | Path, *, context: dict[str, str] | None = None,
                        title: str = "gpufleet health") -> Path:
    """Write the self-contained HTML report of an evaluation to ``path``; return the path."""
    figs = [_monthly_figure(result.monthly), _lead_figure(result.alerts)]
    divs = [html.figure_div(fig, div_id=f"fig-{i}", include_plotlyjs=i == 0) for i, fig in enumerate(figs)]
    body = [
        html.kv_table({**(context or {}), "failures in the test span": f"{result.failures:,}"}),
        html.section("Models", _metrics_table(result.table),
                     note="Each model alerts on at most its budget of GPUs per round; an alert is right when the GPU "
                          "fails within the horizon. Ensembles raise fewer alerts than the budget by design."),
        html.section("Over time", f'<div class="grid">{divs[0]}{divs[1]}</div>'),
    ]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html.page(title, body, footer="gpufleet health"), encoding="utf-8")
    return out
