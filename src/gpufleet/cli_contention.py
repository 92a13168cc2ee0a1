"""``gpufleet contention``: fit and inspect the network-contention model of :mod:`gpufleet.perf.contention`.

``fit`` calibrates the sensitivity x intensity constants on DeepShare's measured co-location matrix and reports
the error on cells (or whole job types) the fit never saw; ``show`` prints a model's constants and what it
predicts for each pair of models. NumPy, SciPy and Plotly load inside the commands, so
``gpufleet contention --help`` stays light.
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from gpufleet.cli_console import err, out
from gpufleet.errors import ConfigError

if TYPE_CHECKING:
    from gpufleet.perf.contention import ContentionModel, FitReport

contention_app = typer.Typer(
    help="Network contention between co-located multi-node jobs: a sensitivity x intensity model fitted to "
    "DeepShare's measurements.\n\n"
    "`gpufleet contention fit` refits the model on DeepShare's 36 x 36 co-location matrix "
    "(`../shared/data/contention` by default) and reports its error on held-back cells; `--by types` holds back "
    "whole job types instead. `gpufleet contention show` prints the shipped model's constants and its predicted "
    "slowdowns. `gpufleet simulate --network` uses the model. See docs/contention.md.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)

#: The accuracy the model is held to: mean absolute error of the throughput ratio on held-back cells.
MAE_BAR = 0.08
#: Where ``fit`` looks for DeepShare's tables when no folder is given (relative to the current directory).
DEFAULT_FOLDER = Path("../shared/data/contention")
#: Where DeepShare's tables come from, for the error message when they are missing.
DEEPSHARE_SOURCE = (
    "copy scheduler/jobs/isolated_thp.csv, shared_thp_ratio.csv and total_samples_trained.csv from "
    "https://github.com/gajagajago/deepshare (Apache-2.0) into one folder, renamed with a 'deepshare_' prefix"
)
#: The placement of ``show``'s model-pair table: 8 GPUs over 2 nodes.
SHOW_PLACEMENT = (8, 2)


class HoldBy(StrEnum):
    """What ``fit`` holds back: random cells of the matrix, or whole victim job types (rows)."""

    cells = "cells"
    types = "types"


# ---------------------------------------------------------------------------------------------- helpers
def _clean(value: Any) -> Any:
    """JSON-safe values: NaN and infinity become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _folder(folder: Path | None) -> Path:
    """The folder of DeepShare's tables: the one given, else the default beside the checkout."""
    if folder is None:
        if not DEFAULT_FOLDER.is_dir():
            raise ConfigError(f"no FOLDER given and no DeepShare tables at {DEFAULT_FOLDER} "
                              f"(from {Path.cwd()}); {DEEPSHARE_SOURCE}, and pass that folder")
        return DEFAULT_FOLDER
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such folder of DeepShare tables; {DEEPSHARE_SOURCE}")
    return folder


def _constants(model: ContentionModel) -> dict[str, dict[str, float]]:
    """The fitted constants of ``model``, keyed as in its JSON form."""
    full = model.to_dict()
    return {k: full[k] for k in ("model_sensitivity", "model_intensity", "placement_sensitivity",
                                 "placement_intensity")}


def _f(value: float, digits: int = 3) -> str:
    return "—" if not math.isfinite(value) else f"{value:.{digits}f}"


def _constants_tables(model: ContentionModel) -> tuple[Table, Table]:
    """Two Rich tables: per-model and per-placement sensitivity / intensity constants."""
    models = Table(title="per-model constants", header_style="bold")
    for col in ("model", "sensitivity", "intensity"):
        models.add_column(col, justify="left" if col == "model" else "right")
    for m in model.models:
        models.add_row(m, _f(model.model_s[m]), _f(model.model_p[m]))
    places = Table(title="per-placement constants", header_style="bold")
    for col in ("GPUs", "nodes", "sensitivity", "intensity"):
        places.add_column(col, justify="right")
    for (g, n), s in model.place_s.items():
        places.add_row(str(g), str(n), _f(s), _f(model.place_p.get((g, n), math.nan)))
    return models, places


def _pair_matrix(model: ContentionModel, gpus: int, nodes: int) -> tuple[list[str], list[list[float]]]:
    """The model's predicted ratio of each victim model (rows) beside each aggressor model (columns)."""
    names = model.models
    return names, [[model.pair_ratio((v, gpus, nodes), (a, gpus, nodes)) for a in names] for v in names]


