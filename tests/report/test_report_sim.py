"""write_sim_report(): a self-contained, small, well-formed HTML page from hand-built SimResults."""

from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from gpufleet.report.sim_report import gpu_utilisation, write_sim_report
from gpufleet.sim.result import JOB_RESULT_COLUMNS, TIMELINE_COLUMNS, SimResult

POLICIES = ("fifo", "sjf", "aryl")
MB = 1024 * 1024


def make_result(
    policy: str, *, n_jobs: int = 40, n_events: int = 200, seed: int = 0, total_gpus: int = 64
) -> SimResult:
    """A plausible run: some jobs never wait, some never finish (NaN), VCs include a missing one."""
    rng = np.random.default_rng(seed)
    submit = np.sort(rng.uniform(0.0, 5 * 86400.0, n_jobs))
    duration = rng.lognormal(7.0, 1.5, n_jobs)
    queue = np.where(rng.random(n_jobs) < 0.3, 0.0, rng.lognormal(5.0, 2.0, n_jobs))
    start = submit + queue
    finish = start + duration
    unfinished = rng.random(n_jobs) < 0.1
    start[unfinished & (rng.random(n_jobs) < 0.5)] = np.nan
    finish[unfinished] = np.nan
    jobs = pl.DataFrame(
        {
            "job_id": [f"{policy}-{i}" for i in range(n_jobs)],
            "vc": rng.choice(np.array(["vc-a", "vc-b", "vc-c", None], dtype=object), n_jobs).tolist(),
            "num_gpus": rng.choice([1, 2, 4, 8, 16, 64], n_jobs),
            "submit_s": submit,
            "duration_s": duration,
            "start_s": start,
            "finish_s": finish,
            "jct_s": finish - submit,
            "queue_s": np.where(unfinished, np.nan, queue),
            "preemptions": rng.integers(0, 3, n_jobs),
        }
    )
    timeline = pl.DataFrame(
        {
            "time_s": np.sort(rng.uniform(0.0, 6 * 86400.0, n_events)),
            "busy_gpus": rng.integers(0, total_gpus + 1, n_events),
            "queued_jobs": rng.integers(0, 30, n_events),
            "running_jobs": rng.integers(0, 30, n_events),
        }
    )
    finished = finish[~unfinished]
    summary = {
        "policy": policy,
        "jobs": n_jobs,
        "finished": int((~unfinished).sum()),
        "avg_jct_s": float(np.mean(finished - submit[~unfinished])),
        "median_jct_s": 5400.0,
        "p95_jct_s": 7200.0 + seed,
        "p99_jct_s": 90000.0,
        "avg_queue_s": 30.0,
        "p95_queue_s": 600.0,
        "p99_queue_s": float("nan"),
        "gpu_util": 0.632,
        "makespan_s": 6 * 86400.0,
        "preemptions": 3,
        "wall_s": 1.5,
    }
    return SimResult(policy=policy, summary=summary, jobs=jobs, timeline=timeline, total_gpus=total_gpus)


class _TagChecker(HTMLParser):
    """Fails on a closing tag that does not match the innermost open one; counts what it saw."""

    VOID = frozenset({"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "source", "wbr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.seen: dict[str, int] = {}

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.seen[tag] = self.seen.get(tag, 0) + 1
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1:]}>"
        self.stack.pop()


def parse(text: str) -> _TagChecker:
    checker = _TagChecker()
    checker.feed(text)
    checker.close()
    assert checker.stack == [], f"unclosed tags: {checker.stack}"
    return checker


@pytest.fixture(scope="module")
def plotly_bundle() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def bundle_count(text: str, bundle: str) -> int:
    middle = len(bundle) // 2
    return text.count(bundle[middle : middle + 300])


