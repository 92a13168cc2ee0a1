"""The published-measurement table (``perf_ground_truth.csv``) turned into predictable cases.

Each CSV row names a source, a model shape, a GPU, a layout and what was measured (step time, TFLOP/s
per GPU under a stated FLOP convention, MFU, or tokens/s per GPU). ``read_cases`` maps every row it
can onto a ``Case`` (model, system, layout, training options, target) and lists the rows it cannot
predict with the reason. The training-software settings of each source (fp16 or bf16, flash
attention, sequence parallelism, optimizer sharding, overlap) are read from the source and its notes
by the rules in ``_SOURCES``: settings of a published run, not fitted constants.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from gpufleet.data import bundled_path
from gpufleet.errors import SpecError
from gpufleet.perf.model_spec import ModelSpec, get_model
from gpufleet.perf.options import TrainOptions
from gpufleet.perf.system import System

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

_GPUS = (
    (r"TPU", None),
    (r"96GB HBM2e", None),
    (r"A100-40GB", "a100-40g"),
    (r"A100", "a100-80g"),
    (r"H100", "h100"),
)

_CATALOG_NAMES = {
    "Llama3-405B": "llama3-405b",
    "MPT-70B": "mpt-70b",
    "MPT-13B": "mpt-13b",
    "MPT-7B": "mpt-7b",
    "Llama3-70B": "llama3-70b",
}


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


def _model(row: dict[str, str | None]) -> ModelSpec | None:
    name = (row["model"] or "").strip()
    catalog = _CATALOG_NAMES.get(name)
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


def read_cases(path: str | Path | None = None) -> tuple[list[Case], list[Skipped]]:
    """All predictable cases of the table at ``path`` (``None``: the table shipped in the wheel), and the rest."""
    path = Path(path) if path else default_ground_truth_path()
    if not path.is_file():
        raise SpecError(f"{path}: ground-truth table not found; pass --table the published-measurement CSV")
    frame = pl.read_csv(path, infer_schema_length=0)
    cases: list[Case] = []
    skipped: list[Skipped] = []
    for i, row in enumerate(frame.iter_rows(named=True)):
        label = f"{row['model']} on {row['n_gpus']} {(row['gpu'] or '').strip()}"
        src = row["src"] or ""
        source = next((s for s in _SOURCES if re.search(s.pattern, f"{src} {row['model']}")), None)
        gpu = next((name for pat, name in _GPUS if re.search(pat, row["gpu"] or "")), None)
        model = _model(row)
        tp, pp = _int(row["tp"]), _int(row["pp"])
        n = _int(row["n_gpus"])
        if source is None:
            skipped.append(Skipped(i, label, "no published parallel layout or not a GPU run"))
            continue
        if gpu is None:
            skipped.append(Skipped(i, label, "GPU variant without a datasheet peak in the catalog"))
            continue
        if model is None or tp is None or pp is None or n is None:
            skipped.append(Skipped(i, label, "model shape or layout not published"))
            continue
        cp = _int(row["cp"]) or 1
        dp = _int(row["dp"]) or n // (tp * pp * cp)
        gbs = _int(row["gbs"])
        target = _target(row)
        if gbs is None or target is None:
            skipped.append(Skipped(i, label, "batch size or measured figure not published"))
            continue
        mbs = (_int(row["mbs"]),) if _int(row["mbs"]) else (source.mbs or (1,))
        system = System.build(gpu, source.nic, 8, source.nics_per_node, source.rack_gpus, source.oversubscription)
        recompute = source.recompute or (("full",) if (row["recompute"] or "").startswith("full") else ("none",))
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
            "vp": source.vp or (1,),
            "group": source.group,
        }
        options = TrainOptions(**source.options)
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
