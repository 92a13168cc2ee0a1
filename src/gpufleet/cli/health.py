"""``gpufleet health``: thin command-line shells over :mod:`gpufleet.health`.

``generate`` draws a synthetic fleet, ``import`` reads real exports (dcgm-exporter, CSV, Parquet, kernel
logs) into the canonical Parquet, ``train`` / ``evaluate`` / ``predict`` fit, judge and use failure models.
Heavy modules (LightGBM, torch) load inside the commands, so ``gpufleet health --help`` stays light.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gpufleet.cli.common import RegistryHelp, err, out
from gpufleet.errors import HealthError

health_app = typer.Typer(
    help="Predict GPU failures from telemetry, and act on the prediction.\n\n"
    "`gpufleet health generate -o fleet.parquet` draws a realistic fleet (20,000 GPUs, 120 days of hourly DCGM "
    "telemetry, failures at Llama 3's published rate and mix); `gpufleet health evaluate fleet.parquet` compares "
    "GBDT, MLP, LSTM, 1D-CNN and the parallel and cascade ensembles, trained once or sliding; "
    "`gpufleet health train` + `predict` name the GPUs likely to fail next.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


_UNITS = {"h": 1, "d": 24, "w": 168}


def parse_hours(text: str, what: str) -> int:
    """'7d', '48h', '2w' or a bare number of hours -> hours."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([hdw]?)\s*", text)
    if not m:
        raise HealthError(f"{what}: cannot read '{text}' as a duration; write e.g. 48h, 7d or 2w")
    return round(float(m.group(1)) * _UNITS[m.group(2) or "h"])


def _progress() -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,}/{task.total:,}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


def _feature_config(window: str, horizon: str, recent: str = "24h") -> Any:
    from gpufleet.health.features import FeatureConfig

    return FeatureConfig(
        window_h=parse_hours(window, "--window"),
        horizon_h=parse_hours(horizon, "--horizon"),
        recent_h=parse_hours(recent, "--recent"),
    )


def _arrays(path: Path, bin_h: int = 6) -> Any:
    from gpufleet.health.fleet_arrays import build_arrays

    with err.status(f"reading {path} ..."):
        return build_arrays(path, bin_h=bin_h)


@health_app.command()
def generate(
    out_path: Annotated[Path, typer.Option("-o", "--out", help="Parquet file to write (failures go beside it).")],
    gpus: Annotated[int, typer.Option(help="GPUs in the fleet (8 per node, 4 nodes per rack).")] = 20_000,
    days: Annotated[float, typer.Option(help="Days of hourly telemetry.")] = 120.0,
    seed: Annotated[int, typer.Option(help="Random seed: the same seed gives the same fleet.")] = 0,
    failure_scale: Annotated[
        float,
        typer.Option(
            help="Multiply Llama 3's published failure rate (1.16e-5 per GPU-hour), e.g. to get failures in a "
            "small fleet."
        ),
    ] = 1.0,
) -> None:
    """Draw a synthetic GPU fleet with hourly DCGM telemetry and the failures it ends in.

    Failure rate and mix come from Llama 3 (419 interruptions in 54 days on 16,384 GPUs, 58.7 % GPU-related);
    precursors follow NVIDIA's XID semantics; healthy GPUs show the same signatures now and then, and the
    fleet drifts (a driver roll-out, summer heat, a bad maintenance). See docs/health.md.
    """
    from gpufleet.health.generator import FleetConfig, generate_fleet

    if gpus < 8 or days <= 0:
        raise HealthError("--gpus must be at least 8 and --days positive")
    cfg = FleetConfig(gpus=gpus, days=days, seed=seed, failure_scale=failure_scale)
    with _progress() as bar:
        task = bar.add_task("generating", total=gpus)
        summary = generate_fleet(cfg, out_path, progress=lambda done, _total: bar.update(task, completed=done))
    kinds = ", ".join(f"{k} {v}" for k, v in summary.failures_by_kind.items())
    err.print(f"wrote {summary.rows:,} rows ({summary.gpus:,} GPUs x {summary.hours:,} h) to {summary.path}")
    err.print(
        f"{summary.failures:,} failures ({kinds}); {summary.with_precursor:,} with a precursor, "
        f"{summary.decoy_episodes:,} look-alike episodes on healthy GPUs; truth in {summary.failures_path}"
    )


