"""The ``gpufleet`` command line: one Typer app whose subcommands are thin shells over library calls.

Heavy modules are imported inside the commands, so ``gpufleet --help`` stays fast. Errors a user can cause
(gpufleet's own exception types) print as one line and exit with status 2, without a traceback.
"""

from __future__ import annotations

import json
import math
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from gpufleet.cli_console import err, out
from gpufleet.cli_contention import contention_app
from gpufleet.cli_diagnose import diagnose_app
from gpufleet.cli_health import health_app
from gpufleet.cli_meta import meta_app
from gpufleet.cli_mixes import register as register_mix_command
from gpufleet.cli_sched import sched_app
from gpufleet.cli_serve import serve_app
from gpufleet.errors import GpufleetError

app = typer.Typer(
    name="gpufleet",
    help="Tools for people who run large GPU clusters for deep learning.\n\n"
    "Start with `gpufleet simulate`: it replays the bundled Microsoft Philly trace (82k jobs) on the "
    "default cluster under every baseline scheduling policy and prints a comparison.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
)
traces_app = typer.Typer(help="Inspect, convert and generate job traces.", no_args_is_help=True)
app.add_typer(traces_app, name="traces")
register_mix_command(traces_app)
perf_app = typer.Typer(
    help="Training performance model: step time, MFU and memory of a layout, and its accuracy against "
    "published runs.\n\nStart with `gpufleet perf step --model gpt3-175b --gpus 1024 --tp 8 --pp 8 --gbs 1536`; "
    "`gpufleet plan` searches all layouts.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
app.add_typer(perf_app, name="perf")
app.add_typer(diagnose_app, name="diagnose")
app.add_typer(health_app, name="health")
app.add_typer(meta_app, name="meta")
app.add_typer(serve_app, name="serve")
app.add_typer(sched_app, name="sched")
app.add_typer(contention_app, name="contention")



# ---------------------------------------------------------------------------------------------- helpers
def _load_jobs(trace: str, columns: str | None, vc: str | None, reader: str | None, quiet: bool = False):
    from gpufleet.traces import load_trace, parse_columns

    mapping = parse_columns(columns) if columns else None
    load = load_trace(trace, reader=reader, columns=mapping, vc=vc)
    if load.rejected_total and not quiet:
        err.print(f"[yellow]warning:[/] {load.rejected_summary()}")
    return load


def _load_cluster(cluster: Path | None, gpus: int | None):
    from gpufleet.spec import load_cluster

    spec = load_cluster(cluster)
    if gpus is not None:
        if gpus <= 0:
            raise typer.BadParameter("--gpus must be positive")
        spec = spec.resized(gpus)
    return spec


def _clean(value: Any) -> Any:
    """JSON-safe values: NaN and infinity become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _fmt_s(seconds: float) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "—"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _summary_table(results: list, title: str):
    from rich.table import Table

    table = Table(title=title, header_style="bold")
    cols = ["policy", "jobs", "avg JCT", "p99 JCT", "avg queue", "p95 queue", "GPU util", "makespan",
            "preempt.", "lost GPU-h", "wall"]
    with_usage = any("usage" in r.summary for r in results)
    with_aryl = any("reclaims" in r.summary for r in results)
    if with_usage:
        cols.insert(7, "usage")
    if with_aryl:
        cols[-1:-1] = ["loaned GPU-h", "reclaims", "reclaim preempt.", "scale events"]
    with_net = any("contention_gpu_h" in r.summary for r in results)
    if with_net:
        cols[-1:-1] = ["contention GPU-h", "multi-node"]
    for col in cols:
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        s = r.summary
        row = [
            s["policy"], f"{s['finished']:,}/{s['jobs']:,}", _fmt_s(s["avg_jct_s"]), _fmt_s(s["p99_jct_s"]),
            _fmt_s(s["avg_queue_s"]), _fmt_s(s["p95_queue_s"]), f"{100 * s['gpu_util']:.1f} %",
            _fmt_s(s["makespan_s"]), f"{s['preemptions']:,}", f"{s['lost_work_gpu_h']:,.0f}",
        ]
        if with_usage:
            row.insert(7, f"{100 * s['usage']:.1f} %" if "usage" in s else "-")
        if with_aryl:
            row += [f"{s['loaned_gpu_hours']:,.0f}", f"{s['reclaims']:,}", f"{s['reclaim_preemptions']:,}",
                    f"{s['scale_events']:,}"] if "reclaims" in s else ["-"] * 4
        if with_net:
            row += [f"{s['contention_gpu_h']:,.1f}", f"{100 * s['multi_node_share']:.0f} %"] if (
                "contention_gpu_h" in s) else ["-"] * 2
        row.append(f"{s['wall_s']:.2f} s")
        table.add_row(*row)
    return table


# ---------------------------------------------------------------------------------------------- simulate
@app.command()
def simulate(
    trace: Annotated[str, typer.Option(help="'philly' (bundled) or a CSV / Parquet file of jobs.")] = "philly",
    columns: Annotated[str | None, typer.Option(
        help="Column mapping for a CSV: canonical=source pairs, e.g. "
        "'submit=submission_time,duration=duration,gpus=num_gpu'.")] = None,
    reader: Annotated[str | None, typer.Option(help="Force a trace reader: philly, csv or parquet.")] = None,
    vc: Annotated[str | None, typer.Option(help="Only the jobs of this virtual cluster.")] = None,
    cluster: Annotated[Path | None, typer.Option(
        help="Cluster TOML file or a bundled cluster's name (default, deepshare-testbed, deepshare-64, "
        "h100-superpod, hetero-holmes; default: the bundled default).")] = None,
    gpus: Annotated[int | None, typer.Option(help="Resize the training pools to at least this many GPUs.")] = None,
    policy: Annotated[str, typer.Option(
        help="Comma-separated policies: fifo, sjf, srtf, las, tiresias, and Aryl's aryl, aryl-loan, aryl-elastic, "
        "aryl-base (see `gpufleet policies`).")] = ",".join(("fifo", "sjf", "srtf", "las", "tiresias")),
    opt: Annotated[list[str] | None, typer.Option(
        help="Policy option POLICY.KEY=VALUE, repeatable, e.g. tiresias.thresholds=3600,36000; a bare KEY=VALUE "
        "(e.g. reclaim=random) applies to every chosen policy that has that option.")] = None,
    inference: Annotated[str | None, typer.Option(
        help="Inference load on the cluster's inference pool: 'genai' (the bundled Alibaba GenAI trace, the "
        "default when the cluster has an inference pool), 'diurnal', 'none', a CSV time,servers_needed, or "
        "'punica[:genai|diurnal]' / 'punica-per-adapter[:...]': LoRA traffic of that shape served by batched "
        "multi-adapter serving or one adapter at a time (gpufleet serve's capacity model). "
        "Aryl loans the idle servers to training.")] = None,
    elastic_share: Annotated[float, typer.Option(
        help="Share of jobs made elastic (Aryl policies) when the trace has no min_workers/max_workers "
        "columns. No published mix states it; 0.5 is the middle of the 0-100 % sweep.")] = 0.5,
    scale_pause: Annotated[float, typer.Option(
        help="Seconds an elastic job pauses on each scale-out / scale-in (published restarts: 18-103 s).")] = 40.0,
    reclaim_notice: Annotated[float, typer.Option(
        help="Seconds of notice before a reclaimed server goes back to inference (0: at once).")] = 0.0,
    loan_speed: Annotated[float | None, typer.Option(
        help="Speed of a worker on a loaned inference GPU relative to a training GPU (default: from the GPU "
        "catalog, e.g. 0.43 for T4 vs V100).")] = None,
    interval: Annotated[float, typer.Option(
        help="Seconds between Aryl's knapsack rounds that resize elastic jobs.")] = 300.0,
    placement: Annotated[str, typer.Option(help="consolidate (fewest nodes, best fit) or spread.")] = "consolidate",
    strict_placement: Annotated[bool, typer.Option(
        help="Start multi-GPU jobs only on the fewest possible nodes (they wait otherwise).")] = False,
    placement_penalty: Annotated[float, typer.Option(
        help="Throughput lost by a job spread over more nodes than it needs (0.2 = 20 % slower).")] = 0.2,
    checkpoint_interval: Annotated[float | None, typer.Option(
        help="Seconds of progress between checkpoints; preemption and failures lose the work since the last. "
        "Default 0 (jobs checkpoint when preempted and lose nothing), or 3600 with --failures.")
    ] = None,
    restart_cost: Annotated[float, typer.Option(help="Seconds a preempted job spends restoring on restart.")] = 60.0,
    report: Annotated[Path | None, typer.Option(help="Write a self-contained HTML report here.")] = None,
    jobs_out: Annotated[Path | None, typer.Option(
        help="Write every job's outcome (all policies) to this Parquet file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON (one object per policy).")] = False,
    breakdown: Annotated[str | None, typer.Option(help="Also print a per-'vc' or per-'size' breakdown.")] = None,
    workers: Annotated[int, typer.Option(help="Run policies in parallel over this many processes.")] = 1,
    ray: Annotated[bool, typer.Option("--ray", help="Run the policy sweep as tasks on a local Ray instance.")] = False,
    ray_address: Annotated[str | None, typer.Option(help="Run the sweep on this Ray cluster address.")] = None,
    debug: Annotated[bool, typer.Option(help="Check cluster invariants after every event (slow).")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar over simulated time.")] = True,
    network: Annotated[bool, typer.Option(
        "--network", help="Model network contention: multi-node jobs share NIC and rack-uplink bandwidth, and "
        "their speed follows the traffic beside them (model fitted to DeepShare's measurements; see "
        "docs/contention.md). Jobs take their communication pattern from a 'model' column (`--columns "
        "model=...`) or, without one, from --comm-mix. Adds the policies contention, random, rl, las-spread, "
        "srtf-spread; `rl:PATH` uses a model trained with `gpufleet sched train-rl`.")] = False,
    comm_mix: Annotated[str | None, typer.Option(
        help="With --network: communication profiles for jobs whose model is unknown, e.g. "
        "'FSDP=0.5,MoE=0.5' (profiles: MobileNetV3, GraphSage, FSDP, Transformer-XL, DLRM, MoE; default: "
        "equal shares).")] = None,
    failures: Annotated[Path | None, typer.Option(
        help="Fleet telemetry Parquet: inject its GPU failures into the running jobs (fleet node n -> training "
        "node n mod N; fleet time 0 = the trace's first submission). See docs/sim_failures.md.")] = None,
    predictor: Annotated[Path | None, typer.Option(
        help="Failure model (with --failures): also run each policy draining the nodes it flags, and compare.")
    ] = None,
    repair_hours: Annotated[float, typer.Option(help="Hours a failed node is out for repair.")] = 24.0,
    drain_hours: Annotated[float | None, typer.Option(
        help="Hours a drained (flagged) node is out for inspection (default: the predictor's horizon, so that a "
        "right alert's failure falls inside the drain).")] = None,
) -> None:
    """Replay a job trace on a cluster under scheduling policies and compare queueing, JCT and utilisation.

    With no options: the bundled Philly trace on the bundled cluster (640 V100 for training, 768 T4 for
    inference) under fifo, sjf, srtf, las and tiresias. Ctrl-C stops a long run and reports what was
    simulated so far.

    Metrics: gpu_util is busy training GPUs over the training pool; usage is GPU-time allocated to training
    and to inference over the capacity of both pools, measured over the trace's arrival window (first to
    last submission) so that the drain after the last arrival does not dilute it. Aryl runs also report
    loaned_gpu_hours, reclaims (servers given back), reclaim_preemptions and scale_events. With --failures:
    failures, job_interruptions, lost_gpu_hours_failures, drains, drain_true, drain_false,
    false_alarm_gpu_hours, drain_gpu_hours, avoided_failures (and predictor: whether alerts drained nodes).
    """
    from gpufleet.sim.config import SimConfig
    from gpufleet.sim.elastic_jobs import ElasticConfig
    from gpufleet.sim.run import parse_policy_opts, run_policies

    policies, model_paths = _split_policies(policy)
    if not policies:
        raise typer.BadParameter("--policy names no policy")
    if breakdown not in (None, "vc", "size"):
        raise typer.BadParameter("--breakdown must be 'vc' or 'size'")
    load = _load_jobs(trace, columns, vc, reader)
    spec = _load_cluster(cluster, gpus)
    opts = parse_policy_opts(opt or [], policies)
    for name, path in model_paths.items():
        opts.setdefault(name, {})["model"] = path
    if network:
        load.jobs = _with_comm_profiles(load.jobs, comm_mix)
    elif any(p in _NETWORK_POLICIES for p in policies):
        raise typer.BadParameter(f"policies {', '.join(sorted(_NETWORK_POLICIES & set(policies)))} place jobs "
                                 "by network contention: add --network")
    inference_load = _inference_for(spec, inference, load.jobs)
    elastic_cfg = ElasticConfig(elastic_share=elastic_share, scale_pause_s=scale_pause,
                                reclaim_notice_s=reclaim_notice, loan_speed=loan_speed, interval_s=interval)
    show_progress = progress and not as_json and err.is_terminal and workers <= 1 and not (ray or ray_address)
    if predictor is not None and failures is None:
        raise typer.BadParameter("--predictor needs --failures (the fleet telemetry it predicts on)")
    if failures is not None and (ray or ray_address):
        raise typer.BadParameter("--failures runs on local processes (--workers), not on Ray")
    if checkpoint_interval is None:
        from gpufleet.sim.failure_run import DEFAULT_FAILURE_CHECKPOINT_S

        checkpoint_interval = DEFAULT_FAILURE_CHECKPOINT_S if failures is not None else 0.0
    config = SimConfig(placement=placement, strict_placement=strict_placement, placement_penalty=placement_penalty,
                       checkpoint_interval_s=checkpoint_interval, restart_s=restart_cost, debug=debug,
                       progress=show_progress, network=network)
    if not as_json:
        err.print(f"[bold]{load.jobs.height:,}[/] jobs from {load.source} on cluster "
                  f"'{spec.name}' ({spec.total_gpus():,} training GPUs); policies: {', '.join(policies)}")

    def done(r: Any) -> None:
        if not as_json:
            extra = " [yellow](interrupted)[/]" if r.meta.get("interrupted") else ""
            err.print(f"  {r.policy}: {r.summary['finished']:,} jobs finished in {r.summary['wall_s']:.2f} s{extra}")

    address = ray_address or ("local" if ray else None)
    if failures is not None:
        results = _run_with_failures(load.jobs, spec, policies, config, opts, failures, predictor, repair_hours,
                                     drain_hours, workers, done, as_json)
    else:
        results = run_policies(load.jobs, spec, policies, config, opts, workers=workers, ray_address=address,
                               on_done=done, inference=inference_load, elastic=elastic_cfg)
    unsched = results[0].meta.get("unschedulable", {}) if results else {}
    if unsched and not as_json:
        err.print("[yellow]warning:[/] jobs never scheduled: "
                  + "; ".join(f"{v:,} {k}" for k, v in unsched.items()))
    if as_json:
        rows = [{k: _clean(v) for k, v in r.summary.items()} for r in results]
        print(json.dumps(rows, indent=2))
    else:
        from types import SimpleNamespace

        # failure runs: label the predictor runs ("fifo+predictor")
        shown = results if failures is None else [SimpleNamespace(summary={**r.summary, "policy": r.policy})
                                                  for r in results]
        out.print(_summary_table(shown, f"{load.source} on {spec.name} ({spec.total_gpus():,} GPUs)"))
        if failures is not None:
            out.print(_failure_table(results))
        if breakdown:
            _print_breakdown(results, breakdown)
    if report is not None:
        from gpufleet.report import write_sim_report

        context = {"trace": str(load.source), "jobs": f"{load.jobs.height:,}", "cluster": spec.name,
                   "training GPUs": f"{spec.total_gpus():,}", "placement": placement,
                   "checkpoint interval": f"{checkpoint_interval:g} s", "restart cost": f"{restart_cost:g} s"}
        if vc:
            context["vc"] = vc
        path = write_sim_report(results, report, context=context)
        err.print(f"report written to {path}")
    if jobs_out is not None:
        import polars as pl

        frames = [r.jobs.with_columns(pl.lit(r.policy).alias("policy")) for r in results]
        jobs_out.parent.mkdir(parents=True, exist_ok=True)
        pl.concat(frames).write_parquet(jobs_out)
        err.print(f"job outcomes written to {jobs_out}")


_NETWORK_POLICIES = frozenset({"contention", "random", "rl"})


def _split_policies(text: str) -> tuple[list[str], dict[str, str]]:
    """``"las,rl:model.zip"`` -> (["las", "rl"], {"rl": "model.zip"})."""
    names: list[str] = []
    paths: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, sep, path = item.partition(":")
        if sep:
            if not path:
                raise typer.BadParameter(f"--policy '{item}': give a model path after ':'")
            paths[name] = path
        if name in names:
            raise typer.BadParameter(f"--policy names '{name}' twice (one run per policy; compare models with "
                                     "separate runs or `gpufleet sched eval-rl`)")
        names.append(name)
    return names, paths


def _with_comm_profiles(jobs: Any, comm_mix: str | None) -> Any:
    """Give every job a communication profile for the network model (its model column, else the mix)."""
    from gpufleet.perf.comm_profiles import assign_profiles, parse_mix
    from gpufleet.perf.contention import DEEPSHARE_MODELS

    if "comm_profile" in jobs.columns and comm_mix is None:
        return jobs
    if "model" in jobs.columns and comm_mix is None and set(jobs["model"].drop_nulls().unique()) <= set(
            DEEPSHARE_MODELS) and jobs["model"].null_count() == 0:
        return jobs
    return assign_profiles(jobs, parse_mix(comm_mix) if comm_mix else None, seed=0)


def _run_with_failures(jobs: Any, spec: Any, policies: list[str], config: Any, opts: Any, fleet: Path,
                       model: Path | None, repair_hours: float, drain_hours: float | None, workers: int, done: Any,
                       quiet: bool) -> list:
    """Each policy with the fleet's failures injected, and with the predictor's drains when ``model`` is set."""
    from gpufleet.health.api import failure_events, predicted_alerts, predictor_horizon_h
    from gpufleet.sim.failure_run import run_failure_study
    from gpufleet.sim.failures import OutageSettings

    if drain_hours is None:
        drain_hours = predictor_horizon_h(model) if model is not None else 12.0
    if repair_hours <= 0 or drain_hours <= 0:
        raise typer.BadParameter("--repair-hours and --drain-hours must be positive")
    fails = failure_events(fleet)
    alerts = predicted_alerts(model, fleet) if model is not None else None
    if not quiet:
        extra = f", {alerts.height:,} alerts from {model}" if alerts is not None else ""
        err.print(f"{fails.height:,} failures from {fleet}{extra}; fleet time 0 = the trace's first submission, "
                  "events after the last job ends are ignored")
    settings = OutageSettings(repair_s=repair_hours * 3600.0, drain_s=drain_hours * 3600.0)
    return run_failure_study(jobs, spec, policies, fails, alerts, config, settings, opts, workers=workers,
                             on_done=done)


def _failure_table(results: list):
    from rich.table import Table

    from gpufleet.sim.failure_run import comparison

    table = Table(title="failures: without and with the predictor", header_style="bold")
    cols = ("policy", "predictor", "failures", "interruptions", "lost GPU-h", "drains (true/false)",
            "false-alarm GPU-h", "avoided", "avg JCT", "finished")
    for col in cols:
        table.add_column(col, justify="left" if col in ("policy", "predictor") else "right")
    for row in comparison(results).iter_rows(named=True):
        table.add_row(row["policy"], "yes" if row["predictor"] else "no", f"{row['failures']:,}",
                      f"{row['job_interruptions']:,}", f"{row['lost_gpu_hours_failures']:,.1f}",
                      f"{row['drains']:,} ({row['drain_true']:,}/{row['drain_false']:,})",
                      f"{row['false_alarm_gpu_hours']:,.1f}", f"{row['avoided_failures']:,}",
                      _fmt_s(row["avg_jct_s"]), f"{row['finished']:,}/{row['jobs']:,}")
    return table


def _inference_for(spec: Any, source: str | None, jobs: Any) -> Any:
    """The inference load for ``spec``'s inference pools over the trace's span (None without such a pool)."""
    pool_servers = sum(p.nodes for p in spec.inference_pools)
    if not pool_servers:
        if source not in (None, "none"):
            raise typer.BadParameter(f"--inference {source}: cluster '{spec.name}' has no inference pool")
        return None
    from gpufleet.traces.inference import load_inference

    span = float(jobs["submit_s"].max()) + 60 * 86400.0 if jobs.height else 86400.0
    kind, _, profile = (source or "").partition(":")
    if kind in ("punica", "punica-per-adapter"):
        return _punica_load(spec, kind, profile or "genai", pool_servers, span)
    return load_inference(source or "genai", pool_servers=pool_servers, until_s=span)


def _punica_load(spec: Any, kind: str, profile: str, pool_servers: int, span: float) -> Any:
    """Servers needed to serve LoRA traffic of ``profile``'s shape on the inference pool, batched across adapters
    (``punica``) or one adapter at a time (``punica-per-adapter``); both see the same request rate (the rate at
    which per-adapter serving fills the pool at its peak), so their difference is what batching frees for loaning."""
    from gpufleet.serve.capacity import LoRAServingModel, lora_inference_load

    pool = spec.inference_pools[0]
    serving = LoRAServingModel(gpu=pool.gpu, model="llama3.2-3b")
    system = "gpufleet" if kind == "punica" else "per_adapter"
    return lora_inference_load(profile, pool_servers=pool_servers, until_s=span, serving=serving, system=system,
                               gpus_per_server=pool.gpus_per_node)


def _print_breakdown(results: list, by: str) -> None:
    from rich.table import Table

    from gpufleet.report.breakdown import breakdown

    for r in results:
        frame = breakdown(r.jobs, by)
        table = Table(title=f"{r.policy}: by {by}", header_style="bold")
        for col in ("group", "jobs", "avg JCT", "avg queue", "p95 JCT"):
            table.add_column(col, justify="left" if col == "group" else "right")
        for row in frame.iter_rows(named=True):
            table.add_row(str(row["group"]), f"{row['jobs']:,}", _fmt_s(row["avg_jct_s"]),
                          _fmt_s(row["avg_queue_s"]), _fmt_s(row["p95_jct_s"]))
        out.print(table)


@app.command()
def policies() -> None:
    """List the scheduling policies and their options."""
    from rich.table import Table

    from gpufleet.sched.base import available_policies

    table = Table(header_style="bold")
    for col in ("policy", "preemptive", "what it does", "options (--opt policy.key=value)"):
        table.add_column(col)
    for name, cls in sorted(available_policies().items()):
        opts = ", ".join(f"{k}={v}" for k, v in cls.options.items()) or "—"
        table.add_row(name, "yes" if cls.preemptive else "no", cls.summary, opts)
    out.print(table)


# ---------------------------------------------------------------------------------------------- traces
@traces_app.command("info")
def traces_info(
    source: Annotated[str, typer.Argument(help="'philly' (bundled) or a CSV / Parquet file.")],
    columns: Annotated[str | None, typer.Option(help="Column mapping for a CSV (see `simulate --help`).")] = None,
    reader: Annotated[str | None, typer.Option(help="Force a reader: philly, csv or parquet.")] = None,
    vc: Annotated[str | None, typer.Option(help="Only this virtual cluster.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Rows, time span, GPU-demand histogram, durations and offered load of a trace."""
    from gpufleet.traces import trace_info

    load = _load_jobs(source, columns, vc, reader, quiet=as_json)
    info = trace_info(load)
    if as_json:
        print(json.dumps(info, indent=2, default=str))
        return
    _print_info(info)


