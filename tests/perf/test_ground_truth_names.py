"""A published table names catalog models the way its vendor spells them; perf validate still finds the model."""

from __future__ import annotations

import csv

import pytest

from gpufleet.perf.ground_truth import _catalog_name, default_ground_truth_path, read_cases
from gpufleet.perf.validate import predict_case


@pytest.mark.parametrize(
    ("written", "catalog"),
    [
        ("LLAMA3_70B", "llama3-70b"),  # Megatron-Bridge's performance summary
        ("LLAMA3.1_405B", "llama3-405b"),
        ("DeepSeekV3", "deepseek-v3"),
        ("Llama-2-13b-hf", "llama2-13b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3-8b"),
        ("GPT-3 175B", "gpt3-175b"),
        ("mpt_30b", "mpt-30b"),
        ("Llama 4 Maverick", "llama4-maverick"),
        ("Mixtral8x7B", "mixtral-8x7b"),
    ],
)
def test_vendor_spellings_find_the_catalog_model(written: str, catalog: str) -> None:
    assert _catalog_name(written) == catalog


def test_unknown_models_stay_unknown() -> None:
    assert _catalog_name("Qwen3-235B-A22B") is None
    assert _catalog_name("Nemotron-H 56B") is None


def test_a_vendor_spelled_row_without_shape_is_predicted(tmp_path) -> None:
    with default_ground_truth_path().open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        row = next(r for r in reader if r["model"] == "Llama3-70B" and r["split"] == "calibration")
    row = {**row, "model": "LLAMA3_70B", "split": ""}
    path = tmp_path / "vendor.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        writer.writerow(row)
    cases, skipped = read_cases(path)
    assert not skipped and cases and cases[0].model.name == "llama3-70b"


def _write(tmp_path, rows: list[dict[str, str]]):
    with default_ground_truth_path().open(newline="", encoding="utf-8") as fh:
        header = list(csv.DictReader(fh).fieldnames or [])
    path = tmp_path / "other.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in header})
    return path


def test_a_publication_without_rules_is_read_generically(tmp_path) -> None:
    base = {"seq": "8192", "gpu": "H100 80GB SXM", "gbs": "512", "precision": "bf16"}
    path = _write(
        tmp_path,
        [
            {
                **base,
                "src": "Some lab's 2026 training report, Table 3",
                "model": "Llama 3.1 8B",
                "n_gpus": "64",
                "tp": "1",
                "pp": "1",
                "reported": "9000 tok/s/GPU",
                "net": "InfiniBand NDR 400 Gb/s",
            },
            {
                **base,
                "src": "Another blog post",
                "model": "LLAMA3_70B",
                "n_gpus": "128",
                "dp": "128",
                "reported": "900 tok/s/GPU",
                "net": "RoCE 200G per GPU",
                "stack": "fsdp",
                "notes": "FSDP over all GPUs",
            },
        ],
    )
    cases, skipped = read_cases(path)
    assert not skipped and len(cases) == 2
    ib, roce = cases
    assert ib.system.nic.name == "ib-ndr" and ib.options.stack is None and ib.dp == 64
    assert len(ib.mbs) > 1 and ib.recompute == ("none", "selective")  # unpublished knobs are tuned
    assert roce.system.nic.name == "roce-200g" and roce.options.stack == "fsdp" and roce.options.zero == 3
    assert (roce.tp, roce.pp, roce.dp) == (1, 1, 128)  # pure data parallelism
    assert all(predict_case(c)["predicted"] > 0 for c in cases)


@pytest.mark.parametrize(
    ("written", "catalog"),
    [("A100-SXM4-40GB", "a100-40g"), ("A100 SXM4 40GB", "a100-40g"), ("A100-80GB SXM", "a100-80g"), ("V100", "v100")],
)
def test_gpu_spellings(written: str, catalog: str) -> None:
    from gpufleet.perf.ground_truth import _gpu

    assert _gpu({"gpu": written}).name == catalog
