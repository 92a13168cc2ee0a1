"""`gpufleet perf step|validate|calibrate|models` and `gpufleet plan`: JSON contracts, derived values, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_helpers import run_main
from typer.testing import CliRunner

from gpufleet import cli

runner = CliRunner()

STEP_KEYS = {
    "step_time_s",
    "mfu",
    "hfu",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "memory_gb_per_gpu",
    "breakdown",
    "layout",
    "gbs",
    "seq",
    "fits_in_memory",
}
GPT3 = ["--model", "gpt3-175b", "--gpu", "a100-80g"]


def invoke(*args: str) -> dict | list:
    """Run a command in-process and parse its JSON output."""
    res = runner.invoke(cli.app, list(args))
    assert res.exit_code == 0, (res.output, res.exception)
    return json.loads(res.stdout)


# ---------------------------------------------------------------------------------------------- perf step
def test_step_json_derives_dp():
    d = invoke("perf", "step", *GPT3, "--gpus", "1024", "--tp", "8", "--pp", "8", "--gbs", "1536", "--json")
    assert set(d) >= STEP_KEYS
    assert d["step_time_s"] > 0 and 0 < d["mfu"] <= d["hfu"] < 1
    assert d["layout"]["dp"] == 16 and d["gpus"] == 1024
    assert d["microbatches"] == 1536 / 16
    assert set(d["breakdown"]) >= {"compute", "tp_comm", "pp_bubble", "dp_comm_exposed"}
    assert sum(d["breakdown"].values()) == pytest.approx(d["step_time_s"])
    assert d["tokens_per_s"] == pytest.approx(1536 * 2048 / d["step_time_s"])
    assert d["memory_gb_per_gpu"] > 0 and d["fits_in_memory"]


def test_step_table_output_and_memory_warning():
    res = runner.invoke(cli.app, ["perf", "step", *GPT3, "--gpus", "1024", "--tp", "8", "--pp", "8", "--gbs", "1536"])
    assert res.exit_code == 0, res.output
    for needle in ("step time", "MFU", "tokens/s per GPU", "memory per GPU", "pipeline bubble", "% of step"):
        assert needle in res.stdout
    assert "does not fit" not in res.stdout
    # mbs 8 without recomputation keeps far more activations than 80 GB: estimated, with a warning
    res = runner.invoke(
        cli.app, ["perf", "step", *GPT3, "--gpus", "1024", "--tp", "8", "--pp", "8", "--gbs", "1536", "--mbs", "8"]
    )
    assert res.exit_code == 0, res.output
    assert "does not fit" in res.stdout


def test_step_explicit_shape_without_model():
    d = invoke(
        "perf",
        "step",
        "--layers",
        "24",
        "--hidden",
        "2048",
        "--heads",
        "16",
        "--vocab",
        "51200",
        "--seq",
        "2048",
        "--gpus",
        "16",
        "--tp",
        "2",
        "--gbs",
        "64",
        "--json",
    )
    assert d["layout"]["dp"] == 8
    assert d["params_b"] == pytest.approx(1.3, abs=0.05)
    assert d["step_time_s"] > 0


def test_step_model_from_a_file(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"name": "mine", "layers": 24, "hidden": 2048, "heads": 16, "vocab": 51200}))
    d = invoke("perf", "step", "--model", str(path), "--gpus", "8", "--tp", "2", "--gbs", "32", "--json")
    assert d["model"] == "mine" and d["layout"]["dp"] == 4


def test_step_shape_flags_override_the_catalog():
    base = invoke("perf", "step", *GPT3, "--gpus", "64", "--tp", "8", "--pp", "8", "--gbs", "64", "--json")
    short = invoke(
        "perf", "step", *GPT3, "--layers", "48", "--gpus", "64", "--tp", "8", "--pp", "8", "--gbs", "64", "--json"
    )
    assert short["params_b"] < base["params_b"]
    assert short["step_time_s"] < base["step_time_s"]


def test_gbs_tokens_binary_suffix():
    d = invoke(
        "perf",
        "step",
        "--model",
        "llama3-70b",
        "--gpus",
        "64",
        "--tp",
        "8",
        "--pp",
        "4",
        "--seq",
        "8192",
        "--gbs-tokens",
        "16M",
        "--json",
    )
    assert d["seq"] == 8192 and d["gbs"] == 2048


def test_compare_megascale_is_faster():
    d = invoke(
        "perf",
        "step",
        *GPT3,
        "--gpus",
        "1024",
        "--tp",
        "8",
        "--pp",
        "8",
        "--vp",
        "6",
        "--gbs",
        "768",
        "--compare-megascale",
        "--json",
    )
    assert d["megascale"]["options"]["tp_overlap"] and not d["baseline"]["options"]["tp_overlap"]
    assert d["speedup"] == pytest.approx(d["baseline"]["step_time_s"] / d["megascale"]["step_time_s"])
    assert d["speedup"] > 1


def test_options_reach_the_model():
    plain = invoke("perf", "step", *GPT3, "--gpus", "64", "--tp", "8", "--pp", "8", "--gbs", "64", "--json")
    causal = invoke(
        "perf",
        "step",
        *GPT3,
        "--gpus",
        "64",
        "--tp",
        "8",
        "--pp",
        "8",
        "--gbs",
        "64",
        "--causal-flops",
        "--zero",
        "0",
        "--no-flash",
        "--json",
    )
    assert causal["options"]["causal_flops"] and causal["options"]["zero"] == 0
    assert not causal["options"]["flash_attention"]
    assert causal["mfu"] < plain["mfu"]  # fewer counted FLOPs, and slower unfused attention
    assert causal["memory_gb_per_gpu"] > plain["memory_gb_per_gpu"]  # no optimizer sharding, attention scores kept


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        # TP=3 divides neither Llama 3 70B's 64 heads nor (times PP) the 64 GPUs: both reasons, one line
        (
            ["--model", "llama3-70b", "--gpus", "64", "--tp", "3", "--pp", "4", "--gbs", "64"],
            ["heads", "not a multiple of TP x PP x CP = 12"],
        ),
        # DP derives cleanly (96 / 12 = 8): the rule estimate_step enforces is the heads one
        (
            ["--model", "llama3-70b", "--gpus", "96", "--tp", "3", "--pp", "4", "--gbs", "64"],
            ["TP=3 does not divide the 64 attention heads"],
        ),
        (["--model", "gpt3-175b", "--gpus", "8", "--tp", "8", "--dp", "2", "--gbs", "8"], ["not the 8 GPUs"]),
        (
            ["--model", "gpt3-175", "--gpus", "8", "--gbs", "8"],
            ["unknown model 'gpt3-175'", "did you mean 'gpt3-175b'"],
        ),
        (["--model", "gpt3-175b", "--gpu", "a100-8", "--gpus", "8", "--gbs", "8"], ["unknown GPU", "a100-80g"]),
        (["--model", "gpt3-175b", "--gpus", "8", "--tp", "8"], ["--gbs", "--gbs-tokens"]),
        (["--model", "gpt3-175b", "--gpus", "8", "--tp", "8", "--gbs-tokens", "lots"], ["not a token count"]),
        (["--layers", "4", "--gpus", "8", "--gbs", "8"], ["missing --hidden, --heads, --vocab"]),
        (["--model", "gpt3-175b", "--gpus", "8", "--tp", "8", "--gbs", "8", "--precision", "fp8"], ["fp8"]),
    ],
)
def test_step_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, args, needles):
    code, _, stderr = run_main(monkeypatch, capsys, "perf", "step", *args)
    assert code == 2
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("error:")
    for needle in needles:
        assert needle in stderr
    assert "Traceback" not in stderr


# ---------------------------------------------------------------------------------------------- plan
def test_plan_json_top_layouts():
    d = invoke("plan", *GPT3, "--gpus", "1024", "--gbs", "1536", "--top", "3", "--json")
    assert len(d["layouts"]) == 3
    for row in d["layouts"]:
        assert row["tp"] * row["pp"] * row["dp"] * row["cp"] == 1024
        assert row["memory_gb"] <= 80
        assert 1536 % (row["dp"] * row["mbs"]) == 0
    times = [r["step_time_s"] for r in d["layouts"]]
    assert times == sorted(times) and [r["rank"] for r in d["layouts"]] == [1, 2, 3]
    assert d["searched"] > d["invalid"] + d["out_of_memory"]
    feasible = d["searched"] - d["invalid"] - d["out_of_memory"]
    assert sum(d["lost_to"].values()) == feasible - 1
    assert d["seconds"] >= 0


def test_plan_table_and_recompute_filter():
    res = runner.invoke(
        cli.app,
        ["plan", *GPT3, "--gpus", "1024", "--gbs", "1536", "--top", "4", "--recompute", "full", "--max-tp", "4"],
    )
    assert res.exit_code == 0, res.output
    assert "searched" in res.stdout and "broke a divisibility rule" in res.stdout
    assert "did not fit in memory" in res.stdout and "why the others lost" in res.stdout
    d = invoke(
        "plan", *GPT3, "--gpus", "1024", "--gbs", "1536", "--top", "4", "--recompute", "full", "--max-tp", "4", "--json"
    )
    assert {r["recompute"] for r in d["layouts"]} == {"full"}
    assert max(r["tp"] for r in d["layouts"]) <= 4


def test_plan_needs_gpus(monkeypatch, capsys):
    code, _, stderr = run_main(monkeypatch, capsys, "plan", "--model", "gpt3-175b", "--gbs", "1536")
    assert code == 2 and "--gpus is required" in stderr


def test_plan_on_a_cluster_pool(tmp_path):
    cluster = tmp_path / "c.toml"
    cluster.write_text(
        'name = "c"\n[[pools]]\nname = "t"\nkind = "training"\ngpu = "h100"\nnodes = 32\n'
        'nic = "ib-ndr"\nnics_per_node = 8\n'
    )
    d = invoke(
        "plan",
        "--model",
        "gpt3-175b",
        "--cluster",
        str(cluster),
        "--gpus",
        "256",
        "--gbs",
        "512",
        "--top",
        "2",
        "--json",
    )
    assert d["gpu"] == "h100" and len(d["layouts"]) == 2


_HETERO = """name = "mixed"
[[pools]]
name = "ib"
kind = "training"
gpu = "a100-80g"
nodes = 16
nic = "ib-hdr"
nics_per_node = 8
[[pools]]
name = "roce"
kind = "training"
gpu = "a100-80g"
nodes = 16
nic = "roce-200g"
nics_per_node = 8
"""


def test_plan_hetero_hook_without_the_module(tmp_path, monkeypatch, capsys):
    cluster = tmp_path / "mixed.toml"
    cluster.write_text(_HETERO)
    monkeypatch.setitem(sys.modules, "gpufleet.perf.hetero", None)  # as if the module did not exist yet
    code, _, stderr = run_main(
        monkeypatch, capsys, "plan", "--model", "gpt3-175b", "--cluster", str(cluster), "--gbs", "256"
    )
    assert code == 2
    assert "heterogeneous planning unavailable" in stderr
    # one pool of the same cluster is an ordinary homogeneous plan
    code, stdout, _ = run_main(
        monkeypatch,
        capsys,
        "plan",
        "--model",
        "gpt3-175b",
        "--cluster",
        str(cluster),
        "--pool",
        "roce",
        "--gpus",
        "128",
        "--gbs",
        "256",
        "--top",
        "2",
        "--json",
    )
    assert code == 0 and len(json.loads(stdout)["layouts"]) == 2


def test_plan_hetero_hook_calls_plan_hetero(tmp_path, monkeypatch):
    import types

    import polars as pl

    cluster = tmp_path / "mixed.toml"
    cluster.write_text(_HETERO)
    calls = []

    def plan_hetero(model, spec, gbs, seq, options, efficiency, top):
        calls.append((model.name, spec.name, gbs, seq, options.zero, efficiency, top))
        return types.SimpleNamespace(
            summary=pl.DataFrame({"placement": ["naive", "holmes"], "step_time_s": [2.0, 1.5]}),
            table=pl.DataFrame({"group": ["ib", "roce"], "stages": [5, 3]}),
        )

    monkeypatch.setitem(sys.modules, "gpufleet.perf.hetero", types.SimpleNamespace(plan_hetero=plan_hetero))
    res = runner.invoke(
        cli.app, ["plan", "--model", "gpt3-175b", "--cluster", str(cluster), "--gbs", "256", "--top", "4"]
    )
    assert res.exit_code == 0, res.output
    assert calls == [("gpt3-175b", "mixed", 256, 2048, 1, None, 4)]
    assert "holmes" in res.stdout and "roce" in res.stdout
    d = invoke("plan", "--model", "gpt3-175b", "--cluster", str(cluster), "--gbs-tokens", "1M", "--json")
    assert d["hetero"] and d["summary"][1]["placement"] == "holmes" and d["layouts"][0]["group"] == "ib"
    assert calls[-1][2] == 512


# ---------------------------------------------------------------------------------------------- validate, calibrate
def test_validate_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the shipped table is found from any directory
    out = tmp_path / "rows.csv"
    d = invoke("perf", "validate", "--json", "--csv", str(out))
    assert d["rows"] and all(r["error_pct"] >= 0 for r in d["rows"])
    assert {"case", "group", "split", "layout", "metric", "measured", "predicted"} <= set(d["rows"][0])
    subsets = {s["subset"]: s for s in d["summary"]}
    assert {"all rows", "calibration", "held-out"} <= set(subsets)
    assert subsets["all rows"]["rows"] == len(d["rows"])
    assert all(s["reason"] for s in d["skipped"])
    assert out.read_text().count("\n") == len(d["rows"]) + 1


def test_validate_per_stack_with_the_planner_beside_each_run():
    d = invoke("perf", "validate", "--stack", "fsdp", "--json")
    assert {r["stack"] for r in d["rows"]} == {"fsdp"}
    assert {r["row"] for r in d["planner"]} == {r["row"] for r in d["rows"]}
    assert all("memory_gb" in r and r["gpu_memory_gb"] > 0 for r in d["rows"])
    assert any(s["subset"] == "stack fsdp / held-out" for s in d["summary"])
    res = runner.invoke(cli.app, ["perf", "validate", "--stack", "hai-llm", "--no-planner"])
    assert res.exit_code == 0, res.output
    assert "no fitted constants" in res.stdout and "planner's best" not in res.stdout


def test_step_and_plan_take_a_stack_and_expert_parallelism():
    fsdp = invoke("perf", "step", *GPT3, "--gpus", "256", "--tp", "8", "--gbs", "512", "--stack", "fsdp", "--json")
    assert fsdp["options"]["zero"] == 3 and fsdp["options"]["stack"] == "fsdp"
    v3 = ["--model", "deepseek-v3", "--gpu", "h800", "--nic", "ib-ndr", "--precision", "fp8", "--gbs", "15360"]
    d = invoke("perf", "step", *v3, "--gpus", "2048", "--pp", "16", "--vp", "2", "--ep", "64", "--json")
    assert d["layout"]["ep"] == 64 and d["breakdown"]["ep_comm"] > 0
    plan = invoke("plan", *v3, "--gpus", "2048", "--max-ep", "8", "--top", "5", "--json")
    assert {row["ep"] for row in plan["layouts"]} <= {1, 2, 4, 8}


def test_validate_table_output():
    res = runner.invoke(cli.app, ["perf", "validate"])
    assert res.exit_code == 0, res.output
    for needle in ("held-out", "calibration", "absolute percentage error", "skipped"):
        assert needle in res.stdout


def test_calibrate_writes_a_loadable_file(tmp_path):
    from gpufleet.perf.efficiency import load_efficiency

    out = tmp_path / "eff.toml"
    res = runner.invoke(cli.app, ["perf", "calibrate", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "--efficiency" in res.stdout and "held-out" in res.stdout
    assert load_efficiency(out).compute["ampere"].gemm > 0
    d = invoke("perf", "validate", "--efficiency", str(out), "--json")
    assert d["efficiency"] == str(out)


def test_validate_missing_table_is_one_line(monkeypatch, capsys, tmp_path):
    code, _, stderr = run_main(monkeypatch, capsys, "perf", "validate", "--table", str(tmp_path / "none.csv"))
    assert code == 2 and "none.csv" in stderr and "Traceback" not in stderr


# ---------------------------------------------------------------------------------------------- models, import cost
def test_models_lists_the_catalog():
    res = runner.invoke(cli.app, ["perf", "models"])
    assert res.exit_code == 0, res.output
    assert "llama3-405b" in res.stdout and "gpt3-175b" in res.stdout
    rows = {r["name"]: r for r in invoke("perf", "models", "--json")}
    assert rows["llama3-405b"]["params_b"] == pytest.approx(405.9, abs=1.0)
    assert rows["llama3-405b"]["kv_heads"] == 8


def test_cli_import_stays_light():
    code = (
        "import sys, gpufleet.cli; heavy = [m for m in ('numpy', 'polars', 'scipy') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == ""


def test_step_recompute_modules_keep_less_and_unknown_ones_are_one_line_errors(monkeypatch, capsys):
    args = ["perf", "step", "--model", "deepseek-v3", "--gpu", "h100", "--nic", "ib-ndr", "--precision", "fp8"]
    args += ["--stack", "nemo", "--gpus", "1024", "--tp", "2", "--pp", "8", "--vp", "4", "--ep", "64", "--gbs", "8192"]
    args += ["--recompute", "selective"]
    plain = invoke(*args, "--json")
    lean = invoke(*args, "--recompute-module", "mla_up_proj", "--recompute-module", "mlp", "--json")
    assert lean["memory_gb_per_gpu"] < plain["memory_gb_per_gpu"] - 10.0
    assert lean["step_time_s"] == plain["step_time_s"]  # memory only
    code, _, stderr = run_main(monkeypatch, capsys, *args, "--recompute-module", "moe")
    assert code == 2 and "mla_up_proj" in stderr and "Traceback" not in stderr
