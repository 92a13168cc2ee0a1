"""CLI: simulate --network, sched train-rl / eval-rl, traces mix."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_main

from gpufleet.sched.policy import make_policy

pytest.importorskip("stable_baselines3")


@pytest.fixture(scope="module")
def heavy_mix(tmp_path_factory):
    from gpufleet.sim.mixes import generate_mix

    path = tmp_path_factory.mktemp("mix") / "heavy.parquet"
    generate_mix("heavy", jobs=48, seed=3).write_parquet(path)
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from gpufleet.sim.rl_train import MixSampler, train_rl
    from gpufleet.spec import load_cluster

    out = tmp_path_factory.mktemp("rl") / "tiny.zip"
    train_rl(load_cluster("deepshare-testbed"), out, steps=1024, seed=0, sampler=MixSampler(jobs=24), progress=False)
    return out


def test_simulate_network_reports_contention(monkeypatch, capsys, heavy_mix, tiny_model) -> None:
    code, out, _ = run_main(
        monkeypatch,
        capsys,
        "simulate",
        "--trace",
        str(heavy_mix),
        "--cluster",
        "deepshare-testbed",
        "--network",
        "--policy",
        f"srtf,contention,random,srtf-spread,rl:{tiny_model}",
        "--json",
    )
    assert code == 0
    rows = {r["policy"]: r for r in json.loads(out)}
    assert set(rows) == {"srtf", "contention", "random", "srtf-spread", "rl"}
    assert all(r["finished"] == 48 for r in rows.values())
    assert rows["srtf-spread"]["contention_gpu_h"] > rows["contention"]["contention_gpu_h"]
    assert rows["srtf-spread"]["multi_node_share"] > 0.9


def test_network_policies_need_network(monkeypatch, capsys, heavy_mix) -> None:
    code, _, err = run_main(monkeypatch, capsys, "simulate", "--trace", str(heavy_mix), "--policy", "contention")
    assert code == 2
    assert "--network" in err


def test_simulate_network_maps_model_names_and_comm_mix(monkeypatch, capsys, tmp_path) -> None:
    csv = tmp_path / "jobs.csv"
    csv.write_text(
        "id,submit,duration,gpus,model_name\n1,0,3600,16,gpt3-1.3b\n2,10,3600,16,resnet50\n"
        "3,20,600,1,\n4,30,1800,8,mixtral-8x7b\n"
    )
    code, out, _ = run_main(
        monkeypatch,
        capsys,
        "simulate",
        "--trace",
        str(csv),
        "--columns",
        "job_id=id,submit=submit,duration=duration,gpus=gpus,model=model_name",
        "--network",
        "--gpus",
        "16",
        "--policy",
        "srtf",
        "--comm-mix",
        "FSDP=1",
        "--json",
    )
    assert code == 0
    row = json.loads(out)[0]
    assert row["finished"] == 4 and "contention_gpu_h" in row


def test_rl_with_missing_model_is_one_line(monkeypatch, capsys, heavy_mix, tmp_path) -> None:
    code, _, err = run_main(
        monkeypatch,
        capsys,
        "simulate",
        "--trace",
        str(heavy_mix),
        "--network",
        "--policy",
        f"rl:{tmp_path / 'nope.zip'}",
    )
    assert code == 2
    assert "not found" in err and "Traceback" not in err


def test_train_rl_writes_a_model_and_resumes(monkeypatch, capsys, tmp_path) -> None:
    out = tmp_path / "m.zip"
    code, text, _ = run_main(
        monkeypatch,
        capsys,
        "sched",
        "train-rl",
        "-o",
        str(out),
        "--steps",
        "1024",
        "--jobs",
        "16",
        "--checkpoint-every",
        "1024",
        "--json",
    )
    assert code == 0 and out.is_file()
    summary = json.loads(text)
    assert summary["steps"] == 1024 and summary["resumed_from"] == 0
    code, text, _ = run_main(
        monkeypatch,
        capsys,
        "sched",
        "train-rl",
        "-o",
        str(out),
        "--steps",
        "2048",
        "--jobs",
        "16",
        "--checkpoint-every",
        "1024",
        "--json",
    )
    assert json.loads(text)["resumed_from"] == 1024


def test_train_rl_takes_the_order_jobs_are_offered_in(monkeypatch, capsys, tmp_path) -> None:
    out = tmp_path / "o.zip"
    code, text, _ = run_main(
        monkeypatch,
        capsys,
        "sched",
        "train-rl",
        "-o",
        str(out),
        "--steps",
        "1024",
        "--jobs",
        "16",
        "--order",
        "srsf",
        "--json",
    )
    assert code == 0 and json.loads(text)["order"] == "srsf"
    code, _, err = run_main(monkeypatch, capsys, "sched", "train-rl", "-o", str(out), "--order", "biggest")
    assert code == 2 and "srsf" in err


def test_eval_rl_compares_on_unseen_seeds(monkeypatch, capsys, tiny_model) -> None:
    code, text, _ = run_main(
        monkeypatch,
        capsys,
        "sched",
        "eval-rl",
        str(tiny_model),
        "--seeds",
        "2",
        "--jobs",
        "32",
        "--policies",
        "las,srtf,contention,rl",
        "--json",
    )
    assert code == 0
    data = json.loads(text)
    assert data["best_baseline"] in ("las", "srtf")
    assert {r["policy"] for r in data["policies"]} == {"las", "srtf", "contention", "rl"}
    assert {r["seed"] for r in data["runs"]} == {0, 1}


def test_eval_rl_unknown_cluster_is_a_clear_error(monkeypatch, capsys) -> None:
    code, _, err = run_main(monkeypatch, capsys, "sched", "eval-rl", "--cluster", "nowhere")
    assert code == 2
    assert "deepshare-testbed" in err


def test_shipped_model_runs_by_default(monkeypatch, capsys, heavy_mix) -> None:
    from gpufleet.sched.rl import default_model_path

    assert default_model_path().is_file(), "the wheel ships a trained rl model"
    meta = json.loads(default_model_path().with_suffix(".json").read_text())
    assert meta["steps"] >= 50_000 and "train-rl" in meta["command"]
    assert meta["order"] == make_policy("rl").opts["order"]  # used in the order it was trained and selected in
    code, out, _ = run_main(
        monkeypatch,
        capsys,
        "simulate",
        "--trace",
        str(heavy_mix),
        "--cluster",
        "deepshare-testbed",
        "--network",
        "--policy",
        "random,rl",
        "--json",
    )
    assert code == 0
    rows = {r["policy"]: r for r in json.loads(out)}
    assert rows["rl"]["finished"] == 48
    assert rows["rl"]["avg_jct_s"] < rows["random"]["avg_jct_s"]  # the shipped model learned something


def test_train_rl_on_a_users_trace(monkeypatch, capsys, tmp_path) -> None:
    rows = ["id,submit,duration,gpus,model_name"]
    names = ["gpt3-1.3b", "resnet50", "mixtral-8x7b", "dlrm", "", "graphsage"]
    for i in range(60):
        rows.append(f"{i},{i * 120},{1800 + 60 * (i % 7)},{(2, 4, 8)[i % 3]},{names[i % len(names)]}")
    csv = tmp_path / "jobs.csv"
    csv.write_text("\n".join(rows) + "\n")
    out = tmp_path / "t.zip"
    code, text, err = run_main(
        monkeypatch,
        capsys,
        "sched",
        "train-rl",
        "-o",
        str(out),
        "--trace",
        str(csv),
        "--columns",
        "job_id=id,submit=submit,duration=duration,gpus=gpus,model=model_name",
        "--steps",
        "1024",
        "--jobs",
        "24",
        "--sizes",
        "1",
        "--json",
    )
    assert code == 0, err
    assert out.is_file() and json.loads(text)["steps"] == 1024