def _print_info(info: dict[str, Any]) -> None:
    from rich.table import Table

    out.print(f"[bold]{info.get('source', '')}[/]")
    skip = {"gpu_histogram", "gpu_demand", "vcs", "per_vc", "duration_percentiles_s", "rejected",
            "rejected_examples"}
    table = Table(show_header=False)
    for key, value in info.items():
        if key in skip or isinstance(value, (dict, list)):
            continue
        table.add_row(key, f"{value:,.2f}" if isinstance(value, float) else str(value))
    out.print(table)
    for key, value in info.items():
        if isinstance(value, dict) and value:
            sub = Table(title=key, header_style="bold")
            first = next(iter(value.values()))
            if isinstance(first, dict):
                cols = list(first)
                sub.add_column(key.split("_")[0])
                for c in cols:
                    sub.add_column(c, justify="right")
                for k, row in value.items():
                    sub.add_row(str(k), *[f"{row[c]:,.3g}" if isinstance(row[c], float) else str(row[c])
                                          for c in cols])
            else:
                sub.add_column("key")
                sub.add_column("value", justify="right")
                for k, v in value.items():
                    sub.add_row(str(k), f"{v:,.4g}" if isinstance(v, float) else str(v))
            out.print(sub)


@traces_app.command("convert")
def traces_convert(
    source: Annotated[str, typer.Argument(help="'philly' (bundled) or a CSV / Parquet file.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Output file (.parquet or .csv).")],
    fmt: Annotated[str | None, typer.Option("--format", help="Input format: philly, csv or parquet.")] = None,
    to: Annotated[str | None, typer.Option(help="Output format: parquet or csv (default: from the suffix).")] = None,
    columns: Annotated[str | None, typer.Option(help="Column mapping for a CSV (see `simulate --help`).")] = None,
    vc: Annotated[str | None, typer.Option(help="Only this virtual cluster.")] = None,
) -> None:
    """Convert a trace to gpufleet's canonical job schema (Parquet keeps the trace's start time)."""
    from gpufleet.traces import write_trace

    load = _load_jobs(source, columns, vc, fmt)
    path = write_trace(load, output, format=to)
    err.print(f"{load.jobs.height:,} jobs written to {path}")