@health_app.command("import", cls=RegistryHelp)
def import_(
    source: Annotated[Path, typer.Argument(help="dcgm-exporter scrape(s) (.prom / folder), CSV or Parquet.")],
    out_path: Annotated[Path, typer.Option("-o", "--out", help="Canonical hourly Parquet to write.")],
    reader: Annotated[str | None, typer.Option(help="Force a reader: {telemetry-readers}.")] = None,
    columns: Annotated[
        str | None,
        typer.Option(help="Column mapping canonical=source for CSV/Parquet, e.g. 'gpu=card,time=ts,host=node'."),
    ] = None,
    xid: Annotated[
        list[Path] | None,
        typer.Option(help="Kernel log (dmesg, kern.log, journalctl) whose 'NVRM: Xid' lines are merged; repeatable."),
    ] = None,
) -> None:
    """Read real telemetry exports into the canonical hourly Parquet that train / evaluate / predict read."""
    from gpufleet.health import hourly, readers
    from gpufleet.health import xid as xid_mod

    read = readers.read_telemetry(source, reader=reader, columns=readers.parse_column_map(columns) if columns else None)
    frame = hourly.resample_hourly(read.frame)
    if read.malformed:
        err.print(
            f"[yellow]warning:[/] {read.malformed:,} malformed lines skipped, e.g. "
            + "; ".join(read.malformed_examples[:3])
        )
    if read.unknown_fields:
        err.print(
            f"kept {len(read.unknown_fields)} fields not in the DCGM catalog: " + ", ".join(read.unknown_fields[:8])
        )
    for log in xid or []:
        parsed = xid_mod.parse_kernel_log(log)
        if parsed.malformed:
            err.print(
                f"[yellow]warning:[/] {log}: {parsed.malformed:,} unreadable Xid lines, e.g. "
                + "; ".join(parsed.malformed_examples[:3])
            )
        frame = hourly.merge_xid_events(frame, parsed.events)
        err.print(f"{log}: {parsed.events.height:,} XID events merged")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(out_path)
    err.print(f"wrote {frame.height:,} hourly rows of {frame['gpu'].n_unique():,} GPUs to {out_path}")


