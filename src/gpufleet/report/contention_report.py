"""The HTML page of a contention-model fit: measured vs predicted scatter, the measured and predicted co-location
matrices side by side, the fitted constants and the held-back error per job type. Takes plain arrays and dicts
(see :func:`gpufleet.perf.contention_study.report_data`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpufleet.report.fmt import format_fixed

__all__ = ["write_contention_report"]


def write_contention_report(
    path: Path,
    *,
    labels: Sequence[str],
    measured: Any,
    predicted: Any,
    train_mask: Any,
    summary: Mapping[str, Any],
    per_type: Sequence[Mapping[str, Any]],
    model_constants: Mapping[str, tuple[float, float]],
    placement_constants: Mapping[str, tuple[float, float]],
    source: str = "",
    context: Mapping[str, str] | None = None,
) -> Path:
    """Write the page to ``path``. ``measured``/``predicted`` are the square ratio matrices (victim rows,
    aggressor columns, in ``labels`` order), ``train_mask`` the cells the fit saw; the constants map a model or
    a placement to (sensitivity, intensity); ``summary`` carries cells, held_back, free_constants, train_mae,
    test_mae, test_max and bar."""
    import numpy as np
    import plotly.graph_objects as go

    from gpufleet.report import html
    from gpufleet.report.plots import house_layout

    measured, predicted, train_mask = np.asarray(measured), np.asarray(predicted), np.asarray(train_mask, bool)
    rows, cols = np.indices(measured.shape)
    # plain SVG scatter (not WebGL): 1,296 points draw fast and the page needs no GPU
    points = []
    for name, mask, color in (("train", train_mask, "#9aa4ae"), ("held back", ~train_mask, "#cf222e")):
        text = [f"{labels[i]} beside {labels[j]}" for i, j in zip(rows[mask], cols[mask], strict=True)]
        points.append(
            go.Scatter(
                x=measured[mask],
                y=predicted[mask],
                mode="markers",
                name=name,
                text=text,
                marker={"color": color, "size": 5, "opacity": 0.7},
                hovertemplate="%{text}<br>measured %{x:.3f}<br>predicted %{y:.3f}<extra></extra>",
            )
        )
    points.append(
        go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="exact", line={"color": "#1f2328", "dash": "dot", "width": 1})
    )
    # a square plot of the unit range: the plot area shrinks to keep the aspect instead of widening the range
    square = {"range": [0, 1.05], "constrain": "domain"}
    scatter = go.Figure(
        points,
        layout=house_layout(
            title="Throughput ratio: measured vs predicted",
            x_title="measured",
            y_title="predicted",
            xaxis=square,
            yaxis={**square, "scaleanchor": "x"},
        ),
    )

    def heatmap(z: np.ndarray, title: str) -> go.Figure:
        cells = go.Heatmap(
            z=z,
            x=list(labels),
            y=list(labels),
            zmin=0.0,
            zmax=1.0,
            colorscale="RdYlGn",
            hovertemplate="victim %{y}<br>beside %{x}<br>ratio %{z:.3f}<extra></extra>",
        )
        small = {"tickfont": {"size": 8}, "type": "category"}
        return go.Figure(
            cells,
            layout=house_layout(
                title=title,
                x_title="aggressor (beside)",
                y_title="victim",
                xaxis=small,
                yaxis={**small, "autorange": "reversed"},
            ),
        )

    figs = [scatter, heatmap(measured, "Measured (DeepShare)"), heatmap(predicted, "Predicted (fit)")]
    divs = [
        html.figure_div(fig, div_id=f"fig-{i}", include_plotlyjs=i == 0, height="560px" if i else "520px")
        for i, fig in enumerate(figs)
    ]
    f = format_fixed
    bar = summary["bar"]
    model_rows = [[m, f(s), f(p)] for m, (s, p) in model_constants.items()]
    place_rows = [[name, f(s), f(p)] for name, (s, p) in placement_constants.items()]
    type_rows = [
        [t["job_type"], str(t["held_back"]), f(t["mae"]), f(t["max"]), f(t["sensitivity"]), f(t["intensity"])]
        for t in per_type
    ]
    body = [
        html.kv_table(
            {
                **(context or {}),
                "free constants": summary["free_constants"],
                "cells": f"{summary['cells']:,} ({summary['held_back']:,} held back)",
                "train MAE": f(summary["train_mae"]),
                "held-back MAE": f(summary["test_mae"]),
                "held-back worst": f(summary["test_max"]),
                f"meets the {bar} bar": "yes" if summary["test_mae"] <= bar else "no",
            }
        ),
        html.section(
            "Measured vs predicted",
            divs[0],
            note="Each point is one (victim, aggressor) cell of the 36 x 36 matrix; held-back cells never "
            "entered the fit.",
        ),
        html.section(
            "Co-location matrix",
            html.grid(divs[1], divs[2]),
            note="Cell [victim, aggressor]: the victim's throughput beside the aggressor over its "
            "throughput alone (1 = no slowdown).",
        ),
        html.section(
            "Constants",
            html.table(["model", "sensitivity", "intensity"], model_rows),
            html.table(["placement", "sensitivity", "intensity"], place_rows),
            note="A job type's sensitivity (intensity) is its model's constant times its placement's.",
        ),
        html.section(
            "Per job type (victim)",
            html.table(["job type", "held back", "MAE", "max", "sensitivity", "intensity"], type_rows),
        ),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        html.page("gpufleet contention fit", body, footer=f"gpufleet contention fit; {source}"), encoding="utf-8"
    )
    return path
