"""HTML report of a trace diagnosis: findings table, per-rank step timeline, heat map of function time by rank."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
import polars as pl

from gpufleet.report import html

if TYPE_CHECKING:
    from gpufleet.diagnose.analyzer import Diagnosis, TraceAnalyzer

__all__ = ["write_diagnose_report"]

_CATEGORY_COLORS = {
    "compute": "#4c72b0",
    "communication": "#dd8452",
    "memcpy": "#937860",
    "data_loading": "#55a868",
    "cpu_stall": "#c44e52",
    "sync": "#8172b3",
    "hang": "#000000",
}


def _findings_table(diagnosis: Diagnosis) -> str:
    rows, classes = [], []
    for f in diagnosis.findings:
        rows.append([
            "all" if f.rank is None else str(f.rank),
            f.category,
            f.function[:90],
            f"{f.cost_s_per_step * 1e3:.2f}",
            f"{f.score:.1f}",
            "yes" if f.alarm else "",
            f.localiser,
            _evidence_line(f.evidence),
        ])
        classes.append(["best" if f.alarm else ""] + [""] * 7)
    if not rows:
        return '<p class="note">No findings: every rank behaves like the others and no shared pattern fired.</p>'
    header = ["rank", "category", "function", "ms/step", "score", "alarm", "localiser", "evidence"]
    return html.table(header, rows, cell_classes=classes)


def _evidence_line(evidence: dict[str, Any]) -> str:
    parts = []
    for key, value in evidence.items():
        if key in ("top_functions", "extra_functions", "also"):
            continue
        parts.append(f"{key}={value}")
    return "; ".join(parts)[:200]


def _step_figure(steps: pl.DataFrame) -> go.Figure:
    fig = go.Figure()
    for rank in sorted(steps["rank"].unique().to_list()):
        s = steps.filter(pl.col("rank") == rank).sort("step")
        fig.add_trace(go.Scatter(x=s["step"].to_list(), y=(s["step_s"] * 1e3).to_list(), mode="lines+markers",
                                 name=f"rank {rank}"))
    fig.update_layout(title="Step time per rank", xaxis_title="step", yaxis_title="ms", template="plotly_white")
    return fig


def _category_figure(cats: pl.DataFrame) -> go.Figure:
    fig = go.Figure()
    host = cats.filter(pl.col("domain") == "host")
    ranks = sorted(host["rank"].unique().to_list())
    for category in sorted(host["category"].unique().to_list()):
        c = host.filter(pl.col("category") == category)
        values = dict(zip(c["rank"].to_list(), (c["s_per_step"] * 1e3).to_list(), strict=True))
        fig.add_trace(go.Bar(x=[str(r) for r in ranks], y=[values.get(r, 0.0) for r in ranks], name=category,
                             marker_color=_CATEGORY_COLORS.get(category)))
    fig.update_layout(barmode="stack", title="Host time per step by category (blocking waits included)",
                      xaxis_title="rank", yaxis_title="ms per step", template="plotly_white")
    return fig


def _heatmap(analyzer: TraceAnalyzer, top: int = 30) -> go.Figure:
    per = analyzer.per_step.group_by("rank", "domain", "function").agg(pl.col("time_s").mean())
    keep = (per.group_by("domain", "function").agg(pl.col("time_s").max()).sort("time_s", descending=True)
            .head(top).select("domain", "function"))
    per = per.join(keep, on=["domain", "function"])
    ranks = sorted(per["rank"].unique().to_list())
    labels = [f"{d}: {f[:60]}" for d, f in keep.iter_rows()]
    grid = {(d, f): {} for d, f in keep.iter_rows()}
    for rank, d, f, t in per.iter_rows():
        grid[(d, f)][rank] = t * 1e3
    z = [[grid[key].get(r, 0.0) for r in ranks] for key in grid]
    fig = go.Figure(go.Heatmap(z=z, x=[str(r) for r in ranks], y=labels, colorscale="Viridis",
                               colorbar={"title": "ms/step"}))
    fig.update_layout(title=f"Time per step of the top {len(labels)} functions, by rank", xaxis_title="rank",
                      template="plotly_white", yaxis={"autorange": "reversed"}, margin={"l": 380})
    return fig


def write_diagnose_report(analyzer: TraceAnalyzer, diagnosis: Diagnosis, path: str | Path,
                          *, title: str = "gpufleet diagnose") -> Path:
    """Write the self-contained HTML report of ``diagnosis`` to ``path``; return the path."""
    context = {
        "traces": ", ".join(str(f.path.name) for f in analyzer.traces.files[:8])
        + (" ..." if len(analyzer.traces.files) > 8 else ""),
        "ranks": f"{len(diagnosis.ranks)} present, world size {diagnosis.world_size or 'unknown'}",
        "median step": f"{diagnosis.step_s_median * 1e3:.2f} ms",
        "notes": " | ".join(diagnosis.notes) or "none",
    }
    figs = [_step_figure(analyzer.step_times()), _category_figure(analyzer.category_time()), _heatmap(analyzer)]
    divs = [html.figure_div(fig, div_id=f"fig-{i}", include_plotlyjs=i == 0, height="520px" if i == 2 else "440px")
            for i, fig in enumerate(figs)]
    body = [
        html.kv_table(context),
        html.section("Findings", _findings_table(diagnosis),
                     note="Ranked by time lost per step; alarms passed both the score and the cost thresholds."),
        html.section("Steps", f'<div class="grid">{divs[0]}{divs[1]}</div>'),
        html.section("Function time by rank", divs[2],
                     note="Host ops by self time, device kernels by duration; a column unlike the others is the "
                          "rank to look at."),
    ]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html.page(title, body, footer="gpufleet diagnose"), encoding="utf-8")
    return out