@health_app.command(cls=RegistryHelp)
def train(
    fleet: Annotated[Path, typer.Argument(help="Canonical hourly telemetry (Parquet).")],
    out_path: Annotated[
        Path,
        typer.Option(
            "-o", "--out", help="Model file to write: a zip of JSON, safetensors and LightGBM text (never a pickle)."
        ),
    ] = Path("model.zip"),
    model: Annotated[str, typer.Option(help="Failure model: {health-models}.")] = "cascade",
    window: Annotated[str, typer.Option(help="Observation window each prediction looks back over.")] = "7d",
    horizon: Annotated[
        str, typer.Option(help="A GPU is positive if it fails within this after the prediction.")
    ] = "48h",
    train_span: Annotated[str, typer.Option(help="Train on this much of the most recent telemetry.")] = "28d",
    calibrate: Annotated[str, typer.Option(help="Held-out tail used to turn scores into probabilities.")] = "14d",
    until: Annotated[
        str | None,
        typer.Option(
            help="Use telemetry only up to this time since the start (e.g. 60d), keeping the rest unseen, e.g. for "
            "`gpufleet simulate --failures ... --predictor`."
        ),
    ] = None,
    budget: Annotated[float, typer.Option(help="Alerts per GPU per daily round (2.5e-4: 5 on 20,000 GPUs).")] = 2.5e-4,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Fit a failure predictor on the most recent telemetry and save it (rerun every period: sliding training)."""
    from gpufleet.health.predictor import train_predictor

    arrays = _arrays(fleet)
    if until is not None:
        arrays = _truncate(arrays, parse_hours(until, "--until"))
    fc = _feature_config(window, horizon)
    with err.status(f"training {model} ..."):
        pred = train_predictor(
            arrays,
            model,
            fc,
            train_days=parse_hours(train_span, "--train-span") / 24,
            calibrate_days=parse_hours(calibrate, "--calibrate") / 24,
            budget=budget,
            seed=seed,
            source=str(fleet.resolve()),
        )
    pred.save(out_path)
    t = pred.trained
    err.print(
        f"{model} trained on {t['instances']:,} instances ({t['positives']:,} positive) from {t['from']} "
        f"to {t['to']}; saved to {out_path}"
    )


def _truncate(arrays: Any, hours: int) -> Any:
    """The fleet arrays up to ``hours`` since the start (whole bins); at least two weeks of them."""
    cut = arrays.until(hours)
    if cut.hours < 24 * 14:
        raise HealthError(f"--until {hours} h leaves less than two weeks of telemetry")
    return cut


@health_app.command(cls=RegistryHelp)
def evaluate(
    fleet: Annotated[Path, typer.Argument(help="Canonical hourly telemetry with failures (Parquet).")],
    models: Annotated[
        str, typer.Option(help="Comma-separated failure models: {health-models}.")
    ] = "gbdt,mlp,lstm,cnn1d,parallel,cascade",
    sliding: Annotated[str, typer.Option(help="Retrain period of sliding training.")] = "14d",
    train_span: Annotated[str, typer.Option(help="Training window (L_train) of every fit.")] = "28d",
    mode: Annotated[str, typer.Option(help="once, sliding or both (comma-separated).")] = "once,sliding",
    window: Annotated[str, typer.Option(help="Observation window.")] = "7d",
    horizon: Annotated[str, typer.Option(help="Prediction horizon.")] = "48h",
    budget: Annotated[float, typer.Option(help="Alerts per GPU per daily round.")] = 2.5e-4,
    report: Annotated[Path | None, typer.Option(help="Write an HTML report here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the metrics as JSON.")] = False,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Compare models on time-based splits at a fixed alert budget: precision, recall, F1, lead time, drift.

    Train-once fits on the first training window and scores every later period; sliding refits at the
    start of each period on the most recent window. Nothing is shuffled across time.
    """
    from gpufleet.health.evaluate import EvalConfig
    from gpufleet.health.evaluate import evaluate as run_eval

    names = [m.strip() for m in models.split(",") if m.strip()]
    modes = [m.strip() for m in mode.split(",") if m.strip()]
    arrays = _arrays(fleet)
    cfg = EvalConfig(
        features=_feature_config(window, horizon),
        train_days=parse_hours(train_span, "--train-span") / 24,
        period_days=parse_hours(sliding, "--sliding") / 24,
        budget=budget,
        seed=seed,
    )
    with err.status("evaluating ...") as status:
        result = run_eval(arrays, names, cfg, modes=modes, progress=lambda msg: status.update(msg))
    if as_json:
        print(
            json.dumps(
                {"failures": result.failures, "models": result.table.to_dicts(), "monthly": result.monthly.to_dicts()},
                indent=2,
                default=str,
            )
        )
    else:
        table = Table(title=f"{fleet.name}: {result.failures:,} failures in the test span", header_style="bold")
        for col in ("model", "mode", "alerts", "right", "precision", "recall", "F1", "lead h"):
            table.add_column(col, justify="left" if col in ("model", "mode") else "right")
        for r in result.table.iter_rows(named=True):
            table.add_row(
                r["model"],
                r["mode"],
                f"{r['alerts']:,}",
                f"{r['true_alerts']:,}",
                f"{100 * r['precision']:.1f} %",
                f"{100 * r['recall']:.1f} %",
                f"{r['f1']:.3f}",
                "-" if r["lead_h_median"] is None else f"{r['lead_h_median']:.0f}",
            )
        out.print(table)
    if report is not None:
        from gpufleet.report.health_report import write_health_report

        path = write_health_report(
            result,
            report,
            context={
                "telemetry": str(fleet),
                "GPUs": f"{arrays.gpus:,}",
                "days": f"{arrays.hours / 24:g}",
                "budget": f"{budget:g} alerts per GPU per round",
                "window / horizon": f"{window} / {horizon}",
                "training window / sliding period": f"{train_span} / {sliding}",
            },
        )
        err.print(f"report written to {path}")


@health_app.command()
def predict(
    model: Annotated[Path, typer.Argument(help="Model file from `gpufleet health train`.")],
    telemetry: Annotated[Path, typer.Argument(help="Recent canonical hourly telemetry (Parquet).")],
    top: Annotated[int, typer.Option(help="How many GPUs to list.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the GPUs most likely to fail within the model's horizon, scored at the end of the telemetry."""
    from gpufleet.health.predictor import Predictor, predict_latest

    pred = Predictor.load(model)
    arrays = _arrays(telemetry, bin_h=pred.bin_h)
    frame = predict_latest(pred, arrays, top=top)
    if as_json:
        print(json.dumps(frame.to_dicts(), indent=2, default=str))
        return
    horizon = pred.features.horizon_h
    table = Table(
        title=f"most likely to fail within {horizon} h of {frame['time'][0]} ({pred.model_name})", header_style="bold"
    )
    for col in ("rank", "gpu", "node", "score", "probability", "alert"):
        table.add_column(col, justify="right")
    for r in frame.iter_rows(named=True):
        prob = "-" if r["probability"] != r["probability"] else f"{100 * r['probability']:.0f} %"
        table.add_row(
            str(r["rank"]), str(r["gpu"]), str(r["node"]), f"{r['score']:.3g}", prob, "yes" if r["alert"] else ""
        )
    out.print(table)


@health_app.command("models")
def list_models() -> None:
    """List the failure models and ensembles."""
    from gpufleet.health.models.base import model_names

    for name, text in model_names().items():
        out.print(f"[bold]{name}[/]  {text}")