@traces_app.command("generate")
def traces_generate(
    output: Annotated[Path, typer.Option("-o", "--output", help="Output file (.parquet or .csv).")],
    jobs: Annotated[int, typer.Option("-n", "--jobs", help="Number of jobs.")] = 100_000,
    gpus: Annotated[int | None, typer.Option(
        help="Cluster size the arrival rate is chosen for (with --load).")] = None,
    load: Annotated[float, typer.Option(help="Target average share of --gpus kept busy.")] = 0.8,
    rate: Annotated[float | None, typer.Option(help="Arrivals per hour (overrides --gpus/--load).")] = None,
    arrival: Annotated[str, typer.Option(help="poisson, or fitted (Philly's daily and weekly profile).")] = "poisson",
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same trace).")] = 0,
) -> None:
    """Generate a synthetic trace with Philly-fitted GPU mix and lognormal durations, for scale tests."""
    from gpufleet.traces import generate_jobs, write_trace

    target = load * gpus if gpus and rate is None else None
    frame = generate_jobs(jobs, seed=seed, arrival=arrival, rate_per_hour=rate, target_busy_gpus=target)
    path = write_trace(frame, output)
    span_d = float(frame["submit_s"].max()) / 86400 if frame.height else 0.0
    err.print(f"{frame.height:,} jobs over {span_d:.1f} days written to {path}")


