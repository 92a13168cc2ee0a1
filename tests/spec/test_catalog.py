"""The shipped GPU and NIC catalogs: completeness, datasheet sanity, lookups and their errors."""

from __future__ import annotations

import pytest

from gpufleet.errors import SpecError
from gpufleet.spec import GPUSpec, NICSpec, get_gpu, get_nic, gpu_catalog, gpu_names, nic_catalog, nic_names
from gpufleet.spec.catalog import read_catalog

REQUIRED_GPUS = ["v100", "t4", "a10", "l4", "a100-40g", "a100-80g", "h100", "h200", "h800"]
REQUIRED_NICS = ["ib-edr", "ib-hdr", "ib-ndr", "roce-100g", "roce-200g", "roce-400g", "eth-25g", "eth-100g"]
PCIE_ONLY = ["t4", "a10", "l4"]
NO_BF16 = ["v100", "t4"]


def test_required_gpus_present() -> None:
    assert set(REQUIRED_GPUS) <= set(gpu_names())


def test_required_nics_present() -> None:
    assert set(REQUIRED_NICS) <= set(nic_names())


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_gpu_numbers_positive(name: str) -> None:
    g = get_gpu(name)
    assert g.name == name
    for value in (g.dense_fp16_tflops, g.fp32_tflops, g.memory_gb, g.memory_bw_gbps, g.tdp_w):
        assert value > 0
    assert g.pcie_gen >= 3
    assert g.nvlink_gbps >= 0
    assert g.source
    # Tensor cores beat CUDA-core FP32 on every GPU in the catalog.
    assert g.mixed_precision_tflops > g.fp32_tflops


@pytest.mark.parametrize(
    ("name", "bf16", "fp32", "memory_gb", "bw", "nvlink"),
    [
        ("v100", None, 15.7, 32, 900, 300),
        ("t4", None, 8.1, 16, 320, 0),
        ("a10", 125, 31.2, 24, 600, 0),
        ("l4", 121, 30.3, 24, 300, 0),
        ("a100-40g", 312, 19.5, 40, 1555, 600),
        ("a100-80g", 312, 19.5, 80, 2039, 600),
        ("h100", 989, 67, 80, 3350, 900),
        ("h800", 989, 67, 80, 3350, 400),
        ("h200", 989, 67, 141, 4800, 900),
    ],
)
def test_gpu_datasheet_numbers(
    name: str, bf16: float | None, fp32: float, memory_gb: float, bw: float, nvlink: float
) -> None:
    g = get_gpu(name)
    assert g.dense_bf16_tflops == bf16
    assert g.fp32_tflops == pytest.approx(fp32)
    assert g.memory_gb == memory_gb
    assert g.memory_bw_gbps == bw
    assert g.nvlink_gbps == nvlink


def test_fp16_values_for_gpus_without_bf16() -> None:
    assert get_gpu("v100").dense_fp16_tflops == 125
    assert get_gpu("t4").dense_fp16_tflops == 65
    for name in NO_BF16:
        g = get_gpu(name)
        assert g.dense_bf16_tflops is None
        assert g.tf32_tflops is None
        assert g.mixed_precision_tflops == g.dense_fp16_tflops
        with pytest.raises(ValueError, match="bf16"):
            g.dense_tflops("bf16")


def test_tf32_dense_values() -> None:
    assert get_gpu("a100-80g").dense_tflops("tf32") == 156
    assert get_gpu("h100").dense_tflops("tf32") == pytest.approx(494.5)


def test_pcie_only_cards_have_no_nvlink() -> None:
    for name in PCIE_ONLY:
        assert get_gpu(name).nvlink_gbps == 0
        assert not get_gpu(name).has_nvlink
    assert get_gpu("h100").has_nvlink


def test_hopper_relations() -> None:
    h100, h800, h200, a100 = get_gpu("h100"), get_gpu("h800"), get_gpu("h200"), get_gpu("a100-80g")
    assert h800.nvlink_gbps < h100.nvlink_gbps
    assert h800.dense_bf16_tflops == h100.dense_bf16_tflops
    assert h100.dense_bf16_tflops > a100.dense_bf16_tflops
    assert h200.memory_gb > h100.memory_gb and h200.memory_bw_gbps > h100.memory_bw_gbps
    assert h200.dense_bf16_tflops == h100.dense_bf16_tflops


@pytest.mark.parametrize("name", REQUIRED_NICS)
def test_nic_numbers(name: str) -> None:
    n = get_nic(name)
    assert n.name == name
    assert n.gbps > 0 and n.latency_us > 0
    assert 0 < n.efficiency <= 1
    assert n.effective_gbps == pytest.approx(n.gbps * n.efficiency)
    assert n.effective_bytes_per_s == pytest.approx(n.effective_gbps * 1e9 / 8)


def test_nic_rates_and_kinds() -> None:
    rates = {
        "ib-edr": 100,
        "ib-hdr": 200,
        "ib-ndr": 400,
        "roce-100g": 100,
        "roce-200g": 200,
        "roce-400g": 400,
        "eth-25g": 25,
        "eth-100g": 100,
    }
    for name, gbps in rates.items():
        assert get_nic(name).gbps == gbps
    assert {get_nic(n).kind for n in REQUIRED_NICS} == {"infiniband", "roce", "ethernet"}


