"""The published-measurement table (``perf_ground_truth.csv``) turned into predictable cases.

Each CSV row names a source, a model shape, a GPU, a layout and what was measured (step time, TFLOP/s
per GPU under a stated FLOP convention, MFU, or tokens/s per GPU). ``read_cases`` maps every row it
can onto a ``Case`` (model, system, layout, training options, target) and lists the rows it cannot
predict with the reason. The training-software settings of each source (fp16 or bf16, flash
attention, sequence parallelism, optimizer sharding, overlap) are read from the source and its notes
by the rules in ``_SOURCES``: settings of a published run, not fitted constants. The table's ``stack``
column names each row's training software stack and its ``split`` column whether the row calibrates the
constants or is held out; both were written into the table before any fit (docs/perf.md says how).
A row whose model column names a catalog model takes its shape from the catalog; a layout written in its
notes (``FSDP32 TP8``, ``PP16``, ``EP64``, ``VP=4``) fills the layout columns it leaves empty.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from gpufleet.data import bundled_path
from gpufleet.errors import SpecError
from gpufleet.perf.model_spec import ModelSpec, get_model, model_catalog
from gpufleet.perf.options import TrainOptions
from gpufleet.perf.system import System
from gpufleet.spec import get_gpu, get_nic

__all__ = ["Case", "Skipped", "default_ground_truth_path", "read_cases"]


@dataclass(frozen=True)
class Case:
    """One published measurement the model predicts."""

    row: int
    label: str
    source: str
    model: ModelSpec
    system: System
    gpus: int
    tp: int
    pp: int
    dp: int
    cp: int
    gbs: int
    seq: int
    recompute: tuple[str, ...]  # candidates; one value when published
    options: TrainOptions
    mbs: tuple[int, ...]  # candidates; one value when published
    vp: tuple[int, ...]  # candidates; one value when published
    target_kind: str  # step_time_s | tflops_model | tflops_hfu_full | mfu | tokens_per_s_per_gpu
    target: float
    group: str  # the source family, for per-group error summaries
    stack: str | None = None  # training software stack (gpufleet.perf.stacks)
    split: str = ""  # calibration | held-out, as written in the table ('' = by the rules of perf.validate)
    ep: int = 1  # expert-parallel degree (MoE)


@dataclass(frozen=True)
class Skipped:
    """A row the model does not predict, and why."""

    row: int
    label: str
    reason: str


@dataclass(frozen=True)
class _Source:
    """How to read the rows of one publication."""

    pattern: str  # regex on the 'src' column (and, where needed, the model column)
    group: str
    options: dict[str, Any]
    nic: str
    nics_per_node: int = 8
    rack_gpus: int | None = None
    oversubscription: float = 1.0
    mbs: tuple[int, ...] | None = None  # None: published in the row, else the tuning candidates
    vp: tuple[int, ...] | None = None
    recompute: tuple[str, ...] | None = None  # None: from the row's recompute column
    gpus_per_node: int = 8


_MEGATRON_2021 = {"precision": "fp16", "flash_attention": False, "sequence_parallel": False, "zero": 0}
_TUNED_MBS = (1, 2, 4, 8)
_TUNED_VP = tuple(range(1, 17))
_UNPUBLISHED_RC = ("none", "selective")  # Megatron-era runs that do not say: whichever fits and is faster

#: One entry per publication, first match wins. Settings follow each paper's text and notes column.
_SOURCES: tuple[_Source, ...] = (
    _Source(r"^Narayanan21", "Narayanan 2021", _MEGATRON_2021, "ib-hdr", mbs=_TUNED_MBS, vp=_TUNED_VP),
    _Source(
        r"^Korthikanti22",
        "Korthikanti 2022",
        {"precision": "fp16", "flash_attention": False, "sequence_parallel": True, "zero": 0},
        "ib-hdr",
        mbs=(1,),
        vp=(1,),
        recompute=("selective",),
    ),
    _Source(
        r"^MegaScale.*GPT-175B \(MegaScale\)",
        "MegaScale (MegaScale)",
        {
            "precision": "bf16",
            "flash_attention": True,
            "zero": 1,
            "tp_overlap": True,
            "pp_overlap": True,
            "dp_overlap": True,
            "parallel_block": True,
            "fused_ops": True,
        },
        "roce-200g",
        mbs=(1,),
        vp=(6,),
        recompute=_UNPUBLISHED_RC,
    ),
    _Source(
        r"^MegaScale Tab",
        "MegaScale (Megatron-LM)",
        {"precision": "bf16", "flash_attention": False, "zero": 1},
        "roce-200g",
        mbs=(1,),
        vp=(6,),
        recompute=_UNPUBLISHED_RC,
    ),
    _Source(
        r"^MegaScale Fig",
        "MegaScale (Megatron-LM)",
        {"precision": "bf16", "flash_attention": False, "zero": 1},
        "roce-200g",
        mbs=(1,),
        vp=(3,),
        recompute=_UNPUBLISHED_RC,
    ),
    _Source(
        r"^NVIDIA/Megatron-LM megatron/core/transformer/moe",
        "Megatron-Core MoE",
        {"precision": "bf16", "flash_attention": True, "zero": 1, "tp_overlap": True, "dp_overlap": True},
        "ib-ndr",
        mbs=_TUNED_MBS,
        vp=_TUNED_VP,
        recompute=_UNPUBLISHED_RC,
    ),
    _Source(
        r"^NVIDIA/Megatron-LM README",
        "Megatron-Core H100",
        {"precision": "bf16", "flash_attention": True, "zero": 1, "tp_overlap": True, "dp_overlap": True},
        "ib-ndr",
        mbs=_TUNED_MBS,
        vp=_TUNED_VP,
        recompute=_UNPUBLISHED_RC,
    ),
    _Source(
        r"^Llama 3 paper",
        "Llama 3",
        {"precision": "bf16", "flash_attention": True, "zero": 2, "dp_overlap": True},
        "roce-400g",
        rack_gpus=3072,
        oversubscription=7.0,
        mbs=(1,),
        vp=_TUNED_VP,
        recompute=("none",),
    ),
    # torchtitan: FSDP2 (reshard after forward unless PP is on), sequence parallelism with TP, torch.compile
    # (fused element-wise ops) and async TP where the row says so; Grand Teton hosts, 400 Gb/s RDMA per GPU
    _Source(
        r"^pytorch/torchtitan",
        "torchtitan (FSDP)",
        {"flash_attention": True, "sequence_parallel": True, "zero": 3},
        "roce-400g",
        mbs=(1,),  # torchtitan's default pipeline micro-batch; FSDP-only rows publish their local batch
    ),
    # BLOOM: Megatron-DeepSpeed (DeepSpeed's pipeline engine, no interleaving), ZeRO-1, 4x 100 Gb/s Omni-Path
    # per node (an InfiniBand-class fabric at 100 Gb/s)
    _Source(
        r"^BigScience BLOOM",
        "BLOOM",
        {"precision": "bf16", "flash_attention": False, "sequence_parallel": False, "zero": 1},
        "ib-edr",
        nics_per_node=4,
        vp=(1,),
    ),
    _Source(
        r"^Zhang et al. 2022 OPT",
        "OPT",
        {"precision": "fp16", "flash_attention": False, "sequence_parallel": False, "zero": 3},
        "ib-hdr",
        mbs=_TUNED_MBS,
        vp=(1,),
    ),
    # DeepSeek-V3: HAI-LLM's DualPipe overlaps EP all-to-all and PP sends with compute; its bubble,
    # (PP/2 - 1) stage-times, is about half of 1F1B's: two virtual stages in the model's terms
    _Source(
        r"^DeepSeek-V3 report",
        "DeepSeek-V3",
        {
            "precision": "fp8",
            "flash_attention": True,
            "sequence_parallel": False,
            "zero": 1,
            "dp_overlap": True,
            "pp_overlap": True,
            "ep_overlap": True,
        },
        "ib-ndr",
        mbs=(1, 2, 4),
        vp=(2,),
    ),
    # MT-NLG ran DeepSpeed's pipeline engine, which has no interleaved schedule.
    _Source(r"^MT-NLG", "MT-NLG", {**_MEGATRON_2021, "precision": "bf16"}, "ib-hdr", mbs=_TUNED_MBS, vp=(1,)),
    _Source(
        r"^MLPerf",
        "MLPerf GPT-3 (fp8)",
        {"precision": "fp8", "flash_attention": True, "zero": 1, "tp_overlap": True, "dp_overlap": True},
        "ib-ndr",
        mbs=_TUNED_MBS,
        vp=_TUNED_VP,
        recompute=("none",),
    ),
    _Source(
        r"^mosaicml/llm-foundry",
        "MosaicML MPT (FSDP)",
        {"precision": "bf16", "flash_attention": True, "sequence_parallel": False, "zero": 3},
        "roce-200g",
        mbs=(1, 2, 4, 8, 16),
        vp=(1,),
        recompute=("full",),
    ),
    # NeMo 24.12's performance summary: the same Megatron-Core fp8 recipes as Megatron-Bridge's, a year earlier
    _Source(
        r"^NVIDIA NeMo Framework 24",
        "NeMo 24.12 (fp8)",
        {"precision": "fp8", "flash_attention": True, "zero": 1, "tp_overlap": True, "dp_overlap": True},
        "ib-ndr",
        mbs=(1,),
        vp=(1,),
        recompute=("none",),
    ),
    _Source(
        r"^NVIDIA-NeMo/Megatron-Bridge",
        "Megatron-Bridge (fp8)",
        {"precision": "fp8", "flash_attention": True, "zero": 1, "tp_overlap": True, "dp_overlap": True},
        "ib-ndr",
        mbs=(1,),
        vp=(5,),
        recompute=("none",),
    ),
)


def _generic_source(row: dict[str, str | None], gpu: Any) -> _Source:
    """How to read a row from a publication gpufleet has no rules for: the row's stack (its ``stack`` column, else the
    reference) with that stack's usual settings, the network its ``net`` column names (else the usual fabric of the
    GPU's generation), and whatever the row leaves out (micro-batch, virtual stages, recomputation) tuned, as the
    authors would have tuned it."""
    from gpufleet.perf.stacks import get_stack, stack_names

    stack = (row.get("stack") or "").strip()
    options: dict[str, Any] = {"flash_attention": True, "zero": 1}
    if stack in stack_names():
        options.update(get_stack(stack).options)
    net = (row.get("net") or "").lower()
    speed = re.search(r"(100|200|400|800)\s*g", net.replace(" gb/s", "g").replace("gbps", "g").replace("gb", "g"))
    gbps = int(speed.group(1)) if speed else (400 if gpu is not None and gpu.arch == "hopper" else 200)
    if "roce" in net or "rdma" in net:
        nic = f"roce-{min(gbps, 400)}g"
    elif ("ethernet" in net or "tcp" in net) and "infiniband" not in net:
        nic = "eth-100g"
    elif "ndr" in net:
        nic = "ib-ndr"
    elif "hdr" in net:
        nic = "ib-hdr"
    elif "edr" in net:
        nic = "ib-edr"
    else:
        nic = {100: "ib-edr", 200: "ib-hdr"}.get(gbps, "ib-ndr")
    return _Source(r".*", "other publications", options, nic, mbs=_TUNED_MBS, vp=_TUNED_VP, recompute=_UNPUBLISHED_RC)


_GPUS = (
    (r"TPU", None),
    (r"96GB HBM2e", "h100-96g-hbm2e"),
    (r"A100\b.{0,12}\b40\s*GB", "a100-40g"),  # A100-40GB, A100 SXM4 40GB, A100-SXM4-40GB
    (r"V100", "v100"),
    (r"A100", "a100-80g"),
    (r"H800", "h800"),
    (r"H200", "h200"),
    (r"H100", "h100"),
)

#: GPU variants the catalog lacks, as (catalog base, fields that differ, source). torchtitan's Grand Teton
#: H100s carry 96 GB of HBM2e at 2.4 TB/s (benchmark doc); their 500 W cap lowers the clock by an amount
#: the doc does not know, so the peak stays the SXM datasheet's (as torchtitan's own MFU does).
_GPU_VARIANTS = {"h100-96g-hbm2e": ("h100", {"memory_gb": 96.0, "memory_bw_gbps": 2400.0})}

#: The stack of each source family, for tables without a ``stack`` column (the shipped table names it per row).
_GROUP_STACKS = {
    "Narayanan 2021": "megatron-2021",
    "Korthikanti 2022": "megatron-core",
    "MegaScale (MegaScale)": "megascale",
    "MegaScale (Megatron-LM)": "megatron-core",
    "Megatron-Core MoE": "megatron-core",
    "Megatron-Core H100": "megatron-core",
    "torchtitan (FSDP)": "torchtitan",
    "BLOOM": "deepspeed-megatron",
    "OPT": "metaseq",
    "DeepSeek-V3": "hai-llm",
    "Llama 3": "llama3",
    "MT-NLG": "deepspeed-megatron",
    "MLPerf GPT-3 (fp8)": "nemo",
    "MosaicML MPT (FSDP)": "fsdp",
    "Megatron-Bridge (fp8)": "nemo",
    "NeMo 24.12 (fp8)": "nemo",
}

#: Model names in the table that differ from a catalog name or alias.
_CATALOG_NAMES = {"Llama3-405B": "llama3-405b", "Llama3-70B": "llama3-70b"}

#: Rows whose shape columns are given keep them; the catalog is consulted for rows that give no shape.
_SHAPE_COLUMNS = ("layers", "hidden", "heads", "vocab")


def default_ground_truth_path() -> Path:
    """The published-measurement table shipped in the wheel (``gpufleet/data/perf_ground_truth.csv``)."""
    return bundled_path("perf_ground_truth.csv")


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    match = re.match(r"\s*(\d+)", value)
    return int(match.group(1)) if match else None


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def _loose_key(name: str) -> str:
    """A model name with case, separators (space, ``-``, ``_``, ``.``), an organisation prefix (``meta-llama/``,
    ``Meta-``) and a release suffix (``-Instruct``, ``-Base``, ``-hf``) dropped: ``LLAMA3_70B``, ``Llama-3-70B`` and
    ``Meta-Llama-3-70B-Instruct`` all read ``llama370b``."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    key = re.sub(r"^meta[-_ ]", "", key)
    key = re.sub(r"[-_ ](instruct|base|hf|chat)$", "", key)
    return re.sub(r"[\s\-_.]", "", key)


