"""The command line: JSON contract, reports, trace commands, and one-line errors on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from cli_helpers import gpufleet

REQUIRED_KEYS = {
    "policy",
    "jobs",
    "avg_jct_s",
    "p99_jct_s",
    "avg_queue_s",
    "p95_queue_s",
    "gpu_util",
    "makespan_s",
    "preemptions",
    "wall_s",
}


@pytest.fixture(scope="module")
def small_csv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "my_jobs.csv"
    rows = ["submission_time,duration,num_gpu"]
    rows += [f"{i * 60},{300 + (i * 37) % 900},{[1, 2, 4, 8][i % 4]}" for i in range(200)]
    rows += ["10,-5,1", "20,100,0", "oops,100,1"]  # bad rows: counted, reported, not fatal
    path.write_text("\n".join(rows) + "\n")
    return path


def test_simulate_json_with_column_mapping(small_csv):
    res = gpufleet(
        "simulate",
        "--trace",
        str(small_csv),
        "--columns",
        "submit=submission_time,duration=duration,gpus=num_gpu",
        "--gpus",
        "16",
        "--policy",
        "fifo,sjf",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [r["policy"] for r in rows] == ["fifo", "sjf"]
    for r in rows:
        assert set(r) >= REQUIRED_KEYS
        assert r["jobs"] == 200
        assert 0 < r["gpu_util"] <= 1


def test_simulate_covers_every_policy_placement_pair(small_csv):
    res = gpufleet(
        "simulate",
        "--trace",
        str(small_csv),
        "--columns",
        "submit=submission_time,duration=duration,gpus=num_gpu",
        "--gpus",
        "16",
        "--policy",
        "sjf,srtf",
        "--placement",
        "consolidate,spread",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [(r["policy"], r["placement"]) for r in rows] == [
        ("sjf", "consolidate"),
        ("sjf", "spread"),
        ("srtf", "consolidate"),
        ("srtf", "spread"),
    ]
    table = gpufleet(
        "simulate",
        "--trace",
        str(small_csv),
        "--columns",
        "submit=submission_time,duration=duration,gpus=num_gpu",
        "--gpus",
        "16",
        "--policy",
        "srtf",
        "--placement",
        "consolidate,spread",
    )
    assert table.returncode == 0, table.stderr
    assert "srtf+spread: 200 jobs finished" in table.stderr


def test_simulate_report_and_jobs_out(tmp_path):
    report, jobs_out = tmp_path / "out.html", tmp_path / "jobs.parquet"
    res = gpufleet(
        "simulate",
        "--vc",
        "ee9e8c",
        "--policy",
        "fifo,tiresias",
        "--report",
        str(report),
        "--jobs-out",
        str(jobs_out),
        "--breakdown",
        "size",
    )
    assert res.returncode == 0, res.stderr
    assert "tiresias" in res.stdout and "by size" in res.stdout
    html = report.read_text()
    assert "fifo" in html and "tiresias" in html
    frame = pl.read_parquet(jobs_out)
    assert set(frame["policy"].unique()) == {"fifo", "tiresias"}
    assert frame.height == 2 * 1511


def test_traces_info_and_convert_round_trip(tmp_path):
    res = gpufleet("traces", "info", "philly", "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["jobs"] == info["rows_read"] == 82_247
    assert info["jobs_by_gpus"]["128"] == 3
    out = tmp_path / "jobs.parquet"
    res = gpufleet("traces", "convert", "philly", "--vc", "ee9e8c", "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert pl.read_parquet(out).height == 1511
    res = gpufleet("simulate", "--trace", str(out), "--policy", "sjf", "--json")
    assert json.loads(res.stdout)[0]["jobs"] == 1511


def test_traces_generate(tmp_path):
    out = tmp_path / "syn.parquet"
    res = gpufleet("traces", "generate", "-n", "5000", "--gpus", "1000", "--load", "0.7", "-o", str(out))
    assert res.returncode == 0, res.stderr
    frame = pl.read_parquet(out)
    assert frame.height == 5000
    # a trace asked to load a cluster follows Philly's hour-of-week arrivals unless told otherwise
    from gpufleet.traces import generate_jobs

    fitted = generate_jobs(5000, seed=0, arrival="fitted", target_busy_gpus=700.0)
    assert frame["submit_s"].to_list() == fitted["submit_s"].to_list()
    flat = tmp_path / "flat.parquet"
    res = gpufleet("traces", "generate", "-n", "5000", "--gpus", "1000", "--arrival", "poisson", "-o", str(flat))
    assert res.returncode == 0, res.stderr
    assert pl.read_parquet(flat)["submit_s"].to_list() != fitted["submit_s"].to_list()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["simulate", "--policy", "fifoo"], "Did you mean 'fifo'"),
        (["simulate", "--cluster", "/no/such/cluster.toml"], "cluster.toml"),
        (["simulate", "--trace", "/no/such/jobs.csv"], "jobs.csv"),
        (["simulate", "--opt", "las.nope=1", "--policy", "las"], "no option nope"),
        (["simulate", "--placement", "diagonal"], "placement"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    res = gpufleet(*args)
    assert res.returncode == 2
    assert needle in res.stderr
    assert "Traceback" not in res.stderr


def test_bad_cluster_file_names_the_key(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text('name = "x"\n[[pools]]\nname = "t"\nkind = "training"\ngpu = "v100"\nnodes = "many"\n')
    res = gpufleet("simulate", "--cluster", str(bad))
    assert res.returncode == 2
    assert "pools[0].nodes" in res.stderr


def test_help_lists_commands():
    res = gpufleet("--help")
    assert res.returncode == 0
    for cmd in ("simulate", "traces", "policies"):
        assert cmd in res.stdout


def test_simulate_load_sizes_the_cluster_to_the_trace(small_csv):
    from gpufleet.spec import load_cluster
    from gpufleet.traces import load_trace
    from gpufleet.traces.info import gpus_for_load

    cols = "submit=submission_time,duration=duration,gpus=num_gpu"
    mapping = dict(pair.split("=") for pair in cols.split(","))
    jobs = load_trace(str(small_csv), columns=mapping).jobs
    expected = load_cluster(None).resized(gpus_for_load(jobs, 0.9)).total_gpus()
    res = gpufleet("simulate", "--trace", str(small_csv), "--columns", cols, "--load", "0.9", "--policy", "fifo")
    assert res.returncode == 0, res.stderr
    assert f"({expected:,} training GPUs)" in res.stderr
    both = gpufleet("simulate", "--trace", str(small_csv), "--columns", cols, "--load", "0.9", "--gpus", "8")
    assert both.returncode != 0 and "--load or --gpus" in both.stderr
    bad = gpufleet("simulate", "--trace", str(small_csv), "--columns", cols, "--load", "0")
    assert bad.returncode != 0 and "--load must be above 0" in bad.stderr
