"""`gpufleet health generate|evaluate|train|predict` in-process: JSON contracts, the report, one-line errors."""

from __future__ import annotations

import json

import polars as pl
import pytest
from cli_helpers import run_main
from typer.testing import CliRunner

from gpufleet import cli
from gpufleet.health.predictor import Predictor

runner = CliRunner()
SMALL = ["--window", "3d", "--horizon", "48h", "--budget", "0.02"]


def invoke(*args: str):
    res = runner.invoke(cli.app, list(args))
    assert res.exit_code == 0, (res.output, res.exception)
    return res


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    path = tmp_path_factory.mktemp("health_cli") / "fleet.parquet"
    invoke(
        "health", "generate", "-o", str(path), "--gpus", "128", "--days", "30", "--seed", "4", "--failure-scale", "80"
    )
    return path


@pytest.fixture(scope="module")
def model(fleet):
    path = fleet.with_name("model.pkl")
    invoke(
        "health",
        "train",
        str(fleet),
        "-o",
        str(path),
        "--model",
        "gbdt",
        "--train-span",
        "10d",
        "--calibrate",
        "5d",
        "--until",
        "20d",
        *SMALL,
    )
    return path


def test_generate_writes_telemetry_and_truth(fleet):
    frame = pl.read_parquet(fleet)
    truth = pl.read_parquet(fleet.with_name("fleet.failures.parquet"))
    assert frame.height == 128 * 30 * 24 and frame["gpu"].n_unique() == 128
    assert truth.height > 0 and set(truth.columns) >= {"gpu", "hour", "kind", "xid"}


def test_evaluate_json_and_report(fleet, tmp_path):
    report = tmp_path / "eval.html"
    res = invoke(
        "health",
        "evaluate",
        str(fleet),
        "--models",
        "gbdt",
        "--json",
        "--train-span",
        "14d",
        "--sliding",
        "14d",
        "--report",
        str(report),
        *SMALL,
    )
    payload = json.loads(res.stdout)
    assert set(payload) == {"failures", "models", "monthly"}
    assert payload["failures"] > 0
    assert [(m["model"], m["mode"]) for m in payload["models"]] == [("gbdt", "once"), ("gbdt", "sliding")]
    for m in payload["models"]:
        assert m["precision"] == pytest.approx(m["true_alerts"] / m["alerts"]) and 0 <= m["recall"] <= 1
    assert {m["month"] for m in payload["monthly"]} <= {"2024-03", "2024-04"}
    page = report.read_text()
    assert page.lstrip().lower().startswith("<!doctype html") and "gbdt" in page and "sliding" in page


def test_train_writes_a_loadable_model(model):
    pred = Predictor.load(model)
    assert pred.model_name == "gbdt" and pred.features.window_h == 72 and pred.budget == 0.02
    assert pred.trained["end_hour"] == 20 * 24 and pred.trained["source"].endswith("fleet.parquet")


def test_predict_json(model, fleet):
    res = runner.invoke(cli.app, ["health", "predict", str(model), str(fleet), "--top", "5", "--json"])
    assert res.exit_code == 0, (res.output, res.exception)
    rows = json.loads(res.stdout)
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["score"] for r in rows] == sorted((r["score"] for r in rows), reverse=True)
    assert set(rows[0]) == {"rank", "gpu", "node", "time", "score", "probability", "alert"}


def test_models_lists_builtins():
    res = invoke("health", "models")
    for name in ("gbdt", "parallel", "cascade"):
        assert name in res.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["health", "evaluate", "{fleet}", "--window", "7x"], "--window: cannot read '7x' as a duration"),
        (["health", "evaluate", "{missing}"], "no such telemetry file"),
        (["health", "predict", "{missing}", "{fleet}"], "no such model file"),
        (
            [
                "health",
                "train",
                "{fleet}",
                "--model",
                "nope",
                "--window",
                "3d",
                "--train-span",
                "10d",
                "--calibrate",
                "5d",
            ],
            "unknown failure model 'nope'",
        ),
    ],
)
def test_errors_are_one_line_exit_2(monkeypatch, capsys, fleet, tmp_path, args, needle):
    args = [a.format(fleet=fleet, missing=tmp_path / "missing.parquet") for a in args]
    code, _, err = run_main(monkeypatch, capsys, *args)
    assert code == 2
    assert needle in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1


_LABELS = 'UUID="GPU-{u}",pci_bus_id="00000000:{bus}:00.0",device="nvidia{g}",Hostname="node-1"'


def test_import_reads_scrapes_and_merges_kernel_xids(tmp_path):
    """A dcgm-exporter scrape with a broken line plus a kern.log bus drop -> the canonical hourly Parquet."""
    t0, t1 = 1714996800000, 1715000400000  # 2024-05-06 12:00 and 13:00 UTC
    a = _LABELS.format(u="aaa", bus="3B", g=0)
    b = _LABELS.format(u="bbb", bus="5E", g=1)
    (tmp_path / "s.prom").write_text(
        "\n".join(
            [
                "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
                f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",{a}}} 41 {t0}',
                f'DCGM_FI_DEV_GPU_TEMP{{gpu="1",{b}}} 44 {t0}',
                f'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{gpu="0",{a}}} 3 {t0}',
                f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",{a}}} 43 {t1}',
                'DCGM_FI_DEV_GPU_TEMP{gpu="1" broken',
            ]
        )
        + "\n"
    )
    (tmp_path / "kern.log").write_text(
        "2024-05-06T12:30:02.123456+00:00 node-1 kernel: NVRM: Xid "
        "(PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    )
    out = tmp_path / "t.parquet"
    res = invoke("health", "import", str(tmp_path / "s.prom"), "--xid", str(tmp_path / "kern.log"), "-o", str(out))
    said = " ".join(res.output.split())  # rich wraps long paths
    assert "1 malformed lines skipped" in said and "1 XID events merged" in said
    frame = pl.read_parquet(out).sort("uuid", "time")
    assert frame["uuid"].to_list() == ["GPU-aaa", "GPU-aaa", "GPU-bbb"]
    assert frame["DCGM_FI_DEV_GPU_TEMP"].to_list() == [41.0, 43.0, 44.0]
    # the bus drop lands on GPU-aaa (PCI 3b) in the 12:00 hour, nowhere else
    assert frame["DCGM_FI_DEV_XID_ERRORS"].to_list() == [79, 0, 0]