@functools.cache
def _loose_catalog() -> dict[str, str]:
    """Loose keys of every catalog name and alias; a key two models share is left out (ambiguous)."""
    seen: dict[str, set[str]] = {}
    for spec in model_catalog().specs.values():
        for alias in (spec.name, *spec.aliases):
            seen.setdefault(_loose_key(alias), set()).add(spec.name)
    return {key: next(iter(names)) for key, names in seen.items() if len(names) == 1}


def _catalog_name(name: str) -> str | None:
    """The catalog model a table row names (its model column, case and suffixes like ' (MLPerf)' aside, and, failing
    an exact name or alias, the way vendors spell it: ``LLAMA3.1_405B``, ``DeepSeekV3``, ``Llama-2-13b-hf``)."""
    if name in _CATALOG_NAMES:
        return _CATALOG_NAMES[name]
    key = re.sub(r"\s*\(.*\)\s*$", "", name).strip().lower().replace(" ", "-")
    catalog = model_catalog()
    for spec in catalog.specs.values():
        if key == spec.name or key in spec.aliases:
            return spec.name
    return _loose_catalog().get(_loose_key(re.sub(r"\s*\(.*\)\s*$", "", name)))


def _gpu(row: dict[str, str | None]):
    name = next((name for pat, name in _GPUS if re.search(pat, row["gpu"] or "")), None)
    if name is None:
        return None
    if name in _GPU_VARIANTS:
        base, fields = _GPU_VARIANTS[name]
        return get_gpu(base).model_copy(update={**fields, "name": name})
    return get_gpu(name)


