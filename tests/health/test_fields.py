"""The DCGM field catalog: ids from dcgm_fields.h, legacy names canonical, aliases mapped, helpful errors."""

from __future__ import annotations

import pytest

from gpufleet.errors import HealthError
from gpufleet.health import fields as F

# (legacy name, id) pairs from diagnosis.md §3.1 and the brief, as in DCGM's dcgm_fields.h.
EXPECTED_IDS = {
    "DCGM_FI_DEV_SM_CLOCK": 100,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 112,
    "DCGM_FI_DEV_MEMORY_TEMP": 140,
    "DCGM_FI_DEV_GPU_TEMP": 150,
    "DCGM_FI_DEV_POWER_USAGE": 155,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 156,
    "DCGM_FI_DEV_SLOWDOWN_TEMP": 158,
    "DCGM_FI_DEV_SHUTDOWN_TEMP": 159,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 202,
    "DCGM_FI_DEV_GPU_UTIL": 203,
    "DCGM_FI_DEV_XID_ERRORS": 230,
    "DCGM_FI_DEV_PCIE_LINK_GEN": 237,
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": 238,
    "DCGM_FI_DEV_POWER_VIOLATION": 240,
    "DCGM_FI_DEV_THERMAL_VIOLATION": 241,
    "DCGM_FI_DEV_FB_USED": 252,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 310,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 311,
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 312,
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 313,
    "DCGM_FI_DEV_THRESHOLD_SRM": 346,
    "DCGM_FI_DEV_DIAG_MEMORY_RESULT": 350,
    "DCGM_FI_DEV_DIAG_NCCL_TESTS_RESULT": 363,
    "DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_MAX": 385,
    "DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_NONE": 389,
    "DCGM_FI_DEV_RETIRED_SBE": 390,
    "DCGM_FI_DEV_RETIRED_DBE": 391,
    "DCGM_FI_DEV_RETIRED_PENDING": 392,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 393,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 394,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 395,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": 396,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 409,
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 419,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 429,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 439,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 449,
    "DCGM_FI_DEV_GPU_NVLINK_ERRORS": 450,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 1001,
    "DCGM_FI_PROF_SM_ACTIVE": 1002,
    "DCGM_FI_PROF_SM_OCCUPANCY": 1003,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 1004,
    "DCGM_FI_PROF_DRAM_ACTIVE": 1005,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 1009,
    "DCGM_FI_PROF_PCIE_RX_BYTES": 1010,
    "DCGM_FI_PROF_NVLINK_TX_BYTES": 1011,
    "DCGM_FI_PROF_NVLINK_RX_BYTES": 1012,
}


@pytest.mark.parametrize(("name", "id_"), sorted(EXPECTED_IDS.items()))
def test_catalog_ids_match_dcgm_fields_h(name: str, id_: int) -> None:
    assert F.field(name).id == id_
    assert F.field(id_).name == name


def test_every_diag_result_field_350_to_363_is_present() -> None:
    assert {f.id for f in F.FIELDS if 350 <= f.id <= 363} == set(range(350, 364))


@pytest.mark.parametrize(
    ("alias", "legacy"),
    [
        ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "DCGM_FI_DEV_GPU_TEMP"),
        ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", "DCGM_FI_DEV_MEMORY_TEMP"),
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
        ("DCGM_FI_DEV_XID_ERROR", "DCGM_FI_DEV_XID_ERRORS"),
        ("DCGM_FI_DEV_BOARD_POWER_WATTS", "DCGM_FI_DEV_POWER_USAGE"),
        ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
        ("DCGM_FI_DEV_ROW_REMAP_FAILED", "DCGM_FI_DEV_ROW_REMAP_FAILURE"),
        ("DCGM_FI_DEV_PAGE_RETIRED_PENDING", "DCGM_FI_DEV_RETIRED_PENDING"),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
        ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
        ("DCGM_FI_DEV_SRAM_EXCEEDED", "DCGM_FI_DEV_THRESHOLD_SRM"),
    ],
)
def test_newer_names_are_aliases_of_the_legacy_name(alias: str, legacy: str) -> None:
    assert F.canonical_name(alias) == legacy
    assert F.field(alias).name == legacy
    assert alias in F.field(legacy).aliases