def test_report_is_self_contained_and_well_formed(tmp_path: Path, plotly_bundle: str) -> None:
    results = [make_result(p, seed=i) for i, p in enumerate(POLICIES)]
    context = {"trace": "philly-sample.parquet", "cluster": "default (64 GPUs)", "jobs": "40", "options": "-"}

    out = write_sim_report(results, tmp_path / "sub" / "report.html", title="My <run>", context=context)

    assert out == tmp_path / "sub" / "report.html" and out.is_file()
    text = out.read_text(encoding="utf-8")
    assert bundle_count(text, plotly_bundle) == 1
    assert len(text.encode()) < len(plotly_bundle) + 1 * MB
    assert out.stat().st_size < 6 * MB
    checker = parse(text)
    assert checker.seen["html"] == 1 and checker.seen["title"] == 1
    assert "<title>My &lt;run&gt;</title>" in text
    for policy in POLICIES:
        assert f"<td>{policy}</td>" in text
    for value in context.values():
        assert value in text
    # 2 CDFs, 2 timelines, 2 per-VC bars, 2 per-size bars.
    assert text.count('class="plotly-graph-div"') == 8
    # Formatted summary: hours for large durations, a share as %, a NaN as a dash, best value marked.
    assert "90.0 min" in text and "25.0 h" in text and "63.2 %" in text and "—" in text
    assert '<td class="best">2.00 h</td>' in text  # p95 JCT 7200 s is the lowest of the three


def test_report_stays_small_for_large_runs(tmp_path: Path, plotly_bundle: str) -> None:
    results = [make_result(p, n_jobs=200_000, n_events=400_000, seed=i) for i, p in enumerate(POLICIES[:2])]
    out = write_sim_report(results, tmp_path / "big.html")
    text = out.read_text(encoding="utf-8")
    assert bundle_count(text, plotly_bundle) == 1
    # Everything but plotly.js: tables and downsampled figures, far below the raw data's size.
    assert len(text.encode()) - len(plotly_bundle) < 600 * 1024


def test_report_survives_unfinished_empty_and_duplicate_runs(tmp_path: Path) -> None:
    stuck = make_result("stuck", seed=4)
    stuck.jobs = stuck.jobs.with_columns(
        *(pl.lit(float("nan")).alias(c) for c in ("start_s", "finish_s", "jct_s", "queue_s"))
    )
    stuck.summary.update(finished=0, avg_jct_s=float("nan"))
    empty = SimResult(
        policy="empty",
        summary={"policy": "empty", "jobs": 0},
        jobs=pl.DataFrame(schema=dict.fromkeys(JOB_RESULT_COLUMNS, pl.Float64) | {"vc": pl.String}),
        timeline=pl.DataFrame(schema=dict.fromkeys(TIMELINE_COLUMNS, pl.Float64)),
        total_gpus=0,
    )
    again = make_result("stuck", seed=5)

    out = write_sim_report([stuck, empty, again], tmp_path / "r.html")

    text = out.read_text(encoding="utf-8")
    parse(text)
    assert "<td>stuck</td>" in text and "<td>empty</td>" in text and "<td>stuck (2)</td>" in text


def test_report_without_vc_skips_vc_section(tmp_path: Path) -> None:
    result = make_result("fifo")
    result.jobs = result.jobs.with_columns(pl.lit(None, dtype=pl.String).alias("vc"))
    text = write_sim_report([result], tmp_path / "r.html").read_text(encoding="utf-8")
    assert "Per virtual cluster" not in text and "Per job size" in text
    assert text.count('class="plotly-graph-div"') == 6


def test_report_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one"):
        write_sim_report([], tmp_path / "r.html")
    broken = make_result("fifo")
    broken.timeline = broken.timeline.drop("busy_gpus")
    with pytest.raises(ValueError, match="busy_gpus"):
        write_sim_report([broken], tmp_path / "r.html")


def test_import_is_light() -> None:
    code = "import sys, gpufleet.report; print(sorted(m for m in ('plotly', 'polars') if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]"


def test_utilisation_counts_loaned_gpus_as_capacity() -> None:
    """An Aryl run with 8 GPUs busy on loaned servers beyond a 16-GPU training pool stays at or below 100 %."""
    result = make_result("aryl", total_gpus=16)
    result.timeline = pl.DataFrame(
        {"time_s": [0.0, 10.0, 20.0], "busy_gpus": [8, 24, 16], "queued_jobs": [0, 0, 0], "loaned_gpus": [0, 8, 8]}
    )
    assert gpu_utilisation(result).tolist() == [0.5, 1.0, 16 / 24]
    plain = make_result("fifo", total_gpus=16)
    plain.timeline = result.timeline.drop("loaned_gpus")
    assert gpu_utilisation(plain).tolist() == [0.5, 1.5, 1.0]  # no loan column: the training pool alone
    plain.total_gpus = 0
    assert gpu_utilisation(plain) is None