def _layout_text(row: dict[str, str | None]) -> dict[str, int]:
    """Degrees written in the row's notes or reported text: FSDP128, FSDP32 TP8, PP16, EP64, VP=4, CP2."""
    text = f"{row.get('notes') or ''} {row.get('reported') or ''}"
    found: dict[str, int] = {}
    for key, pattern in (("dp", r"FSDP\s*(\d+)"), ("tp", r"\bTP\s*(\d+)"), ("pp", r"\bPP\s*(\d+)")):
        match = re.search(pattern, text)
        if match:
            found[key] = int(match.group(1))
    for key, pattern in (("ep", r"\bEP\s*(\d+)"), ("vp", r"\bVP\s*=?\s*(\d+)"), ("cp", r"\bCP\s*(\d+)")):
        match = re.search(pattern, text)
        if match:
            found[key] = int(match.group(1))
    if "dp" in found or "tp" in found or "pp" in found:
        found.setdefault("tp", 1)
        found.setdefault("pp", 1)
    if re.search(r"interleaved", text, re.IGNORECASE):
        found["interleaved"] = 1
    return found


def _model(row: dict[str, str | None]) -> ModelSpec | None:
    name = (row["model"] or "").strip()
    catalog = _catalog_name(name)
    if catalog is not None and all(_int(row[c]) is not None for c in _SHAPE_COLUMNS) and name not in _CATALOG_NAMES:
        catalog = None  # the row publishes its own shape (Megatron's GPT sizes): keep it as written
    base = get_model(catalog) if catalog else None
    shape = {
        "layers": _int(row["layers"]),
        "hidden": _int(row["hidden"]),
        "heads": _int(row["heads"]),
        "vocab": _int(row["vocab"]),
        "seq": _int(row["seq"]),
    }
    if base is not None:
        return base.with_overrides(**shape)
    if None in (shape["layers"], shape["hidden"], shape["heads"], shape["vocab"]):
        return None
    return ModelSpec(name=name, **{k: v for k, v in shape.items() if v is not None})


