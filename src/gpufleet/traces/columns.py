"""Column mapping: which source column feeds which canonical column.

A user names the mapping (``{"submit": "submission_time", ...}`` or the CLI string
``submit=submission_time,...``); otherwise well-known column names are detected, so canonical files,
Philly, ElasticFlow and Helios-style CSVs need no mapping at all.

Besides the canonical columns, a source may feed the optional columns of ``OPTIONAL_FIELDS`` (today
``model``: the job's model name, which the network-contention simulation maps to a communication
profile). They are kept as String columns right after the canonical ones when mapped or detected, and
absent otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpufleet.colmap import parse_column_map
from gpufleet.errors import TraceError

#: Accepted mapping keys (lower case) → canonical column.
KEY_ALIASES: dict[str, str] = {
    "job_id": "job_id",
    "id": "job_id",
    "submit": "submit_s",
    "submit_s": "submit_s",
    "duration": "duration_s",
    "duration_s": "duration_s",
    "gpus": "num_gpus",
    "num_gpus": "num_gpus",
    "gpu_type": "gpu_type",
    "user": "user",
    "vc": "vc",
    "kind": "kind",
    "model": "model",
    "model_name": "model",
}

#: Optional columns a source may feed (not in every trace): name → meaning.
OPTIONAL_FIELDS: dict[str, str] = {
    "model": "model the job trains (e.g. 'llama2-7b', 'resnet50', a DeepShare workload), or null",
}

#: Source column names recognised without a mapping (compared case-insensitively, first match wins).
#: Canonical names first, then Philly (timestamp, cluster), ElasticFlow (submission_time, num_gpu)
#: and Helios/Acme (submit_time, gpu_num) names.
AUTO_NAMES: dict[str, tuple[str, ...]] = {
    "job_id": ("job_id", "id", "jobid", "job_name"),
    "submit_s": ("submit_s", "submit", "submit_time", "submission_time", "timestamp"),
    "duration_s": ("duration_s", "duration", "runtime_s", "run_time"),
    "num_gpus": ("num_gpus", "gpus", "num_gpu", "gpu_num", "gpu_count"),
    "gpu_type": ("gpu_type", "gpu_model"),
    "user": ("user", "user_id", "username"),
    "vc": ("vc", "virtual_cluster", "cluster"),
    "kind": ("kind", "job_kind"),
    "model": ("model", "model_name"),
}

#: Canonical columns a source must provide (job_id is generated from the row number when absent).
REQUIRED_FIELDS = ("submit_s", "duration_s", "num_gpus")

_EXAMPLE = "submit=submission_time,duration=duration,gpus=num_gpu"


def canonical_key(key: str) -> str | None:
    """The canonical column a mapping key stands for, or None when the key is unknown."""
    return KEY_ALIASES.get(key.strip().lower())


def _accepted_keys() -> str:
    return ", ".join(sorted(KEY_ALIASES))


def parse_columns(spec: str) -> dict[str, str]:
    """Parse the CLI form ``"submit=submission_time,duration=duration,gpus=num_gpu"`` into a mapping.

    Keys are returned lower-cased as written (aliases such as ``submit`` are kept; the loader accepts
    them). Raises TraceError on a malformed pair, an unknown key or a key given twice
    (:func:`gpufleet.colmap.parse_column_map`).
    """
    return parse_column_map(spec, keys=KEY_ALIASES, error=TraceError, example=_EXAMPLE, pairs="canonical=source")


def _find(available: Sequence[str], wanted: str) -> str | None:
    """The available column equal to ``wanted``; else the unique one equal up to case and spaces."""
    if wanted in available:
        return wanted
    folded = [c for c in available if c.strip().lower() == wanted.strip().lower()]
    return folded[0] if len(folded) == 1 else None


def resolve_columns(
    available: Sequence[str],
    mapping: Mapping[str, str] | None,
    *,
    path: str,
    defaults: Mapping[str, str] | None = None,
    layout: str = "",
) -> dict[str, str]:
    """Decide canonical column → source column for one file.

    ``mapping`` (user's) wins over ``defaults`` (the fixed layout of the reader named ``layout``),
    which win over auto-detection. Raises TraceError naming the file, the missing column and the
    columns the file really has.
    """
    resolved: dict[str, str] = {}
    have = ", ".join(available) if available else "(none)"
    explicit: dict[str, str] = {}
    from_user: set[str] = set()
    for source in (defaults or {}), (mapping or {}):
        for key, column in source.items():
            canonical = canonical_key(key)
            if canonical is None:
                raise TraceError(
                    f"{path}: unknown column key '{key}' in the column mapping; accepted keys: {_accepted_keys()}"
                )
            explicit[canonical] = column
            if source is mapping:
                from_user.add(canonical)
    for canonical, column in explicit.items():
        found = _find(available, column)
        if found is None and canonical not in from_user:
            raise TraceError(
                f"{path}: column '{column}' ({canonical} in the {layout or 'reader'} layout) not found; the "
                f"file has columns: {have}. This is not a {layout or 'reader'} trace: read it with --reader "
                f"csv (and --columns if its names are not recognised)"
            )
        if found is None:
            raise TraceError(
                f"{path}: column '{column}' (mapped to {canonical}) not found; the file has columns: "
                f"{have}. Fix the column mapping, e.g. --columns {_EXAMPLE}"
            )
        resolved[canonical] = found
    used = set(resolved.values())
    for canonical, names in AUTO_NAMES.items():
        if canonical in resolved:
            continue
        lowered = {c.strip().lower(): c for c in available if c not in used}
        for name in names:
            if name in lowered:
                resolved[canonical] = lowered[name]
                used.add(lowered[name])
                break
    missing = [c for c in REQUIRED_FIELDS if c not in resolved]
    if missing:
        raise TraceError(
            f"{path}: no column found for {', '.join(missing)}; the file has columns: {have}. "
            f"Name the source columns with a mapping, e.g. --columns {_EXAMPLE}"
        )
    return resolved