def test_nic_kind_ordering_of_latency_and_efficiency() -> None:
    by_kind: dict[str, list[NICSpec]] = {}
    for name in nic_names():
        nic = get_nic(name)
        by_kind.setdefault(nic.kind, []).append(nic)
    ib, roce, eth = by_kind["infiniband"], by_kind["roce"], by_kind["ethernet"]
    assert max(n.latency_us for n in ib) < min(n.latency_us for n in roce)
    assert max(n.latency_us for n in roce) < min(n.latency_us for n in eth)
    assert min(n.efficiency for n in ib) >= max(n.efficiency for n in roce)
    assert min(n.efficiency for n in roce) > max(n.efficiency for n in eth)


@pytest.mark.parametrize(
    ("spelling", "key"),
    [
        ("A100-80G", "a100-80g"),
        ("a100_80g", "a100-80g"),
        ("A100 80GB", "a100-80g"),
        ("NVIDIA A100-SXM4-80GB", "a100-80g"),
        ("Tesla V100-SXM2-32GB", "v100"),
        ("Tesla T4", "t4"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("H100-SXM", "h100"),
        ("  h800 ", "h800"),
        ("A10", "a10"),
    ],
)
def test_gpu_aliases(spelling: str, key: str) -> None:
    assert get_gpu(spelling).name == key
    assert spelling in gpu_catalog()


@pytest.mark.parametrize(
    ("spelling", "key"),
    [
        ("HDR", "ib-hdr"),
        ("IB_NDR", "ib-ndr"),
        ("RoCE-100G", "roce-100g"),
        ("25GbE", "eth-25g"),
        ("infiniband edr", "ib-edr"),
    ],
)
def test_nic_aliases(spelling: str, key: str) -> None:
    assert get_nic(spelling).name == key
    assert spelling in nic_catalog()


def test_a10_is_not_confused_with_a100() -> None:
    assert get_gpu("a10").name == "a10"
    with pytest.raises(SpecError):
        get_gpu("a100")


def test_unknown_gpu_suggests_closest() -> None:
    with pytest.raises(SpecError) as info:
        get_gpu("h1000")
    msg = str(info.value)
    assert "'h1000'" in msg
    assert "did you mean 'h100'?" in msg
    assert "a100-80g" in msg  # lists the valid names


def test_ambiguous_gpu_name_suggests_all_variants() -> None:
    with pytest.raises(SpecError, match=r"did you mean 'a100-40g' or 'a100-80g'\?"):
        get_gpu("A100")


def test_unknown_nic_suggests_closest() -> None:
    with pytest.raises(SpecError, match=r"unknown NIC 'ib-hdx' \(did you mean 'ib-hdr'\?\)"):
        get_nic("ib-hdx")


def test_unrelated_name_gets_no_suggestion_but_the_valid_list() -> None:
    with pytest.raises(SpecError) as info:
        get_gpu("rtx4090")
    assert "did you mean" not in str(info.value)
    assert "valid GPU names: " in str(info.value)


def test_non_string_name_is_a_spec_error() -> None:
    with pytest.raises(SpecError):
        get_gpu(100)  # type: ignore[arg-type]


def test_specs_are_frozen() -> None:
    g = get_gpu("h100")
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises ValidationError on frozen models
        g.memory_gb = 1  # type: ignore[misc]
    assert isinstance(g, GPUSpec)
    assert hash(g) == hash(get_gpu("H100"))


_GOOD_ENTRY = """
[[gpus]]
name = "x1"
display_name = "X1"
arch = "ampere"
aliases = {aliases}
dense_fp16_tflops = 10
fp32_tflops = 1
memory_gb = 8
memory_bw_gbps = 100
nvlink_gbps = 0
pcie_gen = 4
tdp_w = 100
source = "test"
"""


def test_catalog_rejects_alias_owned_by_two_entries() -> None:
    text = _GOOD_ENTRY.format(aliases='["shared"]') + _GOOD_ENTRY.replace('"x1"', '"x2"').format(aliases='["Shared"]')
    with pytest.raises(SpecError, match=r"fake\.toml: gpus\[1\]\.aliases: 'Shared' already names GPU 'x1'"):
        read_catalog("fake.toml", GPUSpec, "gpus", text=text)


def test_catalog_rejects_duplicate_names() -> None:
    text = _GOOD_ENTRY.format(aliases="[]") * 2
    with pytest.raises(SpecError, match=r"gpus\[1\]\.name: GPU 'x1' is defined twice"):
        read_catalog("fake.toml", GPUSpec, "gpus", text=text)


def test_catalog_entry_errors_name_the_entry_and_key() -> None:
    text = _GOOD_ENTRY.format(aliases="[]").replace("memory_gb = 8", 'memory_gb = "eight"')
    with pytest.raises(SpecError, match=r"^fake\.toml: gpus\[0\]\.memory_gb: expected a number"):
        read_catalog("fake.toml", GPUSpec, "gpus", text=text)


def test_catalog_reads_a_valid_file(tmp_path) -> None:
    path = tmp_path / "gpus.toml"
    path.write_text(_GOOD_ENTRY.format(aliases='["x-one"]'))
    cat = read_catalog(path, GPUSpec, "gpus")
    assert cat.names() == ["x1"]
    assert cat.get("X_ONE").name == "x1"
    assert len(cat) == 1