def _target(row: dict[str, str | None]) -> tuple[str, float] | None:
    iter_s = _float(row["iter_s"])
    if iter_s:
        return "step_time_s", iter_s
    reported = row["reported"] or ""
    tok = re.search(r"([\d.]+)\s*tok/s/GPU", reported)
    if tok:
        return "tokens_per_s_per_gpu", float(tok.group(1))
    tf = _float(row["tf_reported"])
    if tf:
        return ("tflops_hfu_full" if row["tf_kind"] == "hfu_full" else "tflops_model"), tf
    mfu = _float(row["mfu_reported"])
    if mfu:
        return "mfu", mfu / 100.0
    return None


def _recompute(text: str | None) -> tuple[str, ...]:
    text = (text or "").strip().lower()
    if text.startswith("full"):
        return ("full",)
    if text.startswith("selective"):
        return ("selective",)
    return ("none",)


#: What a row takes from its stack's usual settings: its memory recipe, and what its TP overlap hides (revision 7).
_MEMORY_RECIPE = (
    "selective_policy",
    "fp8_cache",
    "schedule",
    "lean_activations",
    "optimizer_bytes",
    "tp_overlap_backward",
    "pp_overlap_interleaved",
    "sharded_fp32_params",
)


def _row_options(source: _Source, row: dict[str, str | None], tp: int, pp: int, stack: str | None) -> dict[str, Any]:
    """The source's training options, with what the row itself says: fp8, torch.compile, async TP, the stack."""
    opts = dict(source.options)
    text = f"{row.get('precision') or ''} {row.get('reported') or ''} {row.get('notes') or ''}"
    if "precision" not in opts:
        opts["precision"] = "fp8" if "fp8" in text.lower() or "float8" in text.lower() else "bf16"
    if re.search(r"\bFSDP\s*\d", row.get("notes") or ""):  # the row publishes fully sharded data parallelism
        opts["zero"] = 3
    modules = re.search(r"recompute_modules\s*=\s*([a-z_]+(?:\+[a-z_]+)*)", row.get("notes") or "")
    if modules:  # Megatron-Core's --recompute-modules, as the run's published recipe sets them
        opts["recompute_modules"] = tuple(modules.group(1).split("+"))
    notes = row.get("notes") or ""
    if re.search(r"\bgrad_reduce\s*=\s*bf16\b", notes):  # the recipe's gradient buffer and reduction in bf16
        opts["grad_reduce_bytes"] = 2  # (NeMo 2.0's grad_reduce_in_fp32: false, Apex's grad_sync_dtype: bf16)
    if re.search(r"\boptimizer_state\s*=\s*bf16\b", notes):  # Apex DistributedFusedAdam with dtype: bf16:
        opts["optimizer_bytes"] = 6.0  # its parameter copy and both Adam moments in bf16
    if source.group.startswith("torchtitan"):
        opts["fused_ops"] = "compile" in text
        opts["tp_overlap"] = "AsyncTP" in text.replace(" ", "")
        opts["sequence_parallel"] = tp > 1
        opts["reshard_after_forward"] = pp == 1  # torchtitan keeps weights gathered across micro-batches with PP
    if stack:
        opts["stack"] = stack
        from gpufleet.perf.stacks import get_stack

        # the stack's memory recipe (what it keeps for the backward, its schedule, its optimizer state)
        recipe = {k: v for k, v in get_stack(stack).options.items() if k in _MEMORY_RECIPE}
        opts = {**recipe, **opts}
    return opts


