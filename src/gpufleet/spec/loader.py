"""Load a ClusterSpec from a TOML file or a plain dict, with errors that name the file, key and fix."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufleet.errors import SpecError
from gpufleet.spec._toml import read_toml
from gpufleet.spec._validation import spec_error
from gpufleet.spec.cluster import ClusterSpec

__all__ = ["bundled_clusters", "cluster_from_dict", "cluster_to_dict", "default_cluster_path", "load_cluster"]


def default_cluster_path() -> Path:
    """Path of the cluster file shipped with gpufleet (``gpufleet/data/clusters/default.toml``)."""
    return Path(str(resources.files("gpufleet").joinpath("data", "clusters", "default.toml")))


def _clusters_dir() -> Path:
    return Path(str(resources.files("gpufleet").joinpath("data", "clusters")))


def bundled_clusters() -> list[str]:
    """Names of the cluster files shipped with gpufleet (``default``, ``deepshare-testbed``, ...)."""
    return sorted(p.stem for p in _clusters_dir().glob("*.toml"))


def cluster_from_dict(d: Mapping[str, Any], source: str = "<dict>") -> ClusterSpec:
    """Validate a dict shaped like a cluster file; ``source`` names it in the SpecError message."""
    if not isinstance(d, Mapping):
        raise SpecError(f"{source}: a cluster description must be a table (dict), got {type(d).__name__}")
    try:
        return ClusterSpec.model_validate(dict(d))
    except ValidationError as exc:
        raise spec_error(exc, source, ClusterSpec) from None


def cluster_to_dict(spec: ClusterSpec) -> dict[str, Any]:
    """Plain-data form of ``spec`` (lists, no None values) that ``cluster_from_dict`` reads back."""
    return spec.model_dump(mode="json", exclude_none=True)


def load_cluster(path: str | Path | None = None) -> ClusterSpec:
    """Read a cluster TOML file, or a shipped one by name (``deepshare-testbed``); ``None`` loads the shipped
    default. Any problem raises one SpecError."""
    path = default_cluster_path() if path is None else Path(path)
    if not path.exists() and not path.suffix:  # a bare name: one of the shipped clusters
        bundled = _clusters_dir() / f"{path.name}.toml"
        if not bundled.is_file():
            raise SpecError(
                f"cluster '{path}' is neither a file nor a shipped cluster ({', '.join(bundled_clusters())})"
            )
        path = bundled
    return cluster_from_dict(read_toml(path, what="cluster file"), source=str(path))