@traces_app.command("inference")
def traces_inference(
    source: Annotated[str, typer.Argument(
        help="genai (shape of the Alibaba GenAI serving trace, shipped), diurnal (cosine day), none, "
        "or a CSV with columns time,servers_needed.")],
    cluster: Annotated[Path | None, typer.Option(
        help="Cluster TOML; its inference pools' nodes are the pool (default: the bundled cluster).")] = None,
    days: Annotated[float, typer.Option(help="Days of load to build and summarise.")] = 14.0,
    headroom: Annotated[float | None, typer.Option(
        help="genai only: spare capacity kept above the busy GPUs [default: 0.2].")] = None,
    step: Annotated[float | None, typer.Option(help="genai, diurnal: seconds per step [default: 300].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    csv_out: Annotated[Path | None, typer.Option(
        "--csv", help="Write the steps (time_s, servers_needed, idle_servers) to this CSV.")] = None,
    plot: Annotated[Path | None, typer.Option(
        help="Write an HTML chart of servers needed and idle over time, and by hour of day.")] = None,
) -> None:
    """Servers the inference pool needs over time and how many sit idle (loanable to training, as in Aryl).

    Examples: `gpufleet traces inference genai`, `gpufleet traces inference diurnal --days 7 --json`,
    `gpufleet traces inference my_load.csv --plot load.html`.
    """
    from gpufleet.errors import SpecError
    from gpufleet.traces import load_inference

    if not (math.isfinite(days) and days > 0):
        raise typer.BadParameter("--days must be a positive number")
    spec = _load_cluster(cluster, None)
    pools = spec.inference_pools
    if not pools:
        raise SpecError(f"cluster {spec.name!r} has no inference pool; add a [[pools]] table with "
                        'kind = "inference" or pass --cluster with one')
    pool_servers = sum(p.nodes for p in pools)
    until_s = days * 86400.0
    opts = {k: v for k, v in (("headroom", headroom), ("step_s", step)) if v is not None}
    load = load_inference(source, pool_servers=pool_servers, until_s=until_s, **opts)
    summary = {"source": source, "cluster": spec.name, "days": days, **load.describe(0.0, until_s)}
    frame = load.to_frame()
    frame = frame.filter(frame["time_s"] < until_s)
    if csv_out is not None:
        csv_out.parent.mkdir(parents=True, exist_ok=True)
        frame.write_csv(csv_out)
        err.print(f"{frame.height:,} steps written to {csv_out}")
    if plot is not None:
        _write_inference_plot(plot, frame, summary, until_s)
        err.print(f"chart written to {plot}")
    if as_json:
        print(json.dumps({k: _clean(v) for k, v in summary.items()}, indent=2))
        return
    _print_inference(summary)