def read_cases(path: str | Path | None = None) -> tuple[list[Case], list[Skipped]]:
    """All predictable cases of the table at ``path`` (``None``: the table shipped in the wheel), and the rest."""
    path = Path(path) if path else default_ground_truth_path()
    if not path.is_file():
        raise SpecError(f"{path}: ground-truth table not found; pass --table the published-measurement CSV")
    frame = pl.read_csv(path, infer_schema_length=0)
    cases: list[Case] = []
    skipped: list[Skipped] = []
    for i, row in enumerate(frame.iter_rows(named=True)):
        row = {**{c: None for c in ("stack", "split", "ep", "notes")}, **row}
        label = f"{row['model']} on {row['n_gpus']} {(row['gpu'] or '').strip()}"
        src = row["src"] or ""
        source = next((s for s in _SOURCES if re.search(s.pattern, f"{src} {row['model']}")), None)
        gpu = _gpu(row)
        model = _model(row)
        written = _layout_text(row)
        tp, pp = _int(row["tp"]) or written.get("tp"), _int(row["pp"]) or written.get("pp")
        n = _int(row["n_gpus"])
        if tp is None and pp is None and n is not None and (_int(row["dp"]) or written.get("dp")) == n:
            tp = pp = 1  # pure data parallelism (DDP or FSDP over every GPU): no model parallelism to publish
        if gpu is not None and source is None:  # a publication without rules of its own: read it generically
            source = _generic_source(row, gpu)
        if source is None:
            skipped.append(Skipped(i, label, "no published parallel layout or not a GPU run"))
            continue
        if gpu is None:
            skipped.append(Skipped(i, label, "GPU variant without a datasheet peak in the catalog"))
            continue
        if model is None or tp is None or pp is None or n is None:
            skipped.append(Skipped(i, label, "model shape or layout not published"))
            continue
        cp = _int(row["cp"]) or written.get("cp", 1)
        dp = _int(row["dp"]) or n // (tp * pp * cp)
        ep = _int(row["ep"]) or written.get("ep", 1)
        gbs = _int(row["gbs"])
        target = _target(row)
        if gbs is None or target is None:
            skipped.append(Skipped(i, label, "batch size or measured figure not published"))
            continue
        mbs = (_int(row["mbs"]),) if _int(row["mbs"]) else (source.mbs or (1,))
        nic = get_nic(source.nic)
        system = System(gpu, nic, source.gpus_per_node, source.nics_per_node, source.rack_gpus, source.oversubscription)
        written_rc = (row["recompute"] or "").strip().lower()
        published_rc = written_rc.startswith(("full", "selective", "none"))
        recompute = _recompute(written_rc) if published_rc else (source.recompute or ("none",))
        vp = source.vp or (1,)
        if "vp" in written:
            vp = (written["vp"],)
        elif written.get("interleaved") and pp > 1 and _int(row["pp"]) is None:  # a layout read from the notes
            vp = tuple(v for v in _TUNED_VP if v > 1)
        if source.group.startswith("torchtitan") and pp > 1 and not _int(row["mbs"]):
            # torchtitan at its benchmark commit (9dec370, pipelining_utils.py): as many micro-batches as pipeline
            # ranks unless configured, and two stages per rank for interleaved (multi-stage) schedules
            mbs = (max(gbs // (dp * pp), 1),) if gbs else mbs
            vp = (2,) if written.get("interleaved") else (1,)
        common = {
            "source": src,
            "model": model,
            "system": system,
            "gpus": n,
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "cp": cp,
            "gbs": gbs,
            "seq": model.seq,
            "mbs": mbs,
            "vp": vp,
            "group": source.group,
            "stack": (row["stack"] or "").strip() or _GROUP_STACKS.get(source.group),
            "split": (row["split"] or "").strip(),
            "ep": ep,
        }
        options = TrainOptions(**_row_options(source, row, tp, pp, common["stack"]))
        cases.append(
            Case(
                row=i,
                label=label,
                recompute=recompute,
                options=options,
                target_kind=target[0],
                target=target[1],
                **common,
            )
        )
        baseline = re.search(r"full-recompute baseline ([\d.]+)s", row["reported"] or "")
        if baseline:  # Korthikanti Table 5 also times the same runs with full recomputation, no SP
            cases.append(
                Case(
                    row=i,
                    label=f"{label} (full recompute)",
                    recompute=("full",),
                    options=options.model_copy(update={"sequence_parallel": False}),
                    target_kind="step_time_s",
                    target=float(baseline.group(1)),
                    **common,
                )
            )
    return cases, skipped
