"""HTML report of a trace diagnosis: findings table, per-rank step timeline, heat map of function time by rank.

It reads the analyzer and diagnosis through the small Protocols below, so ``gpufleet.report`` does not
import ``gpufleet.diagnose`` (the report is used by capabilities, never the other way round).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import plotly.graph_objects as go
import polars as pl

from gpufleet.report import html
from gpufleet.report.plots import PALETTE, house_layout

__all__ = ["DiagnosisLike", "FindingLike", "TraceAnalyzerLike", "write_diagnose_report"]

#: Above this many ranks the step plot names only the slowest ranks and draws the others in grey.
MAX_NAMED_RANKS = 10


class FindingLike(Protocol):
    """One finding as the report shows it (``gpufleet.diagnose.findings.Finding``)."""

    @property
    def rank(self) -> int | None: ...
    @property
    def function(self) -> str: ...
    @property
    def category(self) -> str: ...
    @property
    def cost_s_per_step(self) -> float: ...
    @property
    def score(self) -> float: ...
    @property
    def evidence(self) -> Mapping[str, Any]: ...
    @property
    def localiser(self) -> str: ...
    @property
    def alarm(self) -> bool: ...


class DiagnosisLike(Protocol):
    """The diagnosis: ranked findings and the run's context (``gpufleet.diagnose.analyzer.Diagnosis``)."""

    @property
    def findings(self) -> Sequence[FindingLike]: ...
    @property
    def ranks(self) -> Sequence[int]: ...
    @property
    def world_size(self) -> int | None: ...
    @property
    def step_s_median(self) -> float: ...
    @property
    def notes(self) -> Sequence[str]: ...


class _TraceFileLike(Protocol):
    @property
    def path(self) -> Path: ...


class _TraceSetLike(Protocol):
    @property
    def files(self) -> Sequence[_TraceFileLike]: ...


class TraceAnalyzerLike(Protocol):
    """The frames the report plots (``gpufleet.diagnose.analyzer.TraceAnalyzer``).

    ``step_times()``: rank, step, step_s; ``category_time()``: rank, domain, category, s_per_step;
    ``per_step``: rank, domain, function, time_s (one row per step).
    """

    @property
    def traces(self) -> _TraceSetLike: ...
    @property
    def per_step(self) -> pl.DataFrame: ...
    def step_times(self) -> pl.DataFrame: ...
    def category_time(self) -> pl.DataFrame: ...


_CATEGORY_COLORS = {
    "compute": "#4c72b0",
    "communication": "#dd8452",
    "memcpy": "#937860",
    "data_loading": "#55a868",
    "cpu_stall": "#c44e52",
    "sync": "#8172b3",
    "hang": "#000000",
}


def _findings_table(diagnosis: DiagnosisLike) -> str:
    rows, classes = [], []
    for f in diagnosis.findings:
        rows.append(
            [
                "all" if f.rank is None else str(f.rank),
                f.category,
                f.function[:90],
                f"{f.cost_s_per_step * 1e3:.2f}",
                f"{f.score:.1f}",
                "yes" if f.alarm else "",
                f.localiser,
                _evidence_line(f.evidence),
            ]
        )
        classes.append(["best" if f.alarm else ""] + [""] * 7)
    if not rows:
        return '<p class="note">No findings: every rank behaves like the others and no shared pattern fired.</p>'
    header = ["rank", "category", "function", "ms/step", "score", "alarm", "localiser", "evidence"]
    return html.table(header, rows, cell_classes=classes, text_columns=(1, 2, 6, 7))


def _evidence_line(evidence: Mapping[str, Any]) -> str:
    parts = []
    for key, value in evidence.items():
        if key in ("top_functions", "extra_functions", "also"):
            continue
        parts.append(f"{key}={value}")
    return "; ".join(parts)[:200]


def _step_figure(steps: pl.DataFrame) -> go.Figure:
    """Step time per rank, one named line per rank; with many ranks only the slowest are named."""
    ranks = sorted(steps["rank"].unique().to_list())
    named = set(ranks)
    if len(ranks) > MAX_NAMED_RANKS:
        slowest = steps.group_by("rank").agg(pl.col("step_s").mean()).sort(["step_s", "rank"], descending=[True, False])
        named = set(slowest["rank"].head(MAX_NAMED_RANKS).to_list())
    traces: list[dict[str, Any]] = []
    grey_shown = False
    for rank in ranks:
        s = steps.filter(pl.col("rank") == rank).sort("step")
        trace: dict[str, Any] = {
            "type": "scatter",
            "x": s["step"].to_list(),
            "y": (s["step_s"] * 1e3).to_list(),
            "mode": "lines+markers",
            "name": f"rank {rank}",
            "hovertemplate": f"rank {rank}, step %{{x}}: %{{y:.2f}} ms<extra></extra>",
        }
        if rank in named:
            colour = PALETTE[len([t for t in traces if t.get("legendgroup") != "others"]) % len(PALETTE)]
            trace["line"] = {"color": colour, "width": 2}
        else:  # one legend entry stands for every unnamed rank
            trace.update(
                line={"color": "#c0c4cc", "width": 1},
                marker={"size": 3},
                legendgroup="others",
                showlegend=not grey_shown,
                name="other ranks",
            )
            grey_shown = True
        traces.append(trace)
    traces.sort(key=lambda t: t.get("legendgroup") != "others")  # grey lines underneath the named ones
    title = "Step time per rank" if len(named) == len(ranks) else f"Step time per rank (the {len(named)} slowest named)"
    first, last = (int(steps["step"].min()), int(steps["step"].max())) if steps.height else (0, 1)
    xaxis = {"tick0": first, "dtick": max(1, math.ceil((last - first) / 10))}  # whole steps only
    return go.Figure(
        data=traces,
        layout=house_layout(title=title, x_title="step", y_title="ms per step", xaxis=xaxis, hovermode="closest"),
    )