def _print_inference(s: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"inference load '{s['name']}' on {s['cluster']}", show_header=False)
    rows = [("pool", f"{s['pool_servers']:,} servers"), ("span", _fmt_s(s["end_s"] - s["start_s"])),
            ("steps", f"{s['steps']:,}"), ("mean utilisation", f"{100 * s['mean_utilisation']:.1f} %"),
            ("peak utilisation", f"{100 * s['peak_utilisation']:.1f} %"),
            ("trough utilisation", f"{100 * s['trough_utilisation']:.1f} %"),
            ("mean servers needed", f"{s['mean_servers_needed']:,.1f}"),
            ("mean idle servers", f"{s['mean_idle_servers']:,.1f}")]
    for key, value in rows:
        table.add_row(key, value)
    out.print(table)
    blocks = "▁▂▃▄▅▆▇█"
    hourly = Table(title="mean utilisation by hour of day (bars: 0-100 %)", header_style="bold")
    for col in ("hours", "", "utilisation"):
        hourly.add_column(col)
    for first in range(0, 24, 6):
        values = s["hourly_utilisation"][first:first + 6]
        finite = [v for v in values if v is not None and math.isfinite(v)]
        bar = "".join(blocks[min(7, int(v * 8))] if v is not None and math.isfinite(v) else "·" for v in values)
        text = "  ".join(f"{100 * v:3.0f}%" if v is not None and math.isfinite(v) else "   —" for v in values)
        hourly.add_row(f"{first:02d}-{first + 5:02d}", bar if finite else "", text)
    out.print(hourly)


