"""HTML report of ``gpufleet diagnose diff``: what explains the step-time change of two runs, and every op's change.

It reads the diff through the small Protocol below, so ``gpufleet.report`` does not import ``gpufleet.diagnose``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import plotly.graph_objects as go
import polars as pl

from gpufleet.report import html
from gpufleet.report.plots import house_layout

__all__ = ["TraceDiffLike", "write_diff_report"]

_SLOWER, _FASTER = "#e15759", "#59a14f"


class TraceDiffLike(Protocol):
    """The diff of two runs (``gpufleet.diagnose.diff.TraceDiff``).

    ``ops``: device, function, control/test calls and seconds per step, delta_s_per_step, change;
    ``explain``: category, function, control/test self seconds per step, delta_s_per_step, share_of_step_change,
    explains.
    """

    @property
    def ops(self) -> pl.DataFrame: ...
    @property
    def explain(self) -> pl.DataFrame: ...
    @property
    def control_step_s(self) -> float: ...
    @property
    def test_step_s(self) -> float: ...
    @property
    def control_steps(self) -> int: ...
    @property
    def test_steps(self) -> int: ...
    @property
    def notes(self) -> Sequence[str]: ...


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f}"


def _explain_figure(explain: pl.DataFrame, top: int = 15) -> go.Figure:
    """The largest self-time deltas per step, slower in red, faster in green, largest at the top."""
    rows = explain.sort(pl.col("delta_s_per_step").abs(), descending=True).head(top)
    labels = [f"{f[:60]} ({c})" for f, c in zip(rows["function"], rows["category"], strict=True)]
    deltas = (rows["delta_s_per_step"] * 1e3).to_list()
    bar = {
        "type": "bar",
        "orientation": "h",
        "x": deltas,
        "y": labels,
        "marker": {"color": [_SLOWER if d > 0 else _FASTER for d in deltas]},
        "hovertemplate": "%{y}: %{x:+.3f} ms/step<extra></extra>",
        "showlegend": False,
    }
    layout = house_layout(
        title=f"The {len(labels)} largest changes of self time per step (test - control)",
        x_title="ms per step",
        yaxis={"autorange": "reversed", "type": "category", "automargin": True},
    )
    return go.Figure(data=[bar], layout=layout)


def _explain_table(diff: TraceDiffLike) -> str:
    rows = diff.explain.filter(pl.col("explains"))
    if rows.is_empty():
        return '<p class="note">The step time did not change, or no difference stands out.</p>'
    body = [
        [
            r["function"][:100],
            r["category"],
            _ms(r["control_self_s_per_step"]),
            _ms(r["test_self_s_per_step"]),
            f"{r['delta_s_per_step'] * 1e3:+.3f}",
            f"{r['share_of_step_change']:.0%}",
        ]
        for r in rows.iter_rows(named=True)
    ]
    header = ["function", "category", "control ms/step", "test ms/step", "change ms/step", "share of step change"]
    return html.table(header, body, text_columns=(0, 1))


def _ops_table(ops: pl.DataFrame, top: int) -> str:
    shown = ops.filter(pl.col("change") != "same")
    shown = shown.sort(pl.col("delta_s_per_step").abs(), descending=True).head(top)
    body, classes = [], []
    for r in shown.iter_rows(named=True):
        body.append(
            [
                r["function"][:100],
                "kernel" if r["device"] else "host",
                r["change"],
                f"{r['control_calls_per_step']:.1f}",
                f"{r['test_calls_per_step']:.1f}",
                _ms(r["control_s_per_step"]),
                _ms(r["test_s_per_step"]),
                f"{r['delta_s_per_step'] * 1e3:+.3f}",
            ]
        )
        classes.append(["", "", "best" if r["delta_s_per_step"] < 0 else "", "", "", "", "", ""])
    if not body:
        return '<p class="note">Every function and kernel takes the same time in both runs.</p>'
    header = ["function", "kind", "change", "control calls/step", "test calls/step", "control ms/step"]
    header += ["test ms/step", "change ms/step"]
    return html.table(header, body, cell_classes=classes, text_columns=(0,))


def write_diff_report(
    diff: TraceDiffLike,
    path: str | Path,
    *,
    control: str = "control",
    test: str = "test",
    top: int = 60,
    title: str = "gpufleet diagnose diff",
) -> Path:
    """Write the self-contained HTML report of ``diff`` to ``path``; return the path."""
    change = diff.test_step_s - diff.control_step_s
    share = change / diff.control_step_s if diff.control_step_s else 0.0
    context = {
        "control": f"{control} ({diff.control_steps} rank-steps)",
        "test": f"{test} ({diff.test_steps} rank-steps)",
        "mean step": f"{diff.control_step_s * 1e3:.2f} ms -> {diff.test_step_s * 1e3:.2f} ms "
        f"({change * 1e3:+.2f} ms, {share:+.1%})",
        "notes": " | ".join(diff.notes) or "none",
    }
    fig = _explain_figure(diff.explain)
    height = f"{max(320, 140 + 26 * len(fig.data[0].y))}px"
    body = [
        html.kv_table(context),
        html.section(
            "What explains the step-time change",
            _explain_table(diff),
            html.figure_div(fig, div_id="fig-explain", include_plotlyjs=True, height=height),
            note="Self time on the training thread tiles the step, so these changes add up to the change of the "
            "mean step; listed are the largest that together make up most of it.",
        ),
        html.section(
            "Functions and kernels that changed",
            _ops_table(diff.ops, top),
            note="Calls and total time per step as HTA's TraceDiff counts them (a nested op also counts inside its "
            "parent), averaged over every rank's steps; largest changes first.",
        ),
    ]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html.page(title, body, footer="gpufleet diagnose diff"), encoding="utf-8")
    return out
