"""The repository carries its own data: every copied public file is attributed, licences travel with the copies,
and the reference tables commands read by default ship inside the package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import gpufleet
from gpufleet.data import bundled_path

ROOT = Path(__file__).resolve().parents[1]
ATTRIBUTION = (ROOT / "ATTRIBUTION.md").read_text(encoding="utf-8")
PACKAGE_DATA = Path(gpufleet.__file__).parent / "data"
#: Package-data folders that hold copies of public files (the rest of gpufleet/data is gpufleet's own).
COPIED_FOLDERS = ("contention", "stragglers", "traces", "inference")
#: Licence texts the copied files' licences ask to travel with them.
LICENCES = {
    PACKAGE_DATA / "contention" / "LICENSE.DeepShare": "Apache License",
    PACKAGE_DATA / "traces" / "LICENSE.adaptdl": "Apache License",
    PACKAGE_DATA / "traces" / "LICENSE.elasticflow": "MIT License",
    ROOT / "tests" / "data" / "kineto" / "LICENSE.HolisticTraceAnalysis": "MIT License",
}


def _copied_files() -> list[Path]:
    files = [PACKAGE_DATA / "perf_ground_truth.csv"]
    for folder in COPIED_FOLDERS:
        listed = (PACKAGE_DATA / folder).iterdir()
        files += sorted(p for p in listed if p.suffix != ".md" or p.name.startswith("README"))
    files += sorted(p for p in (ROOT / "tests" / "data").rglob("*") if p.is_file())
    return [p for p in files if not p.name.startswith("LICENSE")]


@pytest.mark.parametrize("path", _copied_files(), ids=lambda p: p.name)
def test_every_copied_file_has_an_attribution_entry(path: Path) -> None:
    base = PACKAGE_DATA if PACKAGE_DATA in path.parents else ROOT / "tests" / "data"
    assert f"`{path.relative_to(base).as_posix()}`" in ATTRIBUTION, f"{path} has no entry in ATTRIBUTION.md"


@pytest.mark.parametrize(("path", "first_words"), LICENCES.items(), ids=lambda v: getattr(v, "name", ""))
def test_licence_texts_travel_with_the_copies(path: Path, first_words: str) -> None:
    assert path.read_text(encoding="utf-8").lstrip().startswith(first_words)
    assert f"`{path.parent.name}/{path.name}`" in ATTRIBUTION


def test_entries_name_files_that_exist() -> None:
    """No entry outlives its file: each backticked path in the two tables exists in its folder."""
    package, fixtures = ATTRIBUTION.split("## Test fixtures")
    tables = ((package.split("## Shipped in the wheel")[1], PACKAGE_DATA), (fixtures, ROOT / "tests" / "data"))
    for text, base in tables:
        rows = [line for line in text.splitlines() if line.startswith("| `")]
        assert rows
        for row in rows:
            for name in re.findall(r"`([\w./-]+\.(?:csv|gz|md))`", row.split(" | ")[0]):
                assert (base / name).is_file(), f"ATTRIBUTION.md names {name}, absent from {base}"


def test_default_tables_ship_in_the_package() -> None:
    assert bundled_path("perf_ground_truth.csv") == PACKAGE_DATA / "perf_ground_truth.csv"
    header = bundled_path("perf_ground_truth.csv").read_text(encoding="utf-8").splitlines()
    assert len(header) > 40 and {"stack", "split"} <= set(header[0].split(","))  # published runs, stack and split
    for name in ("deepshare_isolated_thp.csv", "deepshare_shared_thp_ratio.csv", "deepshare_total_samples_trained.csv"):
        assert bundled_path("contention", name).is_file()
    assert len(list(bundled_path("stragglers").glob("alibaba_pai_job_*_norm.csv"))) == 4


def test_no_source_reads_outside_the_repository() -> None:
    """Nothing in src, tests, bench or .ci reaches for a ``shared`` folder beside the checkout or its variable."""
    pattern = re.compile(r"GPUFLEET_SHARED|shared/data|/ \"shared\"|\"\.\./shared")
    offenders = []
    for folder in ("src", "tests", "bench", ".ci"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".toml", ""} and path != Path(__file__).resolve():
                text = path.read_text(encoding="utf-8", errors="replace")
                offenders += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in pattern.finditer(text)]
    assert offenders == []