def _write_inference_plot(path: Path, frame: Any, summary: dict[str, Any], until_s: float) -> None:
    from gpufleet.report.html import figure_div, kv_table, page, section
    from gpufleet.report.plots import grouped_bar, timeline_figure

    t = frame["time_s"].to_numpy()
    timeline = timeline_figure({"servers needed": (t, frame["servers_needed"].to_numpy()),
                                "idle servers": (t, frame["idle_servers"].to_numpy())},
                               title="Inference servers needed and idle", y_title="servers", end_time=until_s)
    hours = [f"{h:02d}" for h in range(24)]
    by_hour = grouped_bar(hours, {"mean utilisation": summary["hourly_utilisation"]}, title="By hour of day",
                          y_title="share of the pool", x_title="hour of day", seconds=False)
    context = {k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in summary.items() if k != "hourly_utilisation"}
    body = [kv_table(context),
            section("Over time", figure_div(timeline, div_id="timeline", include_plotlyjs=True),
                    note="Idle servers are the ones capacity loaning can lend to training."),
            section("Hour of day", figure_div(by_hour, div_id="hourly", include_plotlyjs=False))]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(f"Inference load: {summary['name']}", body), encoding="utf-8")


# ---------------------------------------------------------------------------------------------- perf, plan
class RecomputeMode(StrEnum):
    """Activation recomputation: none, selective (attention core only) or full (whole layer)."""

    none = "none"
    selective = "selective"
    full = "full"


# Options shared by `perf step` and `plan` (declared once, used as parameter annotations).
ModelOpt = Annotated[str | None, typer.Option(
    "--model", help="Catalog model (see `gpufleet perf models`) or a .json/.toml file with the same fields.",
    rich_help_panel="Model")]
LayersOpt = Annotated[int | None, typer.Option(help="Transformer layers (overrides --model).", rich_help_panel="Model")]
HiddenOpt = Annotated[int | None, typer.Option(help="Hidden size h.", rich_help_panel="Model")]
HeadsOpt = Annotated[int | None, typer.Option(help="Attention (query) heads.", rich_help_panel="Model")]
KvHeadsOpt = Annotated[int | None, typer.Option(help="Key/value heads (GQA); default = heads.",
                                                rich_help_panel="Model")]
FfnOpt = Annotated[int | None, typer.Option("--ffn-hidden", help="MLP width; default 4 x hidden.",
                                            rich_help_panel="Model")]
VocabOpt = Annotated[int | None, typer.Option(help="Vocabulary size (padded).", rich_help_panel="Model")]
SeqOpt = Annotated[int | None, typer.Option(help="Training sequence length in tokens.", rich_help_panel="Model")]
GluOpt = Annotated[bool | None, typer.Option("--glu/--no-glu", help="Gated (SwiGLU) MLP: three matrices, not two.",
                                             rich_help_panel="Model")]
GpuOpt = Annotated[str | None, typer.Option(help="GPU catalog name [default: a100-80g].", rich_help_panel="Hardware")]
GpusPerNodeOpt = Annotated[int | None, typer.Option(help="GPUs per node [default: 8].", rich_help_panel="Hardware")]
NicOpt = Annotated[str | None, typer.Option(help="NIC catalog name [default: ib-hdr].", rich_help_panel="Hardware")]
NicsPerNodeOpt = Annotated[int | None, typer.Option(help="NICs per node [default: 8].", rich_help_panel="Hardware")]
ClusterOpt = Annotated[Path | None, typer.Option(
    help="Take GPU, NIC, node and rack shape from this cluster TOML (instead of --gpu/--nic).",
    rich_help_panel="Hardware")]
