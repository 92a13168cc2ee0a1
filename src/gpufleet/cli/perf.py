"""``gpufleet perf``: step time, MFU and memory of a layout (``step``), the layout search (``plan``, also
``gpufleet plan``), accuracy against published runs (``validate``, ``calibrate``) and the model catalog.

Each command turns its options into a :class:`gpufleet.perf.request.PerfRequest`, calls one function of
:mod:`gpufleet.perf.request` or :mod:`gpufleet.perf.reference_runs`, and prints with :mod:`gpufleet.cli.perf_tables`.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from gpufleet.cli.common import JsonOpt, WideOpt, err, out

if TYPE_CHECKING:
    from gpufleet.perf.request import PerfRequest

__all__ = ["perf_app", "plan"]

perf_app = typer.Typer(
    help="Training performance model: step time, MFU and memory of a layout, and its accuracy against "
    "published runs.\n\nStart with `gpufleet perf step --model gpt3-175b --gpus 1024 --tp 8 --pp 8 --gbs 1536`; "
    "`gpufleet perf plan` (or `gpufleet plan`) searches all layouts.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


def _request(**fields: object) -> PerfRequest:
    """The request of a command's model, hardware, batch and software options."""
    from gpufleet.perf.request import PerfRequest

    return PerfRequest(**fields)


class RecomputeMode(StrEnum):
    """Activation recomputation: none, selective (attention core only) or full (whole layer)."""

    none = "none"
    selective = "selective"
    full = "full"


