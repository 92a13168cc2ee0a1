"""Files shipped inside the gpufleet wheel: catalogs, cluster files and the public reference data.

``bundled_path`` names one of them, so a command finds its default data from any directory after a plain
``pip install``. Sources and licences of the copied public files: ``ATTRIBUTION.md`` at the repository root.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from gpufleet.errors import ConfigError

__all__ = ["ALIBABA_PAI_JOBS", "bundled_path", "straggler_sample_path"]

#: Alibaba PAI jobs whose per-worker mini-batch times ship in ``stragglers/`` (cluster-trace-gpu-v2020).
ALIBABA_PAI_JOBS = (1, 2, 3, 4)


def bundled_path(*parts: str) -> Path:
    """Path of the shipped file or folder ``parts`` under ``gpufleet/data`` (e.g. ``"contention"``)."""
    return Path(str(resources.files(__name__).joinpath(*parts)))


def straggler_sample_path(job: int) -> Path:
    """The shipped Alibaba PAI per-worker mini-batch times of ``job`` (1-4), the straggler validation data."""
    if job not in ALIBABA_PAI_JOBS:
        raise ConfigError(f"no Alibaba PAI straggler sample for job {job}; shipped jobs: {ALIBABA_PAI_JOBS}")
    return bundled_path("stragglers", f"alibaba_pai_job_{job}_norm.csv")