PoolOpt = Annotated[str | None, typer.Option(help="Pool of --cluster to use (default: its first training pool).",
                                             rich_help_panel="Hardware")]
GbsOpt = Annotated[int | None, typer.Option(help="Global batch in sequences.", rich_help_panel="Batch")]
GbsTokensOpt = Annotated[str | None, typer.Option(
    help="Global batch in tokens, K/M/G = 2^10/2^20/2^30 (16M = 16,777,216); gbs = tokens // seq.",
    rich_help_panel="Batch")]
PrecisionOpt = Annotated[Literal["bf16", "fp16", "fp8"], typer.Option(
    help="GEMM precision (fp8 needs Hopper or newer).", rich_help_panel="Training software")]
ZeroOpt = Annotated[int, typer.Option(
    min=0, max=3, help="0 plain DP, 1 distributed optimizer (ZeRO-1), 2 + sharded grads, 3 FSDP.",
    rich_help_panel="Training software")]
FlashOpt = Annotated[bool, typer.Option("--flash/--no-flash", help="Flash (fused) attention.",
                                        rich_help_panel="Training software")]
SpOpt = Annotated[bool, typer.Option("--sp/--no-sp", help="Megatron sequence parallelism with TP.",
                                     rich_help_panel="Training software")]
MegascaleOpt = Annotated[bool, typer.Option(
    "--megascale", help="MegaScale's optimisations: TP/PP/DP overlap, parallel block, fused ops.",
    rich_help_panel="Training software")]
TpOverlapOpt = Annotated[bool, typer.Option("--tp-overlap", help="Overlap TP collectives with GEMMs.",
                                            rich_help_panel="Training software")]
DpOverlapOpt = Annotated[bool, typer.Option("--dp-overlap", help="Overlap DP gradient reduction with backward.",
                                            rich_help_panel="Training software")]
CausalOpt = Annotated[bool, typer.Option(
    "--causal-flops", help="MFU convention: count half the attention square (Megatron main) instead of all of it.",
    rich_help_panel="Training software")]