def _category_figure(cats: pl.DataFrame) -> go.Figure:
    host = cats.filter(pl.col("domain") == "host")
    ranks = sorted(host["rank"].unique().to_list())
    traces = []
    for category in sorted(host["category"].unique().to_list()):
        c = host.filter(pl.col("category") == category)
        values = dict(zip(c["rank"].to_list(), (c["s_per_step"] * 1e3).to_list(), strict=True))
        traces.append(
            {
                "type": "bar",
                "x": [str(r) for r in ranks],
                "y": [values.get(r, 0.0) for r in ranks],
                "name": category,
                "marker": {"color": _CATEGORY_COLORS.get(category, "#9c755f")},
            }
        )
    layout = house_layout(
        title="Host time per step by category",
        x_title="rank",
        y_title="ms per step (blocking waits included)",
        xaxis={"type": "category"},
        barmode="stack",
    )
    return go.Figure(data=traces, layout=layout)


def _heatmap(analyzer: TraceAnalyzerLike, top: int = 30) -> go.Figure:
    per = analyzer.per_step.group_by("rank", "domain", "function").agg(pl.col("time_s").mean())
    keep = (
        per.group_by("domain", "function")
        .agg(pl.col("time_s").max())
        .sort("time_s", descending=True)
        .head(top)
        .select("domain", "function")
    )
    per = per.join(keep, on=["domain", "function"])
    ranks = sorted(per["rank"].unique().to_list())
    labels = [f"{d}: {f[:60]}" for d, f in keep.iter_rows()]
    grid: dict[tuple[str, str], dict[int, float]] = {(d, f): {} for d, f in keep.iter_rows()}
    for rank, d, f, t in per.iter_rows():
        grid[(d, f)][rank] = t * 1e3
    z = [[grid[key].get(r, 0.0) for r in ranks] for key in grid]
    heat = {
        "type": "heatmap",
        "z": z,
        "x": [str(r) for r in ranks],
        "y": labels,
        "colorscale": "Viridis",
        "colorbar": {"title": {"text": "ms/step"}},
    }
    layout = house_layout(
        title=f"Time per step of the top {len(labels)} functions, by rank",
        x_title="rank",
        xaxis={"type": "category"},
        yaxis={"autorange": "reversed", "type": "category"},
    )
    return go.Figure(data=[heat], layout=layout)


def write_diagnose_report(
    analyzer: TraceAnalyzerLike, diagnosis: DiagnosisLike, path: str | Path, *, title: str = "gpufleet diagnose"
) -> Path:
    """Write the self-contained HTML report of ``diagnosis`` to ``path``; return the path."""
    files = analyzer.traces.files
    context = {
        "traces": ", ".join(str(f.path.name) for f in files[:8]) + (" ..." if len(files) > 8 else ""),
        "ranks": f"{len(diagnosis.ranks)} present, world size {diagnosis.world_size or 'unknown'}",
        "median step": f"{diagnosis.step_s_median * 1e3:.2f} ms",
        "notes": " | ".join(diagnosis.notes) or "none",
    }
    figs = [_step_figure(analyzer.step_times()), _category_figure(analyzer.category_time()), _heatmap(analyzer)]
    rows = len(figs[2].data[0].y) if figs[2].data else 0
    heights = ["440px", "440px", f"{max(360, 160 + 24 * rows)}px"]  # the heat map: one readable band per function
    divs = [
        html.figure_div(fig, div_id=f"fig-{i}", include_plotlyjs=i == 0, height=heights[i])
        for i, fig in enumerate(figs)
    ]
    body = [
        html.kv_table(context),
        html.section(
            "Findings",
            _findings_table(diagnosis),
            note="Ranked by time lost per step; alarms passed both the score and the cost thresholds.",
        ),
        html.section("Steps", html.grid(divs[0], divs[1])),
        html.section(
            "Function time by rank",
            divs[2],
            note="Host ops by self time, device kernels by duration; a column unlike the others is the "
            "rank to look at.",
        ),
    ]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html.page(title, body, footer="gpufleet diagnose"), encoding="utf-8")
    return out
