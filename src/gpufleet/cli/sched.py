"""``gpufleet sched``: train and evaluate the network-contention-aware ``rl`` placement policy.

torch, stable-baselines3 and gymnasium come with the ``rl`` extra and are imported inside the commands, so
``gpufleet sched --help`` works without them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gpufleet.cli.common import WideOpt, err, load_jobs, out
from gpufleet.report.fmt import clean_json

sched_app = typer.Typer(
    help="Network-contention-aware scheduling learned with reinforcement learning (Ryu & Eo).\n\n"
    "`gpufleet sched train-rl -o model.zip` trains PPO placement on DeepShare-style job mixes over the 4 x 8-GPU "
    "testbed; `gpufleet sched eval-rl model.zip --mix heavy --seeds 5` compares it with las, srtf, tiresias, the "
    "contention heuristic, random placement and the paper's spread-first baselines on mixes it never saw; "
    "`gpufleet simulate --network --policy las,contention,rl:model.zip` runs it on any trace.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)

#: Policies eval-rl compares by default (rl last).
EVAL_POLICIES = ("las", "srtf", "tiresias", "contention", "random", "las-spread", "srtf-spread", "rl")
DEFAULT_CLUSTER = "deepshare-testbed"


@sched_app.command("train-rl")
def train_rl_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", help="where to save the model (.zip)")] = Path("model.zip"),
    trace: Annotated[
        str | None,
        typer.Option(
            help="train on windows of this job trace (CSV / Parquet) instead of generated DeepShare-style mixes"
        ),
    ] = None,
    columns: Annotated[
        str | None,
        typer.Option(help="column mapping of --trace, e.g. `submit=ts,duration=dur,gpus=n,model=model_name`"),
    ] = None,
    comm_mix: Annotated[
        str | None, typer.Option(help="profiles for --trace jobs without a known model, e.g. 'FSDP=0.5,MoE=0.5'")
    ] = None,
    cluster: Annotated[str, typer.Option(help="cluster TOML or bundled name")] = DEFAULT_CLUSTER,
    sizes: Annotated[
        str,
        typer.Option(
            help="train on the cluster scaled by these factors, one drawn per episode "
            "(e.g. '1,4': the 4-node testbed and a 16-node one), so that the "
            "policy sees more than one cluster size"
        ),
    ] = "1,4",
    steps: Annotated[int, typer.Option(help="placement decisions to train for (PPO environment steps)")] = 200_000,
    jobs: Annotated[int, typer.Option(help="jobs per training episode")] = 128,
    seed: Annotated[int, typer.Option(help="seed of PPO and of the episode sampler (training is deterministic)")] = 0,
    reward: Annotated[
        str,
        typer.Option(
            help="'jct' (minus job-time in system: true JCT), 'jct-tail' (plus "
            "the p99 at the end) or 'paper' (-w1 contention slowdown + w2 "
            "utilisation)"
        ),
    ] = "jct",
    order: Annotated[
        str,
        typer.Option(
            help="the order in which the simulator offers waiting jobs: srtf, srsf (GPUs x remaining time), las or fifo"
        ),
    ] = "srtf",
    checkpoint_every: Annotated[int, typer.Option(help="save a checkpoint every this many steps")] = 10_000,
    resume: Annotated[bool, typer.Option(help="continue from the newest checkpoint in <output>.ckpt/")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print the training summary as JSON")] = False,
) -> None:
    """Train the `rl` placement policy with PPO; progress bar, checkpoints, resumable, deterministic per seed."""
    from gpufleet.sched.netaware import ORDERS
    from gpufleet.sim.rl_train import MixSampler, TraceSampler, sized_clusters, train_rl
    from gpufleet.sim.workload import partitions_for
    from gpufleet.spec import load_cluster

    if order not in ORDERS:  # before any trace or cluster is read
        raise typer.BadParameter(f"--order must be one of {', '.join(ORDERS)}, got '{order}'")

    spec = load_cluster(cluster)
    gpn = max(p.gpus_per_node for p in partitions_for(spec))  # a SpecError if the cluster has no training pool
    try:
        factors = [int(x) for x in sizes.split(",") if x.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"--sizes must be comma-separated integers, got '{sizes}'") from exc
    if not factors or min(factors) < 1:
        raise typer.BadParameter("--sizes needs factors of at least 1")
    specs = sized_clusters(spec, factors)
    if trace is not None:
        from gpufleet.perf.comm_profiles import with_comm_profiles

        frame = with_comm_profiles(load_jobs(trace, columns, None, None).jobs, comm_mix)
        sampler: Any = TraceSampler(frame, jobs)
    else:
        sampler = MixSampler(jobs=jobs, gpus_per_node=gpn)
    summary = train_rl(
        specs,
        output,
        steps=steps,
        seed=seed,
        sampler=sampler,
        reward=reward,
        order=order,
        checkpoint_every=checkpoint_every,
        resume=resume,
        progress=not as_json and err.is_terminal,
    )
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        err.print(
            f"trained {summary['steps']:,} steps ({summary['episodes']} episodes) in "
            f"{summary['train_s']:.0f} s; model written to {summary['model']}"
        )


@sched_app.command("eval-rl")
def eval_rl_cmd(
    model: Annotated[Path | None, typer.Argument(help="PPO model from train-rl (default: the shipped one)")] = None,
    mix: Annotated[str, typer.Option(help="light, medium, heavy or random communication intensity")] = "heavy",
    seeds: Annotated[int, typer.Option(help="evaluate on mix seeds 0 .. N-1 (training never uses them)")] = 5,
    jobs: Annotated[int | None, typer.Option(help="jobs per mix (default: 256 per 4 nodes, as DeepShare)")] = None,
    arrival: Annotated[str, typer.Option(help="'batch' (all at t = 0) or 'poisson'")] = "batch",
    cluster: Annotated[str, typer.Option(help="cluster TOML or bundled name (e.g. deepshare-64)")] = DEFAULT_CLUSTER,
    policies: Annotated[str, typer.Option(help="comma-separated policies to compare")] = ",".join(EVAL_POLICIES),
    as_json: Annotated[bool, typer.Option("--json", help="print per-policy means and per-seed rows as JSON")] = False,
    wide: WideOpt = False,
) -> None:
    """Compare `rl` with the baselines on unseen mixes: true JCT (queueing included), p99, makespan, utilisation."""
    from gpufleet.sim.rl_train import best_baseline, eval_policies, summarize_eval
    from gpufleet.sim.workload import partitions_for
    from gpufleet.spec import load_cluster

    if seeds < 1:
        raise typer.BadParameter("--seeds must be at least 1")
    spec = load_cluster(cluster)
    names = [p.strip() for p in policies.split(",") if p.strip()]
    pools = partitions_for(spec)  # a SpecError if the cluster has no training pool
    nodes = sum(p.nodes for p in pools)
    n_jobs = jobs if jobs is not None else 256 * max(1, nodes // 4)
    opts = {"rl": {"model": str(model)}} if model is not None else {}
    frame = eval_policies(
        spec,
        names,
        mix=mix,
        seeds=range(seeds),
        jobs=n_jobs,
        arrival=arrival,
        policy_opts=opts,
        gpus_per_node=pools[0].gpus_per_node,
    )
    means = summarize_eval(frame)
    baseline = best_baseline(means)
    if as_json:
        rows = [clean_json(r) for r in means.iter_rows(named=True)]
        print(
            json.dumps(
                {
                    "mix": mix,
                    "cluster": spec.name,
                    "jobs": n_jobs,
                    "seeds": seeds,
                    "arrival": arrival,
                    "best_baseline": baseline,
                    "policies": rows,
                    "runs": frame.to_dicts(),
                },
                indent=2,
            )
        )
        return
    out.print(eval_table(means, f"{mix} mix, {n_jobs} jobs x {seeds} seeds on {spec.name}", baseline, wide=wide))


def eval_table(means: Any, title: str, baseline: str | None, wide: bool = True) -> Table:
    """Rich table of per-policy means, with the change against the best of las / srtf / tiresias;
    ``wide=False`` leaves out makespan and multi-node share so that it fits 100 columns."""
    cols = [
        "policy",
        "avg JCT h",
        "p99 JCT h",
        "makespan h",
        "GPU util",
        "contention GPU-h",
        "multi-node",
        f"avg vs {baseline or '-'}",
        f"p99 vs {baseline or '-'}",
    ]
    hidden = () if wide else ("makespan h", "multi-node")
    table = Table(
        title=title, header_style="bold", caption=f"--wide shows every column ({len(hidden)} more)" if hidden else None
    )
    keep = [i for i, col in enumerate(cols) if col not in hidden]
    for i in keep:
        table.add_column(cols[i], justify="left" if cols[i] == "policy" else "right", no_wrap=cols[i] != "policy")
    ref = means.filter(means["policy"] == baseline).row(0, named=True) if baseline else None
    for r in means.iter_rows(named=True):
        d_avg = f"{100 * (r['avg_jct_s'] / ref['avg_jct_s'] - 1):+.1f} %" if ref else "-"
        d_p99 = f"{100 * (r['p99_jct_s'] / ref['p99_jct_s'] - 1):+.1f} %" if ref else "-"
        cells = [
            r["policy"],
            f"{r['avg_jct_s'] / 3600:.2f}",
            f"{r['p99_jct_s'] / 3600:.2f}",
            f"{r['makespan_s'] / 3600:.2f}",
            f"{100 * r['gpu_util']:.1f} %",
            f"{r['contention_gpu_h']:.1f}",
            f"{100 * r['multi_node_share']:.0f} %",
            d_avg,
            d_p99,
        ]
        table.add_row(*[cells[i] for i in keep])
    return table