def _write_report(fit: FitReport, path: Path, *, context: dict[str, str]) -> Path:
    """A self-contained HTML page: measured vs predicted scatter, the two heatmaps side by side, the tables."""
    import numpy as np
    import plotly.graph_objects as go

    from gpufleet.report import html

    labels = [f"{m},{g},{n}" for m, g, n in fit.keys]
    rows, cols = np.indices(fit.measured.shape)
    scatter = go.Figure()
    for name, mask, color in (("train", fit.train_mask, "#9aa4ae"), ("held back", ~fit.train_mask, "#cf222e")):
        text = [f"{labels[i]} beside {labels[j]}" for i, j in zip(rows[mask], cols[mask], strict=True)]
        scatter.add_trace(go.Scattergl(x=fit.measured[mask], y=fit.predicted[mask], mode="markers", name=name,
                                       text=text, marker={"color": color, "size": 5, "opacity": 0.7},
                                       hovertemplate="%{text}<br>measured %{x:.3f}<br>predicted %{y:.3f}"))
    scatter.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="exact",
                                 line={"color": "#1f2328", "dash": "dot", "width": 1}))
    scatter.update_layout(title="Throughput ratio: measured vs predicted", xaxis_title="measured",
                          yaxis_title="predicted", template="plotly_white", xaxis={"range": [0, 1.05]},
                          yaxis={"range": [0, 1.05], "scaleanchor": "x"})

    def heatmap(z: np.ndarray, title: str) -> go.Figure:
        fig = go.Figure(go.Heatmap(z=z, x=labels, y=labels, zmin=0.0, zmax=1.0, colorscale="RdYlGn",
                                   hovertemplate="victim %{y}<br>beside %{x}<br>ratio %{z:.3f}<extra></extra>"))
        fig.update_layout(title=title, xaxis_title="aggressor (beside)", yaxis_title="victim",
                          template="plotly_white", yaxis={"autorange": "reversed"},
                          xaxis={"tickfont": {"size": 8}}, margin={"l": 140, "b": 140})
        fig.update_yaxes(tickfont={"size": 8})
        return fig

    figs = [scatter, heatmap(fit.measured, "Measured (DeepShare)"), heatmap(fit.predicted, "Predicted (fit)")]
    divs = [html.figure_div(fig, div_id=f"fig-{i}", include_plotlyjs=i == 0, height="560px" if i else "520px")
            for i, fig in enumerate(figs)]
    summary = fit.summary()
    per_type = fit.per_type()
    model_rows = [[m, _f(fit.model.model_s[m]), _f(fit.model.model_p[m])] for m in fit.model.models]
    place_rows = [[f"{g} GPUs / {n} nodes", _f(s), _f(fit.model.place_p[(g, n)])]
                  for (g, n), s in fit.model.place_s.items()]
    type_rows = [[t["job_type"], str(t["held_back"]), _f(t["mae"]), _f(t["max"]), _f(t["sensitivity"]),
                  _f(t["intensity"])] for t in per_type]
    body = [
        html.kv_table({**context, "free constants": summary["free_constants"],
                       "cells": f"{summary['cells']:,} ({summary['held_back']:,} held back)",
                       "train MAE": _f(summary["train_mae"]), "held-back MAE": _f(summary["test_mae"]),
                       "held-back worst": _f(summary["test_max"]),
                       f"meets the {MAE_BAR} bar": "yes" if summary["test_mae"] <= MAE_BAR else "no"}),
        html.section("Measured vs predicted", divs[0],
                     note="Each point is one (victim, aggressor) cell of the 36 x 36 matrix; held-back cells never "
                          "entered the fit."),
        html.section("Co-location matrix", f'<div class="grid">{divs[1]}{divs[2]}</div>',
                     note="Cell [victim, aggressor]: the victim's throughput beside the aggressor over its "
                          "throughput alone (1 = no slowdown)."),
        html.section("Constants", html.table(["model", "sensitivity", "intensity"], model_rows),
                     html.table(["placement", "sensitivity", "intensity"], place_rows),
                     note="A job type's sensitivity (intensity) is its model's constant times its placement's."),
        html.section("Per job type (victim)",
                     html.table(["job type", "held back", "MAE", "max", "sensitivity", "intensity"], type_rows)),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html.page("gpufleet contention fit", body, footer=f"gpufleet contention fit; {fit.model.source}"),
                    encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- commands
@contention_app.command("fit")
def fit_cmd(
    folder: Annotated[Path | None, typer.Argument(
        help="Folder with DeepShare's tables (deepshare_isolated_thp.csv, deepshare_shared_thp_ratio.csv, "
        "deepshare_total_samples_trained.csv) [default: ../shared/data/contention].")] = None,
    holdout: Annotated[float, typer.Option(help="Share of cells (or job types, --by types) held back, in (0, 1).")
                       ] = 0.3,
    seed: Annotated[int, typer.Option(help="Random seed of the held-back draw.")] = 0,
    by: Annotated[HoldBy, typer.Option(
        help="Hold back random `cells` of the matrix, or whole victim job `types` (their rows).")] = HoldBy.cells,
    out_path: Annotated[Path | None, typer.Option("--out", help="Save the fitted model (JSON) here.")] = None,
    report: Annotated[Path | None, typer.Option(help="Write a self-contained HTML report here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object: summary, per_type, constants.")
                       ] = False,
) -> None:
    """Fit the contention model to DeepShare's co-location matrix and report its error on held-back cells.

    Examples:

    `gpufleet contention fit`

    `gpufleet contention fit --by types --seed 3`

    `gpufleet contention fit path/to/deepshare --out model.json --report fit.html`

    The model predicts each cell as 1 / (1 + s_victim * p_aggressor), with s and p each a per-model constant
    times a per-placement constant (24 free constants for 36 x 36 = 1,296 cells). The bar is a held-back mean
    absolute error of the throughput ratio of at most 0.08. Use `--out` then `gpufleet contention show --model`
    to inspect the refit; the shipped model is the seed-0 cells fit.
    """
    from gpufleet.perf.contention import fit_contention, load_deepshare, victim_type_mask

    if not 0.0 < holdout < 1.0:
        raise ConfigError(f"--holdout must be in (0, 1), got {holdout}")
    data = load_deepshare(_folder(folder))
    mask = victim_type_mask(len(data.keys), holdout, seed) if by is HoldBy.types else None
    fit = fit_contention(data, holdout=holdout, seed=seed, train_mask=mask)
    summary = {**fit.summary(), "by": by.value, "bar": MAE_BAR, "meets_bar": bool(fit.test_mae <= MAE_BAR)}
    per_type = fit.per_type()
    if out_path is not None:
        fit.model.save(out_path)
    if report is not None:
        _write_report(fit, report, context={"data": str(folder or DEFAULT_FOLDER), "held back by": by.value,
                                            "holdout": f"{holdout:g}", "seed": str(seed)})
    if as_json:
        payload = {"summary": summary,
                   "per_type": [{k: _clean(v) for k, v in row.items()} for row in per_type],
                   "constants": _constants(fit.model)}
        print(json.dumps(payload, indent=1))
        return
    verdict = "[green]meets[/]" if summary["meets_bar"] else "[red]misses[/]"
    out.print(f"[bold]contention fit[/] on {summary['cells']:,} cells of DeepShare's matrix, "
              f"{summary['held_back']:,} held back by {by.value} (holdout {holdout:g}, seed {seed}); "
              f"{summary['free_constants']} free constants")
    out.print(f"train MAE {fit.train_mae:.4f}  held-back MAE [bold]{fit.test_mae:.4f}[/]  "
              f"held-back worst {fit.test_max:.4f}  -> {verdict} the {MAE_BAR} bar")
    for table in _constants_tables(fit.model):
        out.print(table)
    types = Table(title="held-back error by victim job type", header_style="bold")
    for col in ("job type", "held back", "MAE", "max", "sensitivity", "intensity"):
        types.add_column(col, justify="left" if col == "job type" else "right")
    for row in per_type:
        types.add_row(row["job_type"], str(row["held_back"]), _f(row["mae"]), _f(row["max"]),
                      _f(row["sensitivity"]), _f(row["intensity"]))
    out.print(types)
    if out_path is not None:
        err.print(f"model written to {out_path}")
    if report is not None:
        err.print(f"report written to {report}")


@contention_app.command("show")
def show_cmd(
    model_path: Annotated[Path | None, typer.Option("--model", help="A model written by `contention fit --out` "
                                                                    "[default: the shipped model].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the constants and the pair table as JSON.")
                       ] = False,
) -> None:
    """Print a contention model's constants and its predicted model-pair ratios at 8 GPUs over 2 nodes.

    Examples: `gpufleet contention show`, `gpufleet contention show --model model.json`.

    Cell [victim, aggressor] is the victim's predicted throughput beside the aggressor over its throughput
    alone, both jobs on 8 GPUs spread over 2 nodes. Single-node jobs have no network traffic: 1.0 always.
    """
    from gpufleet.perf.contention import ContentionModel

    if model_path is not None and not model_path.is_file():
        raise ConfigError(f"{model_path}: no such model file; write one with `gpufleet contention fit --out "
                          f"{model_path}`")
    model = ContentionModel.load(model_path) if model_path is not None else ContentionModel.default()
    gpus, nodes = SHOW_PLACEMENT
    names, matrix = _pair_matrix(model, gpus, nodes)
    if as_json:
        print(json.dumps({"source": model.source, "constants": _constants(model),
                          "placement": {"gpus": gpus, "nodes": nodes},
                          "pair_ratios": {v: dict(zip(names, row, strict=True))
                                          for v, row in zip(names, matrix, strict=True)}}, indent=1))
        return
    out.print(f"[bold]contention model[/] {model_path or '(shipped)'}: {model.source or 'no source recorded'}")
    for table in _constants_tables(model):
        out.print(table)
    pairs = Table(title=f"predicted throughput ratio, victim (row) beside aggressor (column), {gpus} GPUs on "
                        f"{nodes} nodes each", header_style="bold")
    pairs.add_column("victim \\ aggressor")
    for a in names:
        pairs.add_column(a, justify="right")
    for v, row in zip(names, matrix, strict=True):
        pairs.add_row(v, *(_f(r) for r in row))
    out.print(pairs)
