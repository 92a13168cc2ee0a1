"""Shared fixtures for the trace tests: the reference Philly CSV and a loaded copy of it."""

from __future__ import annotations

from pathlib import Path

import pytest

#: The reference copy of the Philly trace, next to the repository (it exists in CI: never skip).
SHARED_PHILLY = Path(__file__).resolve().parents[3] / "shared/data/traces/philly.csv"
PHILLY_MD5 = "69df83d8aab663420a85fbd2dad26aba"


@pytest.fixture(scope="session")
def shared_philly() -> Path:
    assert SHARED_PHILLY.is_file(), f"reference trace missing: {SHARED_PHILLY}"
    return SHARED_PHILLY


@pytest.fixture(scope="session")
def philly_load(shared_philly: Path):
    from gpufleet.traces import load_trace

    return load_trace(shared_philly)