# Options shared by `perf step` and `plan` (declared once, used as parameter annotations).
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Catalog model (see `gpufleet perf models`) or a .json/.toml file with the same fields.",
        rich_help_panel="Model",
    ),
]
LayersOpt = Annotated[int | None, typer.Option(help="Transformer layers (overrides --model).", rich_help_panel="Model")]
HiddenOpt = Annotated[int | None, typer.Option(help="Hidden size h.", rich_help_panel="Model")]
HeadsOpt = Annotated[int | None, typer.Option(help="Attention (query) heads.", rich_help_panel="Model")]
KvHeadsOpt = Annotated[
    int | None, typer.Option(help="Key/value heads (GQA); default = heads.", rich_help_panel="Model")
]
FfnOpt = Annotated[
    int | None, typer.Option("--ffn-hidden", help="MLP width; default 4 x hidden.", rich_help_panel="Model")
]
VocabOpt = Annotated[int | None, typer.Option(help="Vocabulary size (padded).", rich_help_panel="Model")]
SeqOpt = Annotated[int | None, typer.Option(help="Training sequence length in tokens.", rich_help_panel="Model")]
GluOpt = Annotated[
    bool | None,
    typer.Option("--glu/--no-glu", help="Gated (SwiGLU) MLP: three matrices, not two.", rich_help_panel="Model"),
]
GpuOpt = Annotated[str | None, typer.Option(help="GPU catalog name [default: a100-80g].", rich_help_panel="Hardware")]
GpusPerNodeOpt = Annotated[int | None, typer.Option(help="GPUs per node [default: 8].", rich_help_panel="Hardware")]
NicOpt = Annotated[str | None, typer.Option(help="NIC catalog name [default: ib-hdr].", rich_help_panel="Hardware")]
NicsPerNodeOpt = Annotated[int | None, typer.Option(help="NICs per node [default: 8].", rich_help_panel="Hardware")]
ClusterOpt = Annotated[
    Path | None,
    typer.Option(
        help="Take GPU, NIC, node and rack shape from this cluster TOML (instead of --gpu/--nic).",
        rich_help_panel="Hardware",
    ),
]
PoolOpt = Annotated[
    str | None,
    typer.Option(help="Pool of --cluster to use (default: its first training pool).", rich_help_panel="Hardware"),
]
GbsOpt = Annotated[int | None, typer.Option(help="Global batch in sequences.", rich_help_panel="Batch")]
GbsTokensOpt = Annotated[
    str | None,
    typer.Option(
        help="Global batch in tokens, K/M/G = 2^10/2^20/2^30 (16M = 16,777,216); gbs = tokens // seq.",
        rich_help_panel="Batch",
    ),
]
PrecisionOpt = Annotated[
    Literal["bf16", "fp16", "fp8"],
    typer.Option(help="GEMM precision (fp8 needs Hopper or newer).", rich_help_panel="Training software"),
]
ZeroOpt = Annotated[
    int,
    typer.Option(
        min=0,
        max=3,
        help="0 plain DP, 1 distributed optimizer (ZeRO-1), 2 + sharded grads, 3 FSDP.",
        rich_help_panel="Training software",
    ),
]
FlashOpt = Annotated[
    bool, typer.Option("--flash/--no-flash", help="Flash (fused) attention.", rich_help_panel="Training software")
]
SpOpt = Annotated[
    bool,
    typer.Option("--sp/--no-sp", help="Megatron sequence parallelism with TP.", rich_help_panel="Training software"),
]
MegascaleOpt = Annotated[
    bool,
    typer.Option(
        "--megascale",
        help="MegaScale's optimisations: TP/PP/DP overlap, parallel block, fused ops.",
        rich_help_panel="Training software",
    ),
]
TpOverlapOpt = Annotated[
    bool, typer.Option("--tp-overlap", help="Overlap TP collectives with GEMMs.", rich_help_panel="Training software")
]
RecomputeModulesOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--recompute-module",
        help="Megatron-Core's --recompute-modules under selective recompute, repeatable: mla_up_proj (latent "
        "attention keeps its latents, not its per-head Q/K/V), mlp (dense MLPs keep their input). Memory only.",
        rich_help_panel="Training software",
    ),
]
DpOverlapOpt = Annotated[
    bool,
    typer.Option(
        "--dp-overlap", help="Overlap DP gradient reduction with backward.", rich_help_panel="Training software"
    ),
]
CausalOpt = Annotated[
    bool,
    typer.Option(
        "--causal-flops",
        help="MFU convention: count half the attention square (Megatron main) instead of all of it.",
        rich_help_panel="Training software",
    ),
]
EfficiencyOpt = Annotated[
    Path | None,
    typer.Option(help="Efficiency constants TOML (e.g. from `gpufleet perf calibrate`); default: the shipped file."),
]
StackOpt = Annotated[
    str | None,
    typer.Option(
        help="Training software stack (megatron-core, megatron-2021, deepspeed-megatron, megascale, nemo, fsdp, "
        "torchtitan, llama3, hai-llm, holmes): its fitted constants and usual settings (fsdp: ZeRO-3, no SP).",
        rich_help_panel="Training software",
    ),
]
TableOpt = Annotated[
    Path | None, typer.Option(help="Published-measurement CSV [default: the table shipped with gpufleet].")
]


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
    dp: Annotated[
        int | None,
        typer.Option(help="Data-parallel degree [default: gpus / (tp x pp x cp)].", rich_help_panel="Layout"),
    ] = None,
    cp: Annotated[int, typer.Option(help="Context-parallel degree.", rich_help_panel="Layout")] = 1,
    ep: Annotated[
        int, typer.Option(help="Expert-parallel degree (MoE models), carved out of DP x CP.", rich_help_panel="Layout")
    ] = 1,
    mbs: Annotated[int, typer.Option(help="Micro-batch size in sequences.", rich_help_panel="Layout")] = 1,
    vp: Annotated[int, typer.Option(help="Virtual stages per rank (interleaved 1F1B).", rich_help_panel="Layout")] = 1,
    recompute: Annotated[
        RecomputeMode, typer.Option(help="Activation recomputation.", rich_help_panel="Layout")
    ] = RecomputeMode.none,
    gbs: GbsOpt = None,
    gbs_tokens: GbsTokensOpt = None,
    precision: PrecisionOpt = "bf16",
    zero: ZeroOpt = 1,
    flash: FlashOpt = True,
    sp: SpOpt = True,
    megascale: MegascaleOpt = False,
    tp_overlap: TpOverlapOpt = False,
    dp_overlap: DpOverlapOpt = False,
    recompute_module: RecomputeModulesOpt = None,
    causal_flops: CausalOpt = False,
    stack: StackOpt = None,
    efficiency: EfficiencyOpt = None,
    compare_megascale: Annotated[
        bool,
        typer.Option(
            "--compare-megascale", help="Show the layout without and with MegaScale's optimisations, and the speedup."
        ),
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
    from gpufleet.cli.perf_tables import print_comparison, print_step
    from gpufleet.perf.request import LayoutRequest, estimate

    req = _request(
        model=model,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn_hidden=ffn_hidden,
        vocab=vocab,
        seq=seq,
        glu=glu,
        gpu=gpu,
        gpus_per_node=gpus_per_node,
        nic=nic,
        nics_per_node=nics_per_node,
        cluster=cluster,
        pool=pool,
        gbs=gbs,
        gbs_tokens=gbs_tokens,
        precision=precision,
        zero=zero,
        flash=flash,
        sp=sp,
        megascale=megascale,
        tp_overlap=tp_overlap,
        dp_overlap=dp_overlap,
        recompute_modules=tuple(recompute_module or ()),
        causal_flops=causal_flops,
        efficiency=efficiency,
        stack=stack,
    )
    layout = LayoutRequest(tp=tp, pp=pp, dp=dp, cp=cp, mbs=mbs, vp=vp, recompute=recompute.value, ep=ep)
    if compare_megascale:
        base = estimate(req, gpus, layout, megascale=False)
        print_comparison(out, base, estimate(req, gpus, layout, megascale=True), as_json)
    else:
        print_step(out, estimate(req, gpus, layout), as_json)


@perf_app.command("plan")
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
    gpus: Annotated[
        int | None,
        typer.Option(
            help="GPUs to plan for (required unless --cluster has training pools on different NICs).",
            rich_help_panel="Hardware",
        ),
    ] = None,
    gpu: GpuOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    nic: NicOpt = None,
    nics_per_node: NicsPerNodeOpt = None,
    cluster: Annotated[
        Path | None,
        typer.Option(
            help="Cluster TOML: plan on its pool (--pool, default the first training pool); if its training pools "
            "use different NICs and no --pool is given, plan heterogeneously across them.",
            rich_help_panel="Hardware",
        ),
    ] = None,
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
    recompute_module: RecomputeModulesOpt = None,
    causal_flops: CausalOpt = False,
    stack: StackOpt = None,
    efficiency: EfficiencyOpt = None,
    top: Annotated[int, typer.Option(help="How many of the fastest layouts to show.")] = 10,
    recompute: Annotated[
        list[RecomputeMode] | None,
        typer.Option(help="Recompute modes to consider, repeatable [default: none, selective and full]."),
    ] = None,
    max_tp: Annotated[int | None, typer.Option(help="Largest TP degree [default: GPUs per node].")] = None,
    max_cp: Annotated[
        int | None, typer.Option(help="Largest context-parallel degree [default: 32 for seq >= 8192, else 1].")
    ] = None,
    max_ep: Annotated[
        int | None, typer.Option(help="Largest expert-parallel degree for MoE models [default: the experts].")
    ] = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Search every TP x PP x DP x CP x micro-batch x virtual-stage x recompute layout and rank those that fit.

    Examples:

    `gpufleet perf plan --model gpt3-175b --gpus 1024 --gbs 1536`

    `gpufleet perf plan --model llama3-405b --gpu h100 --nic ib-ndr --gpus 8192 --gbs-tokens 16M --top 5`

    `gpufleet perf plan --model gpt3-175b --gpus 1024 --gbs 1536 --recompute selective --recompute full --megascale`

    `gpufleet perf plan --model gpt3-175b --gpus 1024 --gbs 1536 --top 3 --json`

    Prints the fastest layouts with their step-time breakdown, how many candidates broke a divisibility
    rule or ran out of memory, and, for every feasible layout slower than the best, the component
    (bubble, TP/PP/DP communication, recomputation) that costs it most against the best.
    """
    from gpufleet.cli.perf_tables import print_plan
    from gpufleet.perf.request import plan as plan_layouts

    req = _request(
        model=model,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn_hidden=ffn_hidden,
        vocab=vocab,
        seq=seq,
        glu=glu,
        gpu=gpu,
        gpus_per_node=gpus_per_node,
        nic=nic,
        nics_per_node=nics_per_node,
        cluster=cluster,
        pool=pool,
        gbs=gbs,
        gbs_tokens=gbs_tokens,
        precision=precision,
        zero=zero,
        flash=flash,
        sp=sp,
        megascale=megascale,
        tp_overlap=tp_overlap,
        dp_overlap=dp_overlap,
        recompute_modules=tuple(recompute_module or ()),
        causal_flops=causal_flops,
        efficiency=efficiency,
        stack=stack,
    )
    modes = tuple(r.value for r in recompute) if recompute else None
    outcome = plan_layouts(req, gpus, top=top, recompute=modes, max_tp=max_tp, max_cp=max_cp, max_ep=max_ep)
    print_plan(out, outcome, top, as_json=as_json, wide=wide)


@perf_app.command("validate")
def perf_validate(
    table: TableOpt = None,
    efficiency: EfficiencyOpt = None,
    stack: Annotated[
        str | None, typer.Option(help="Only the rows of this training stack (see the table's stack column).")
    ] = None,
    planner: Annotated[
        bool,
        typer.Option(
            "--planner/--no-planner",
            help="Also plan every published run and print the planner's best layout beside the published one.",
        ),
    ] = True,
    as_json: JsonOpt = False,
    csv: Annotated[Path | None, typer.Option(help="Also write the per-row results to this CSV file.")] = None,
    wide: WideOpt = False,
) -> None:
    """Predict every published training measurement and report the error, row by row and per source.

    Examples:

    `gpufleet perf validate`

    `gpufleet perf validate --efficiency my_eff.toml --csv errors.csv`

    `gpufleet perf validate --json | jq '.summary'`

    `gpufleet perf validate --stack fsdp --no-planner`

    Rows in the calibration split set the efficiency constants (`gpufleet perf calibrate`); the held-out
    rows never do, so their error is the honest one. Rows the model cannot predict are listed with the
    reason. The exit status is 0 whatever the errors: this is a report, not a test.
    """
    from gpufleet.cli.perf_tables import print_validation
    from gpufleet.perf.reference_runs import validate_table

    run = validate_table(table, efficiency, stack=stack, planner=planner)
    if csv is not None:
        csv.parent.mkdir(parents=True, exist_ok=True)
        run.table.write_csv(csv)
    print_validation(out, err, run, efficiency=efficiency, csv=csv, as_json=as_json, wide=wide)


@perf_app.command("calibrate")
def perf_calibrate(
    out_path: Annotated[Path, typer.Option("--out", help="Write the fitted constants (TOML) here.")],
    table: TableOpt = None,
    efficiency: Annotated[
        Path | None,
        typer.Option(help="Start from (and use as template) this constants file instead of the shipped one."),
    ] = None,
) -> None:
    """Refit the achieved-efficiency constants to the calibration rows of the published-measurement table.

    Examples:

    `gpufleet perf calibrate --out my_eff.toml`

    `gpufleet perf calibrate --table my_runs.csv --efficiency my_eff.toml --out my_eff2.toml`

    then `gpufleet perf validate --efficiency my_eff.toml` or `gpufleet perf step ... --efficiency my_eff.toml`.

    Only per-GPU-generation, per-network-class and software constants are fitted (bounded least squares on
    log(predicted / measured)); held-out rows never enter the fit. The output keeps the template's comments.
    """
    from gpufleet.cli.perf_tables import print_calibration
    from gpufleet.perf.reference_runs import calibrate_table

    print_calibration(out, calibrate_table(out_path, table, efficiency, status=err.status))


@perf_app.command("models")
def perf_models(as_json: JsonOpt = False, wide: WideOpt = False) -> None:
    """List the shipped model catalog: shapes and parameter counts.

    Examples: `gpufleet perf models`, then `gpufleet perf step --model llama3-405b ...`; a shape flag
    (`--seq 8192`, `--layers 40`) overrides one field of a catalog model.
    """
    from gpufleet.cli.perf_tables import print_models
    from gpufleet.perf.request import catalog_rows

    print_models(out, catalog_rows(), as_json, wide)
