"""Shared fixtures for the trace tests: the published Philly CSV and a loaded copy of it.

The published file is the bundled ``philly.csv.gz`` unpacked: the fixture checks its md5, so the tests read the
file exactly as Pollux's artifact publishes it, without a second 3.4 MB copy in the repository.
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest

#: md5 of the published (uncompressed) Philly trace, ``petuum/adaptdl:simulator/traces/philly.csv``.
PHILLY_MD5 = "69df83d8aab663420a85fbd2dad26aba"


@pytest.fixture(scope="session")
def philly_md5() -> str:
    """md5 of the published Philly CSV (a fixture, since test modules cannot import this conftest by name)."""
    return PHILLY_MD5


@pytest.fixture(scope="session")
def published_philly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The published ``philly.csv``, unpacked from the bundled copy into a session folder."""
    from gpufleet.traces import bundled_trace_path

    text = gzip.decompress(bundled_trace_path().read_bytes())
    assert hashlib.md5(text).hexdigest() == PHILLY_MD5, "bundled philly.csv.gz is not the published trace"
    path = tmp_path_factory.mktemp("philly") / "philly.csv"
    path.write_bytes(text)
    return path


@pytest.fixture(scope="session")
def philly_load(published_philly: Path):
    from gpufleet.traces import load_trace

    return load_trace(published_philly)
