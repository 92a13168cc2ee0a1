"""``gpufleet contention``: fit and inspect the network-contention model of :mod:`gpufleet.perf.contention`.

``fit`` calibrates the sensitivity x intensity constants on DeepShare's measured co-location matrix and reports
the error on cells (or whole job types) the fit never saw; ``show`` prints a model's constants and what it
predicts for each pair of models. The work is :mod:`gpufleet.perf.contention_study`'s; NumPy, SciPy and Plotly
load inside the commands, so ``gpufleet contention --help`` stays light.
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from gpufleet.cli.common import err, out
from gpufleet.errors import ConfigError
from gpufleet.report.fmt import clean_json, format_fixed

if TYPE_CHECKING:
    from gpufleet.perf.contention import ContentionModel

__all__ = ["contention_app"]

contention_app = typer.Typer(
    help="Network contention between co-located multi-node jobs: a sensitivity x intensity model fitted to "
    "DeepShare's measurements.\n\n"
    "`gpufleet contention fit` refits the model on DeepShare's 36 x 36 co-location matrix "
    "(shipped with gpufleet) and reports its error on held-back cells; `--by types` holds back "
    "whole job types instead. `gpufleet contention show` prints the shipped model's constants and its predicted "
    "slowdowns. `gpufleet simulate --network` uses the model. See docs/contention.md.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


class HoldBy(StrEnum):
    """What ``fit`` holds back: random cells of the matrix, or whole victim job types (rows)."""

    cells = "cells"
    types = "types"


def _constants_tables(model: ContentionModel) -> tuple[Table, Table]:
    """Two Rich tables: per-model and per-placement sensitivity / intensity constants."""
    models = Table(title="per-model constants", header_style="bold")
    for col in ("model", "sensitivity", "intensity"):
        models.add_column(col, justify="left" if col == "model" else "right")
    for m in model.models:
        models.add_row(m, format_fixed(model.model_s[m]), format_fixed(model.model_p[m]))
    places = Table(title="per-placement constants", header_style="bold")
    for col in ("GPUs", "nodes", "sensitivity", "intensity"):
        places.add_column(col, justify="right")
    for (g, n), s in model.place_s.items():
        places.add_row(str(g), str(n), format_fixed(s), format_fixed(model.place_p.get((g, n), math.nan)))
    return models, places


# ---------------------------------------------------------------------------------------------- commands
@contention_app.command("fit")
def fit_cmd(
    folder: Annotated[
        Path | None,
        typer.Argument(
            help="Folder with DeepShare's tables (deepshare_isolated_thp.csv, deepshare_shared_thp_ratio.csv, "
            "deepshare_total_samples_trained.csv) [default: the tables shipped with gpufleet]."
        ),
    ] = None,
    holdout: Annotated[
        float, typer.Option(help="Share of cells (or job types, --by types) held back, in (0, 1).")
    ] = 0.3,
    seed: Annotated[int, typer.Option(help="Random seed of the held-back draw.")] = 0,
    by: Annotated[
        HoldBy, typer.Option(help="Hold back random `cells` of the matrix, or whole victim job `types` (their rows).")
    ] = HoldBy.cells,
    out_path: Annotated[Path | None, typer.Option("--out", help="Save the fitted model (JSON) here.")] = None,
    report: Annotated[Path | None, typer.Option(help="Write a self-contained HTML report here.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object: summary, per_type, constants.")
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
    from gpufleet.perf.contention import default_deepshare_folder
    from gpufleet.perf.contention_study import MAE_BAR, fit_deepshare, model_constants, report_data

    result = fit_deepshare(folder, holdout=holdout, seed=seed, by=by.value)
    fit, summary, per_type = result.fit, result.summary, result.per_type
    if out_path is not None:
        fit.model.save(out_path)
    if report is not None:
        from gpufleet.report.contention_report import write_contention_report

        context = {
            "data": str(folder or default_deepshare_folder()),
            "held back by": by.value,
            "holdout": f"{holdout:g}",
            "seed": str(seed),
        }
        write_contention_report(report, **report_data(result), context=context)
    if as_json:
        payload = {
            "summary": summary,
            "per_type": [clean_json(row) for row in per_type],
            "constants": model_constants(fit.model),
        }
        print(json.dumps(payload, indent=1))
        return
    verdict = "[green]meets[/]" if summary["meets_bar"] else "[red]misses[/]"
    out.print(
        f"[bold]contention fit[/] on {summary['cells']:,} cells of DeepShare's matrix, "
        f"{summary['held_back']:,} held back by {by.value} (holdout {holdout:g}, seed {seed}); "
        f"{summary['free_constants']} free constants"
    )
    out.print(
        f"train MAE {fit.train_mae:.4f}  held-back MAE [bold]{fit.test_mae:.4f}[/]  "
        f"held-back worst {fit.test_max:.4f}  -> {verdict} the {MAE_BAR} bar"
    )
    for table in _constants_tables(fit.model):
        out.print(table)
    types = Table(title="held-back error by victim job type", header_style="bold")
    for col in ("job type", "held back", "MAE", "max", "sensitivity", "intensity"):
        types.add_column(col, justify="left" if col == "job type" else "right")
    for row in per_type:
        f = format_fixed
        types.add_row(
            row["job_type"],
            str(row["held_back"]),
            f(row["mae"]),
            f(row["max"]),
            f(row["sensitivity"]),
            f(row["intensity"]),
        )
    out.print(types)
    if out_path is not None:
        err.print(f"model written to {out_path}")
    if report is not None:
        err.print(f"report written to {report}")


@contention_app.command("show")
def show_cmd(
    model_path: Annotated[
        Path | None,
        typer.Option("--model", help="A model written by `contention fit --out` [default: the shipped model]."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the constants and the pair table as JSON.")] = False,
) -> None:
    """Print a contention model's constants and its predicted model-pair ratios at 8 GPUs over 2 nodes.

    Examples: `gpufleet contention show`, `gpufleet contention show --model model.json`.

    Cell [victim, aggressor] is the victim's predicted throughput beside the aggressor over its throughput
    alone, both jobs on 8 GPUs spread over 2 nodes. Single-node jobs have no network traffic: 1.0 always.
    """
    from gpufleet.perf.contention import ContentionModel
    from gpufleet.perf.contention_study import SHOW_PLACEMENT, model_constants, pair_matrix

    if model_path is not None and not model_path.is_file():
        raise ConfigError(
            f"{model_path}: no such model file; write one with `gpufleet contention fit --out {model_path}`"
        )
    model = ContentionModel.load(model_path) if model_path is not None else ContentionModel.default()
    gpus, nodes = SHOW_PLACEMENT
    names, matrix = pair_matrix(model, gpus, nodes)
    if as_json:
        print(
            json.dumps(
                {
                    "source": model.source,
                    "constants": model_constants(model),
                    "placement": {"gpus": gpus, "nodes": nodes},
                    "pair_ratios": {
                        v: dict(zip(names, row, strict=True)) for v, row in zip(names, matrix, strict=True)
                    },
                },
                indent=1,
            )
        )
        return
    out.print(f"[bold]contention model[/] {model_path or '(shipped)'}: {model.source or 'no source recorded'}")
    for table in _constants_tables(model):
        out.print(table)
    pairs = Table(
        title=f"predicted throughput ratio, victim (row) beside aggressor (column), {gpus} GPUs on {nodes} nodes each",
        header_style="bold",
    )
    pairs.add_column("victim \\ aggressor")
    for a in names:
        pairs.add_column(a, justify="right")
    for v, row in zip(names, matrix, strict=True):
        pairs.add_row(v, *(format_fixed(r) for r in row))
    out.print(pairs)