def test_canonical_name_is_case_insensitive_and_none_for_unknown() -> None:
    assert F.canonical_name("dcgm_fi_dev_gpu_temp") == "DCGM_FI_DEV_GPU_TEMP"
    assert F.canonical_name(" DCGM_FI_DEV_FB_USED ") == "DCGM_FI_DEV_FB_USED"
    assert F.canonical_name("DCGM_FI_DEV_SOMETHING_NEW") is None
    assert F.canonical_name("node_load1") is None


def test_kinds_and_integer_fields() -> None:
    assert F.field("DCGM_FI_DEV_GPU_TEMP").kind == "gauge"
    assert F.field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL").kind == "counter"
    assert F.field("DCGM_FI_DEV_CLOCKS_EVENT_REASONS").kind == "bitmask"
    assert F.field("DCGM_FI_DEV_XID_ERRORS").kind == "xid"
    assert {f.name for f in F.FIELDS if f.is_integer} == {
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_GPU_NVLINK_ERRORS",
    }
    assert all(f.kind in F.KINDS for f in F.FIELDS)
    assert [f.name for f in F.fields_of_kind("xid")] == ["DCGM_FI_DEV_XID_ERRORS"]


def test_catalog_is_ordered_by_id_without_duplicates() -> None:
    ids = [f.id for f in F.FIELDS]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    names = [n for f in F.FIELDS for n in (f.name, *f.aliases)]
    assert len(set(names)) == len(names)


def test_unknown_name_raises_with_did_you_mean() -> None:
    with pytest.raises(
        HealthError,
        match=r"unknown DCGM field 'DCGM_FI_DEV_GPU_TEMPERATURE'.*did you mean "
        r"DCGM_FI_DEV_GPU_TEMP",
    ):
        F.field("DCGM_FI_DEV_GPU_TEMPERATURE")


def test_unknown_name_without_close_match_points_at_the_catalog() -> None:
    with pytest.raises(HealthError, match=r"unknown DCGM field 'zzz'; see gpufleet/data/health/dcgm_fields.csv"):
        F.field("zzz")


def test_unknown_id_raises() -> None:
    with pytest.raises(HealthError, match="unknown DCGM field id 9999"):
        F.field(9999)
    assert F.field("150").name == "DCGM_FI_DEV_GPU_TEMP"


def test_unknown_kind_raises() -> None:
    with pytest.raises(HealthError, match="unknown field kind 'histogram'"):
        F.fields_of_kind("histogram")


def test_clock_event_reason_bits() -> None:
    R = F.ClockEventReason
    assert [
        int(b)
        for b in (
            R.GPU_IDLE,
            R.CLOCKS_SETTING,
            R.SW_POWER_CAP,
            R.HW_SLOWDOWN,
            R.SYNC_BOOST,
            R.SW_THERMAL,
            R.HW_THERMAL,
            R.HW_POWER_BRAKE,
        )
    ] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert int(F.HW_CLOCK_EVENTS) == 0x8 | 0x40 | 0x80
    assert R(0x48) == R.HW_SLOWDOWN | R.HW_THERMAL
    assert R.HW_THERMAL in R(0x41)


def test_invalid_catalog_row_names_the_line() -> None:
    text = "id,name,kind,unit,aliases,help\n150,DCGM_FI_DEV_GPU_TEMP,gauge,C,,ok\nxx,DCGM_FI_BAD,gauge,,,bad id\n"
    with pytest.raises(HealthError, match=r"catalog\.csv line 3: invalid field entry"):
        F._parse_catalog(text, "catalog.csv")
    bad_kind = "id,name,kind,unit,aliases,help\n1,DCGM_FI_X,histogram,,,\n"
    with pytest.raises(HealthError, match=r"line 2.*kind 'histogram'"):
        F._parse_catalog(bad_kind, "catalog.csv")
