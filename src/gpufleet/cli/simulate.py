"""``gpufleet simulate`` and ``gpufleet policies``: replay a job trace under scheduling policies and compare them.

The command parses its options, hands them to :mod:`gpufleet.sim` (``run_policies``, or ``run_with_failures`` with
``--failures``) and prints the summary tables; the tables show the columns that fit 100 columns, ``--wide`` all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.common import WideOpt, err, load_cluster, load_jobs, out
from gpufleet.report.fmt import clean_json, format_span

__all__ = ["failure_table", "policies", "simulate", "split_policies", "summary_table"]

#: Columns of the summary table shown without ``--wide`` (fit 100 columns with any policy name).
#: ``util window`` (utilisation between the first and last submission) does not fit beside them: --wide shows it.
DEFAULT_COLUMNS = ("policy", "jobs", "avg JCT", "p99 JCT", "avg queue", "GPU util", "usage", "preempt.")
#: Columns of the failure table shown without ``--wide``.
DEFAULT_FAILURE_COLUMNS = ("policy", "predictor", "failures", "interruptions", "lost GPU-h", "avoided", "avg JCT")
WIDE_NOTE = "--wide shows every column"


def simulate(
    trace: Annotated[str, typer.Option(help="'philly' (bundled) or a CSV / Parquet file of jobs.")] = "philly",
    columns: Annotated[
        str | None,
        typer.Option(
            help="Column mapping for a CSV: canonical=source pairs, e.g. "
            "'submit=submission_time,duration=duration,gpus=num_gpu'."
        ),
    ] = None,
    reader: Annotated[str | None, typer.Option(help="Force a trace reader: {trace-readers}.")] = None,
    vc: Annotated[str | None, typer.Option(help="Only the jobs of this virtual cluster.")] = None,
    cluster: Annotated[
        Path | None,
        typer.Option(
            help="Cluster TOML file or a bundled cluster's name (default, deepshare-testbed, deepshare-64, "
            "h100-superpod, hetero-holmes; default: the bundled default)."
        ),
    ] = None,
    gpus: Annotated[int | None, typer.Option(help="Resize the training pools to at least this many GPUs.")] = None,
    size_load: Annotated[
        float | None,
        typer.Option(
            "--load",
            help="Size the training pools so that the trace offers this share of their GPU-time over its arrival "
            "window (0.9: queues form, as in bench/placement_eval.py); whole nodes, at least the largest job. "
            "Instead of --gpus.",
        ),
    ] = None,
    policy: Annotated[
        str,
        typer.Option(
            help="Comma-separated policies: {policies} (see `gpufleet policies`); those needing --network: "
            "{network-policies}."
        ),
    ] = ",".join(("fifo", "sjf", "srtf", "las", "tiresias")),
    opt: Annotated[
        list[str] | None,
        typer.Option(
            help="Policy option POLICY.KEY=VALUE, repeatable, e.g. tiresias.thresholds=3600,36000; a bare KEY=VALUE "
            "(e.g. reclaim=random) applies to every chosen policy that has that option."
        ),
    ] = None,
    inference: Annotated[
        str | None,
        typer.Option(
            help="Inference load on the cluster's inference pool: {inference-sources} ('genai' is the default when "
            "the cluster has an inference pool), a CSV time,servers_needed, or "
            "'punica[:genai|diurnal]' / 'punica-per-adapter[:...]': LoRA traffic of that shape served by batched "
            "multi-adapter serving or one adapter at a time (gpufleet serve's capacity model). "
            "Aryl loans the idle servers to training."
        ),
    ] = None,
    elastic_share: Annotated[
        float,
        typer.Option(
            help="Share of jobs made elastic (Aryl policies) when the trace has no min_workers/max_workers "
            "columns. No published mix states it; 0.5 is the middle of the 0-100 % sweep."
        ),
    ] = 0.5,
    scale_pause: Annotated[
        float,
        typer.Option(help="Seconds an elastic job pauses on each scale-out / scale-in (published restarts: 18-103 s)."),
    ] = 40.0,
    reclaim_notice: Annotated[
        float, typer.Option(help="Seconds of notice before a reclaimed server goes back to inference (0: at once).")
    ] = 0.0,
    loan_speed: Annotated[
        float | None,
        typer.Option(
            help="Speed of a worker on a loaned inference GPU relative to a training GPU (default: from the GPU "
            "catalog, e.g. 0.43 for T4 vs V100)."
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option(help="Seconds between Aryl's knapsack rounds that resize elastic jobs.")
    ] = 300.0,
    placement: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated placements, each run with every policy (rows 'srtf+rl'): {placements}. "
            "Default: each policy's own (consolidate; the old names contention, rl, random, *-spread are aliases "
            "of their pairs). `rl:PATH` uses a model trained with `gpufleet sched train-rl`; placement options "
            "with --opt PLACEMENT.KEY=VALUE."
        ),
    ] = None,
    strict_placement: Annotated[
        bool, typer.Option(help="Start multi-GPU jobs only on the fewest possible nodes (they wait otherwise).")
    ] = False,
    placement_penalty: Annotated[
        float, typer.Option(help="Throughput lost by a job spread over more nodes than it needs (0.2 = 20 % slower).")
    ] = 0.2,
    checkpoint_interval: Annotated[
        float | None,
        typer.Option(
            help="Seconds of progress between checkpoints; preemption and failures lose the work since the last. "
            "Default 0 (jobs checkpoint when preempted and lose nothing), or 3600 with --failures."
        ),
    ] = None,
    restart_cost: Annotated[float, typer.Option(help="Seconds a preempted job spends restoring on restart.")] = 60.0,
    report: Annotated[Path | None, typer.Option(help="Write a self-contained HTML report here.")] = None,
    jobs_out: Annotated[
        Path | None, typer.Option(help="Write every job's outcome (all policies) to this Parquet file.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON (one object per policy).")] = False,
    breakdown: Annotated[str | None, typer.Option(help="Also print a per-'vc' or per-'size' breakdown.")] = None,
    workers: Annotated[int, typer.Option(help="Run policies in parallel over this many processes.")] = 1,
    ray: Annotated[bool, typer.Option("--ray", help="Run the policy sweep as tasks on a local Ray instance.")] = False,
    ray_address: Annotated[str | None, typer.Option(help="Run the sweep on this Ray cluster address.")] = None,
    debug: Annotated[bool, typer.Option(help="Check cluster invariants after every event (slow).")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar over simulated time.")] = True,
    network: Annotated[
        bool,
        typer.Option(
            "--network",
            help="Model network contention: multi-node jobs share NIC and rack-uplink bandwidth, and "
            "their speed follows the traffic beside them (model fitted to DeepShare's measurements; see "
            "docs/contention.md). Jobs take their communication pattern from a 'model' column (`--columns "
            "model=...`) or, without one, from --comm-mix. Needed by the policies {network-policies}; "
            "`rl:PATH` uses a model trained with `gpufleet sched train-rl`.",
        ),
    ] = False,
    comm_mix: Annotated[
        str | None,
        typer.Option(
            help="With --network: communication profiles for jobs whose model is unknown, e.g. "
            "'FSDP=0.5,MoE=0.5' (profiles: MobileNetV3, GraphSage, FSDP, Transformer-XL, DLRM, MoE; default: "
            "equal shares)."
        ),
    ] = None,
    failures: Annotated[
        Path | None,
        typer.Option(
            help="Fleet telemetry Parquet: inject its GPU failures into the running jobs (fleet node n -> training "
            "node n mod N; fleet time 0 = the trace's first submission). See docs/sim_failures.md."
        ),
    ] = None,
    predictor: Annotated[
        Path | None,
        typer.Option(
            help="Failure model (with --failures): also run each policy draining the nodes it flags, and compare."
        ),
    ] = None,
    repair_hours: Annotated[float, typer.Option(help="Hours a failed node is out for repair.")] = 24.0,
    drain_hours: Annotated[
        float | None,
        typer.Option(
            help="Hours a drained (flagged) node is out for inspection (default: the predictor's horizon, so that a "
            "right alert's failure falls inside the drain)."
        ),
    ] = None,
    wide: WideOpt = False,
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
    from gpufleet.sched.placement.base import placements_needing
    from gpufleet.sched.policy import make_scheduler, policies_needing
    from gpufleet.sim.config import SimConfig
    from gpufleet.sim.elastic_jobs import ElasticConfig
    from gpufleet.sim.inference_load import inference_for
    from gpufleet.sim.run import label_opts, pair_runs, parse_policy_opts, run_policies

    policies, model_paths = split_policies(policy)
    if not policies:
        raise typer.BadParameter("--policy names no policy")
    placements, placement_paths = split_policies(placement, "--placement") if placement else ([], {})
    if placement is not None and not placements:
        raise typer.BadParameter("--placement names no placement")
    _check_placements(placements)
    if breakdown not in (None, "vc", "size"):
        raise typer.BadParameter("--breakdown must be 'vc' or 'size'")
    load = load_jobs(trace, columns, vc, reader)
    if size_load is not None:
        if gpus is not None:
            raise typer.BadParameter("--load sizes the cluster itself: give --load or --gpus, not both")
        if not size_load > 0:
            raise typer.BadParameter("--load must be above 0 (0.9: the trace offers 90 % of the GPU-time)")
        from gpufleet.traces.info import gpus_for_load

        gpus = gpus_for_load(load.jobs, size_load)
    spec = load_cluster(cluster, gpus)
    opts = parse_policy_opts(opt or [], [*policies, *placements])
    for name, path in {**model_paths, **placement_paths}.items():
        opts.setdefault(name, {})["model"] = path
    if network:
        from gpufleet.perf.comm_profiles import with_comm_profiles

        load.jobs = with_comm_profiles(load.jobs, comm_mix)
    elif needing := policies_needing("network", policies) + placements_needing("network", placements):
        raise typer.BadParameter(f"{', '.join(needing)} place jobs by network contention: add --network")
    runs = pair_runs(policies, placements)
    for label in runs:  # a (policy, placement) pair that cannot be defined is a one-line error before any run
        make_scheduler(label, *label_opts(label, opts))
    inference_load = inference_for(spec, inference, load.jobs)
    elastic_cfg = ElasticConfig(
        elastic_share=elastic_share,
        scale_pause_s=scale_pause,
        reclaim_notice_s=reclaim_notice,
        loan_speed=loan_speed,
        interval_s=interval,
    )
    show_progress = progress and not as_json and err.is_terminal and workers <= 1 and not (ray or ray_address)
    if predictor is not None and failures is None:
        raise typer.BadParameter("--predictor needs --failures (the fleet telemetry it predicts on)")
    if failures is not None and (ray or ray_address):
        raise typer.BadParameter("--failures runs on local processes (--workers), not on Ray")
    if failures is not None and (repair_hours <= 0 or (drain_hours is not None and drain_hours <= 0)):
        raise typer.BadParameter("--repair-hours and --drain-hours must be positive")
    if checkpoint_interval is None:
        from gpufleet.sim.failure_run import DEFAULT_FAILURE_CHECKPOINT_S

        checkpoint_interval = DEFAULT_FAILURE_CHECKPOINT_S if failures is not None else 0.0
    config = SimConfig(
        strict_placement=strict_placement,
        placement_penalty=placement_penalty,
        checkpoint_interval_s=checkpoint_interval,
        restart_s=restart_cost,
        debug=debug,
        progress=show_progress,
        network=network,
    )
    if not as_json:
        err.print(
            f"[bold]{load.jobs.height:,}[/] jobs from {load.source} on cluster "
            f"'{spec.name}' ({spec.total_gpus():,} training GPUs); runs: {', '.join(runs)}"
        )

    def done(r: Any) -> None:
        if not as_json:
            extra = " [yellow](interrupted)[/]" if r.meta.get("interrupted") else ""
            err.print(f"  {r.policy}: {r.summary['finished']:,} jobs finished in {r.summary['wall_s']:.2f} s{extra}")

    address = ray_address or ("local" if ray else None)
    if failures is not None:
        from gpufleet.sim.fleet_failures import run_with_failures

        results = run_with_failures(
            load.jobs,
            spec,
            runs,
            config,
            opts,
            failures,
            predictor,
            repair_hours,
            drain_hours,
            workers=workers,
            on_done=done,
            log=None if as_json else err.print,
            inference=inference_load,
            elastic=elastic_cfg,
        )
    else:
        results = run_policies(
            load.jobs,
            spec,
            runs,
            config,
            opts,
            workers=workers,
            ray_address=address,
            on_done=done,
            inference=inference_load,
            elastic=elastic_cfg,
        )
    unsched = results[0].meta.get("unschedulable", {}) if results else {}
    if unsched and not as_json:
        err.print("[yellow]warning:[/] jobs never scheduled: " + "; ".join(f"{v:,} {k}" for k, v in unsched.items()))
    if as_json:
        print(json.dumps([clean_json(r.summary) for r in results], indent=2))
    else:
        # failure runs: label the predictor runs ("fifo+predictor")
        summaries = [{**r.summary, "policy": r.policy} for r in results]
        out.print(summary_table(summaries, f"{load.source} on {spec.name} ({spec.total_gpus():,} GPUs)", wide=wide))
        if failures is not None:
            out.print(failure_table(results, wide=wide))
        if breakdown:
            _print_breakdown(results, breakdown)
    if report is not None:
        from gpufleet.report import write_sim_report

        context = {
            "trace": str(load.source),
            "jobs": f"{load.jobs.height:,}",
            "cluster": spec.name,
            "training GPUs": f"{spec.total_gpus():,}",
            "placement": placement or "each policy's own",
            "checkpoint interval": f"{checkpoint_interval:g} s",
            "restart cost": f"{restart_cost:g} s",
        }
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


def _check_placements(names: list[str]) -> None:
    from gpufleet.sched.placement.base import PLACEMENTS

    for name in names:
        PLACEMENTS.get(name)  # one-line ConfigError listing the placements for an unknown name


def split_policies(text: str, option: str = "--policy") -> tuple[list[str], dict[str, str]]:
    """``"las,rl:model.zip"`` -> (["las", "rl"], {"rl": "model.zip"})."""
    names: list[str] = []
    paths: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, sep, path = item.partition(":")
        if sep:
            if not path:
                raise typer.BadParameter(f"{option} '{item}': give a model path after ':'")
            paths[name] = path
        if name in names:
            raise typer.BadParameter(
                f"{option} names '{name}' twice (one run per name; compare models with "
                "separate runs or `gpufleet sched eval-rl`)"
            )
        names.append(name)
    return names, paths


def _table(
    title: str,
    columns: list[str],
    rows: list[list[str]],
    shown: tuple[str, ...] | None,
    left: tuple[str, ...] = ("policy",),
) -> Any:
    """A Rich table of ``rows``; with ``shown``, only those columns (and a caption pointing at --wide)."""
    from rich.table import Table

    keep = [i for i, c in enumerate(columns) if shown is None or c in shown]
    hidden = len(columns) - len(keep)
    table = Table(title=title, header_style="bold", caption=f"{WIDE_NOTE} ({hidden} more)" if hidden else None)
    for i in keep:
        col = columns[i]
        # numbers never wrap; a long policy name folds onto a second line rather than being cut
        table.add_column(
            col,
            justify="left" if col in left else "right",
            no_wrap=col not in left,
            overflow="fold" if col in left else "ellipsis",
        )
    for row in rows:
        table.add_row(*[row[i] for i in keep])
    return table


def summary_table(summaries: list[dict[str, Any]], title: str, wide: bool = True) -> Any:
    """One row per policy run: jobs, JCT, queueing, utilisation, preemptions (and Aryl's loaning, the network's
    contention when those runs are present); ``wide=False`` keeps :data:`DEFAULT_COLUMNS`."""
    cols = [
        "policy",
        "jobs",
        "avg JCT",
        "p99 JCT",
        "avg queue",
        "p95 queue",
        "GPU util",
        "util window",
        "makespan",
        "preempt.",
        "lost GPU-h",
        "wall",
    ]
    with_usage = any("usage" in s for s in summaries)
    with_aryl = any("reclaims" in s for s in summaries)
    if with_usage:
        cols.insert(8, "usage")
    if with_aryl:
        cols[-1:-1] = ["loaned GPU-h", "reclaims", "reclaim preempt.", "scale events"]
    with_net = any("contention_gpu_h" in s for s in summaries)
    if with_net:
        cols[-1:-1] = ["contention GPU-h", "multi-node"]
    rows = []
    for s in summaries:
        row = [
            s["policy"],
            f"{s['finished']:,}/{s['jobs']:,}",
            format_span(s["avg_jct_s"]),
            format_span(s["p99_jct_s"]),
            format_span(s["avg_queue_s"]),
            format_span(s["p95_queue_s"]),
            f"{100 * s['gpu_util']:.1f} %",
            f"{100 * s['util_window']:.1f} %" if "util_window" in s else "-",
            format_span(s["makespan_s"]),
            f"{s['preemptions']:,}",
            f"{s['lost_work_gpu_h']:,.0f}",
        ]
        if with_usage:
            row.insert(8, f"{100 * s['usage']:.1f} %" if "usage" in s else "-")
        if with_aryl:
            row += (
                [
                    f"{s['loaned_gpu_hours']:,.0f}",
                    f"{s['reclaims']:,}",
                    f"{s['reclaim_preemptions']:,}",
                    f"{s['scale_events']:,}",
                ]
                if "reclaims" in s
                else ["-"] * 4
            )
        if with_net:
            row += (
                [f"{s['contention_gpu_h']:,.1f}", f"{100 * s['multi_node_share']:.0f} %"]
                if ("contention_gpu_h" in s)
                else ["-"] * 2
            )
        row.append(f"{s['wall_s']:.2f} s")
        rows.append(row)
    return _table(title, cols, rows, None if wide else DEFAULT_COLUMNS)


def failure_table(results: list, wide: bool = True) -> Any:
    """Failures, interruptions, lost work and drains of each policy without and with the predictor."""
    from gpufleet.sim.failure_run import comparison

    cols = [
        "policy",
        "predictor",
        "failures",
        "interruptions",
        "lost GPU-h",
        "drains (true/false)",
        "false-alarm GPU-h",
        "avoided",
        "avg JCT",
        "finished",
    ]
    rows = [
        [
            row["policy"],
            "yes" if row["predictor"] else "no",
            f"{row['failures']:,}",
            f"{row['job_interruptions']:,}",
            f"{row['lost_gpu_hours_failures']:,.1f}",
            f"{row['drains']:,} ({row['drain_true']:,}/{row['drain_false']:,})",
            f"{row['false_alarm_gpu_hours']:,.1f}",
            f"{row['avoided_failures']:,}",
            format_span(row["avg_jct_s"]),
            f"{row['finished']:,}/{row['jobs']:,}",
        ]
        for row in comparison(results).iter_rows(named=True)
    ]
    return _table(
        "failures: without and with the predictor",
        cols,
        rows,
        None if wide else DEFAULT_FAILURE_COLUMNS,
        left=("policy", "predictor"),
    )


def _print_breakdown(results: list, by: str) -> None:
    from rich.table import Table

    from gpufleet.report.breakdown import breakdown

    for r in results:
        frame = breakdown(r.jobs, by)
        table = Table(title=f"{r.policy}: by {by}", header_style="bold")
        for col in ("group", "jobs", "avg JCT", "avg queue", "p95 JCT"):
            table.add_column(col, justify="left" if col == "group" else "right")
        for row in frame.iter_rows(named=True):
            table.add_row(
                str(row["group"]),
                f"{row['jobs']:,}",
                format_span(row["avg_jct_s"]),
                format_span(row["avg_queue_s"]),
                format_span(row["p95_jct_s"]),
            )
        out.print(table)


def policies() -> None:
    """List the scheduling policies (order, preemption, capacity) and the placements, with their options."""
    from rich.table import Table

    from gpufleet.sched.policy import available_policies

    table = Table(header_style="bold")
    for col in ("policy", "preemptive", "what it does", "options (--opt policy.key=value)"):
        table.add_column(col)
    for name, cls in sorted(available_policies().items()):
        opts = ", ".join(f"{k}={v}" for k, v in cls.options.items()) or "—"
        table.add_row(name, "yes" if cls.preemptive else "no", cls.summary, opts)
    out.print(table)
    from gpufleet.sched.placement.base import available_placements

    places = Table(header_style="bold", caption="any policy runs with any placement: --policy srtf --placement rl")
    for col in ("placement", "needs", "what it does", "options (--opt placement.key=value)"):
        places.add_column(col)
    for name, pcls in sorted(available_placements().items()):
        opts = ", ".join(f"{k}={v}" for k, v in pcls.options.items()) or "—"
        places.add_row(name, ", ".join(sorted(pcls.needs)) or "—", pcls.summary, opts)
    out.print(places)