EfficiencyOpt = Annotated[Path | None, typer.Option(
    help="Efficiency constants TOML (e.g. from `gpufleet perf calibrate`); default: the shipped file.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
TableOpt = Annotated[Path | None, typer.Option(
    help="Published-measurement CSV [default: ../shared/data/perf_ground_truth.csv or $GPUFLEET_SHARED/data].")]


@perf_app.command("step")
def perf_step(
    gpus: Annotated[int, typer.Option(help="GPUs the job uses (TP x PP x DP x CP).", rich_help_panel="Hardware")],
    model: ModelOpt = None,
    layers: LayersOpt = None,
    hidden: HiddenOpt = None,
    heads: HeadsOpt = None,
    kv_heads: KvHeadsOpt = None,
    ffn_hidden: FfnOpt = None,
    vocab: VocabOpt = None,
    seq: SeqOpt = None,
    glu: GluOpt = None,
    gpu: GpuOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    nic: NicOpt = None,
    nics_per_node: NicsPerNodeOpt = None,
    cluster: ClusterOpt = None,
    pool: PoolOpt = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.", rich_help_panel="Layout")] = 1,
    pp: Annotated[int, typer.Option(help="Pipeline stages.", rich_help_panel="Layout")] = 1,
    dp: Annotated[int | None, typer.Option(
        help="Data-parallel degree [default: gpus / (tp x pp x cp)].", rich_help_panel="Layout")] = None,
    cp: Annotated[int, typer.Option(help="Context-parallel degree.", rich_help_panel="Layout")] = 1,
    mbs: Annotated[int, typer.Option(help="Micro-batch size in sequences.", rich_help_panel="Layout")] = 1,
    vp: Annotated[int, typer.Option(help="Virtual stages per rank (interleaved 1F1B).",
                                    rich_help_panel="Layout")] = 1,
    recompute: Annotated[RecomputeMode, typer.Option(help="Activation recomputation.",
                                                     rich_help_panel="Layout")] = RecomputeMode.none,
    gbs: GbsOpt = None,
    gbs_tokens: GbsTokensOpt = None,
    precision: PrecisionOpt = "bf16",
    zero: ZeroOpt = 1,
    flash: FlashOpt = True,
    sp: SpOpt = True,
    megascale: MegascaleOpt = False,
    tp_overlap: TpOverlapOpt = False,
    dp_overlap: DpOverlapOpt = False,
    causal_flops: CausalOpt = False,
    efficiency: EfficiencyOpt = None,
    compare_megascale: Annotated[bool, typer.Option(
        "--compare-megascale", help="Show the layout without and with MegaScale's optimisations, and the speedup.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Predict one training step of a layout: step time, MFU, HFU, tokens/s, memory per GPU and where the time goes.

    Examples:

    `gpufleet perf step --model gpt3-175b --gpus 1024 --tp 8 --pp 8 --gbs 1536` (DP = 1024 / 64 = 16)

    `gpufleet perf step --model llama3-70b --gpu h100 --nic ib-ndr --gpus 512 --tp 8 --pp 4 --vp 5 --gbs-tokens 16M`

    `gpufleet perf step --layers 32 --hidden 4096 --heads 32 --vocab 50304 --seq 4096 --gpus 64 --tp 2 --gbs 256`

    `gpufleet perf step --model gpt3-175b --gpus 1024 --tp 8 --pp 8 --vp 6 --gbs 768 --compare-megascale`

    `gpufleet perf step --model gpt3-175b --cluster c.toml --pool train --gpus 256 --tp 8 --pp 8 --gbs 512 --json`

    A layout that breaks a rule (TP not dividing the heads, GPUs not a multiple of TP x PP x CP, ...) is
    an error naming every broken rule. A layout that runs out of memory is still estimated, with a warning.
    """
    args = dict(locals())
    from gpufleet.perf.cli_perf import run_step

    run_step(out, err, args)


@app.command()
def plan(
    model: ModelOpt = None,
    layers: LayersOpt = None,
    hidden: HiddenOpt = None,
    heads: HeadsOpt = None,
    kv_heads: KvHeadsOpt = None,
    ffn_hidden: FfnOpt = None,
    vocab: VocabOpt = None,
    seq: SeqOpt = None,
    glu: GluOpt = None,
    gpus: Annotated[int | None, typer.Option(
        help="GPUs to plan for (required unless --cluster has training pools on different NICs).",
        rich_help_panel="Hardware")] = None,
    gpu: GpuOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    nic: NicOpt = None,
    nics_per_node: NicsPerNodeOpt = None,
    cluster: Annotated[Path | None, typer.Option(
        help="Cluster TOML: plan on its pool (--pool, default the first training pool); if its training pools "
        "use different NICs and no --pool is given, plan heterogeneously across them.",
        rich_help_panel="Hardware")] = None,
    pool: PoolOpt = None,
    gbs: GbsOpt = None,
    gbs_tokens: GbsTokensOpt = None,
    precision: PrecisionOpt = "bf16",
    zero: ZeroOpt = 1,
    flash: FlashOpt = True,
    sp: SpOpt = True,
    megascale: MegascaleOpt = False,
    tp_overlap: TpOverlapOpt = False,
    dp_overlap: DpOverlapOpt = False,
    causal_flops: CausalOpt = False,
    efficiency: EfficiencyOpt = None,
    top: Annotated[int, typer.Option(help="How many of the fastest layouts to show.")] = 10,
    recompute: Annotated[list[RecomputeMode] | None, typer.Option(
        help="Recompute modes to consider, repeatable [default: none, selective and full].")] = None,
    max_tp: Annotated[int | None, typer.Option(help="Largest TP degree [default: GPUs per node].")] = None,
    max_cp: Annotated[int | None, typer.Option(
        help="Largest context-parallel degree [default: 32 for seq >= 8192, else 1].")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Search every TP x PP x DP x CP x micro-batch x virtual-stage x recompute layout and rank those that fit.

    Examples:

    `gpufleet plan --model gpt3-175b --gpus 1024 --gbs 1536`

    `gpufleet plan --model llama3-405b --gpu h100 --nic ib-ndr --gpus 8192 --gbs-tokens 16M --top 5`

    `gpufleet plan --model gpt3-175b --gpus 1024 --gbs 1536 --recompute selective --recompute full --megascale`

    `gpufleet plan --model gpt3-175b --gpus 1024 --gbs 1536 --top 3 --json`

    Prints the fastest layouts with their step-time breakdown, how many candidates broke a divisibility
    rule or ran out of memory, and, for every feasible layout slower than the best, the component
    (bubble, TP/PP/DP communication, recomputation) that costs it most against the best.
    """
    args = dict(locals())
    from gpufleet.perf.cli_perf import run_plan

    run_plan(out, err, args)


@perf_app.command("validate")
def perf_validate(
    table: TableOpt = None,
    efficiency: EfficiencyOpt = None,
    as_json: JsonOpt = False,
    csv: Annotated[Path | None, typer.Option(help="Also write the per-row results to this CSV file.")] = None,
) -> None:
    """Predict every published training measurement and report the error, row by row and per source.

    Examples:

    `gpufleet perf validate`

    `gpufleet perf validate --efficiency my_eff.toml --csv errors.csv`

    `gpufleet perf validate --json | jq '.summary'`

    Rows in the calibration split set the efficiency constants (`gpufleet perf calibrate`); the held-out
    rows never do, so their error is the honest one. Rows the model cannot predict are listed with the
    reason. The exit status is 0 whatever the errors: this is a report, not a test.
    """
    args = dict(locals())
    from gpufleet.perf.cli_perf import run_validate

    run_validate(out, err, args)


@perf_app.command("calibrate")
def perf_calibrate(
    out_path: Annotated[Path, typer.Option("--out", help="Write the fitted constants (TOML) here.")],
    table: TableOpt = None,
    efficiency: Annotated[Path | None, typer.Option(
        help="Start from (and use as template) this constants file instead of the shipped one.")] = None,
) -> None:
    """Refit the achieved-efficiency constants to the calibration rows of the published-measurement table.

    Examples:

    `gpufleet perf calibrate --out my_eff.toml`

    `gpufleet perf calibrate --table my_runs.csv --efficiency my_eff.toml --out my_eff2.toml`

    then `gpufleet perf validate --efficiency my_eff.toml` or `gpufleet perf step ... --efficiency my_eff.toml`.

    Only per-GPU-generation, per-network-class and software constants are fitted (bounded least squares on
    log(predicted / measured)); held-out rows never enter the fit. The output keeps the template's comments.
    """
    args = dict(locals())
    args["out"] = args.pop("out_path")
    from gpufleet.perf.cli_perf import run_calibrate

    run_calibrate(out, err, args)


@perf_app.command("models")
def perf_models(as_json: JsonOpt = False) -> None:
    """List the shipped model catalog: shapes and parameter counts.

    Examples: `gpufleet perf models`, then `gpufleet perf step --model llama3-405b ...`; a shape flag
    (`--seq 8192`, `--layers 40`) overrides one field of a catalog model.
    """
    args = dict(locals())
    from gpufleet.perf.cli_perf import run_models

    run_models(out, err, args)


def main() -> None:
    """Entry point: run the app, turning gpufleet's own errors into one line and exit status 2."""
    try:
        app()
    except GpufleetError as exc:
        from rich.markup import escape

        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
