"""XID catalog severities and the kernel-log parser on real dmesg / journalctl / syslog line formats."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from gpufleet.errors import HealthError
from gpufleet.health import xid as X

# Real driver messages (NVIDIA XID documentation, gpud and public incident reports).
DMESG = """\
[    4.123456] nvidia: loading out-of-tree module taints kernel.
[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
[ 1234.600001] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.
[ 3947.590120] NVRM: Xid (PCI:0000:61:00): 119, pid=123417, name=nv-hostengine, Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 10 (FREE) (0xc0000005 0x0).
[ 3959.592099] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:61:00 (printing 1 of every 30).  The GPU likely needs to be reset.
"""  # noqa: E501

DMESG_T = """\
[Mon May  6 12:01:02 2024] NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.
[Mon May  6 12:01:02 2024] NVRM: Xid (PCI:0000:3b:00): 45, pid=2187734, name=python, Ch 00000010
[Tue May 14 03:14:22 2024] NVRM: Xid (PCI:0000:1b:00): 94, pid=12833, name=python3, Contained: CE User Channel (0x9). RST: No, D-RST: No
"""  # noqa: E501

JOURNAL = """\
2024-05-06T12:01:02.123456+00:00 node-7 kernel: NVRM: Xid (PCI:0000:b3:00): 119, pid=452531, name=cache_mgr_main, Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20809004 0x608).
2024-05-06T14:30:00+0200 node-7 kernel: NVRM: Xid (PCI:0000:b3:00): 95, pid=7062, name=python3, Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No
2024-05-06T12:45:00Z node-8 kernel: [ 5000.25] NVRM: Xid (PCI:0000:3b:00 GPU-I:00 GPU-CI:00): 63, pid=12345, name=python, Row Remapper: New row marked for remapping, reset gpu to activate.
2024-05-06T12:46:00Z node-8 systemd[1]: Started Session 4 of user root.
"""  # noqa: E501

SYSLOG = """\
May 19 07:08:57 ip-26-0-146-100 kernel: [680111.646286] NVRM: Xid (PCI:0000:10:1c): 63, pid=1850, Row Remapper: New row marked for remapping, reset gpu to activate
Aug 10 15:36:05 gpu-node-a kernel: NVRM: Xid (PCI:0000:55:00): 48, pid=2187734, name=python, channel 0x00000002
Aug 10 15:36:05 gpu-node-a kernel: NVRM: Xid (PCI:0000:55:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)
"""  # noqa: E501


def _rows(log: X.XidLog) -> list[dict]:
    return log.events.to_dicts()


def test_plain_dmesg_gives_uptime_code_pci_pid_and_message() -> None:
    log = X.parse_kernel_log(DMESG, host="node-3")
    assert log.lines == 5 and log.malformed == 0
    rows = _rows(log)
    assert [(r["code"], r["pci"]) for r in rows] == [(79, "0000:3b:00"), (119, "0000:61:00")]
    first = rows[0]
    assert first["uptime_s"] == pytest.approx(1234.56789)
    assert first["time"] is None
    assert first["pid"] == 1234
    assert first["host"] == "node-3"
    assert first["message"] == "GPU has fallen off the bus."
    assert first["line"] == 2
    assert rows[1]["line"] == 4
    assert rows[1]["message"].startswith("Timeout after 6s of waiting for RPC response from GPU0 GSP!")


def test_dmesg_t_wall_clock_and_unknown_pid() -> None:
    log = X.parse_kernel_log(DMESG_T, host="node-1")
    rows = _rows(log)
    assert [r["code"] for r in rows] == [48, 45, 94]
    assert rows[0]["time"] == datetime(2024, 5, 6, 12, 1, 2, tzinfo=UTC)
    assert rows[0]["pid"] is None
    assert rows[0]["message"].startswith("An uncorrectable double bit error (DBE) has been detected on GPU")
    assert rows[0]["uptime_s"] is None
    assert rows[2]["time"] == datetime(2024, 5, 14, 3, 14, 22, tzinfo=UTC)
    assert rows[2]["pci"] == "0000:1b:00"
    assert rows[2]["message"] == "Contained: CE User Channel (0x9). RST: No, D-RST: No"


def test_dmesg_t_local_time_zone() -> None:
    log = X.parse_kernel_log(DMESG_T.splitlines()[:1], tz="Europe/Berlin")
    assert log.events["time"][0] == datetime(2024, 5, 6, 10, 1, 2, tzinfo=UTC)  # CEST is UTC+2


def test_journal_iso_lines_carry_host_offsets_and_mig_suffix() -> None:
    log = X.parse_kernel_log(JOURNAL, host="ignored-when-the-line-has-one")
    rows = _rows(log)
    assert [(r["host"], r["pci"], r["code"]) for r in rows] == [
        ("node-7", "0000:b3:00", 119),
        ("node-7", "0000:b3:00", 95),
        ("node-8", "0000:3b:00", 63),
    ]
    assert rows[0]["time"] == datetime(2024, 5, 6, 12, 1, 2, 123000, tzinfo=UTC)
    assert rows[1]["time"] == datetime(2024, 5, 6, 12, 30, tzinfo=UTC)  # +0200 converted to UTC
    assert rows[2]["time"] == datetime(2024, 5, 6, 12, 45, tzinfo=UTC)
    assert rows[2]["uptime_s"] == pytest.approx(5000.25)
    assert rows[0]["pid"] == 452531
    assert log.malformed == 0 and log.lines == 4


def test_syslog_uses_the_year_argument() -> None:
    log = X.parse_kernel_log(SYSLOG, year=2023)
    rows = _rows(log)
    assert [(r["host"], r["code"], r["pci"]) for r in rows] == [
        ("ip-26-0-146-100", 63, "0000:10:1c"),
        ("gpu-node-a", 48, "0000:55:00"),
        ("gpu-node-a", 154, "0000:55:00"),
    ]
    assert rows[0]["time"] == datetime(2023, 5, 19, 7, 8, 57, tzinfo=UTC)
    assert rows[0]["uptime_s"] == pytest.approx(680111.646286)
    assert rows[0]["message"] == "Row Remapper: New row marked for remapping, reset gpu to activate"
    assert rows[1]["time"] == datetime(2023, 8, 10, 15, 36, 5, tzinfo=UTC)
    assert rows[2]["pid"] is None
    assert rows[2]["message"].startswith("GPU recovery action changed from 0x0 (None)")


def test_syslog_year_defaults_to_this_year_and_rolls_over_at_new_year() -> None:
    lines = [
        "Dec 31 23:59:58 node-1 kernel: NVRM: Xid (PCI:0000:3b:00): 92, pid=1, name=x, High single-bit ECC error rate",
        "Jan  1 00:00:03 node-1 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE",
    ]
    log = X.parse_kernel_log(lines, year=2023)
    assert log.events["time"].to_list() == [
        datetime(2023, 12, 31, 23, 59, 58, tzinfo=UTC),
        datetime(2024, 1, 1, 0, 0, 3, tzinfo=UTC),
    ]
    this_year = X.parse_kernel_log(lines[:1]).events["time"][0].year
    assert this_year == datetime.now(UTC).year


def test_malformed_lines_are_counted_with_line_numbers_and_others_ignored() -> None:
    text = "\n".join(
        [
            "[ 10.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=77, name=python, Graphics Exception",
            "[ 11.0] NVRM: Xid (PCI:0000:3b",  # truncated line
            "[ 12.0] NVRM: RmInitAdapter failed! (0x22:0x38:776)",  # NVRM but not an Xid: ignored
            "[ 13.0] NVRM: Xid error: xyz, invalid data",
            "[Mon Foo 99 12:01:02 2024] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, MMU Fault",  # bad stamp
            "plain line",
        ]
    )
    log = X.parse_kernel_log(text)
    assert log.lines == 6
    assert log.events["code"].to_list() == [13]
    assert log.malformed == 3
    assert log.malformed_examples == [
        "<text> line 2: [ 11.0] NVRM: Xid (PCI:0000:3b",
        "<text> line 4: [ 13.0] NVRM: Xid error: xyz, invalid data",
        "<text> line 5: [Mon Foo 99 12:01:02 2024] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, MMU Fault",
    ]


def test_code_out_of_int16_range_is_malformed() -> None:
    log = X.parse_kernel_log(["NVRM: Xid (PCI:0000:05:00): 99999, unknown error"])
    assert log.malformed == 1 and log.events.height == 0


def test_line_without_pci_prefix_and_without_payload() -> None:
    log = X.parse_kernel_log(
        [
            "[...] NVRM: Xid (0000:03:00): 14, Channel 00000001",
            "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
        ]
    )
    assert [(r["pci"], r["code"], r["pid"], r["message"]) for r in _rows(log)] == [
        ("0000:03:00", 14, None, "Channel 00000001"),
        ("0000:01:00", 79, None, "GPU has fallen off the bus."),
    ]


def test_event_frame_schema() -> None:
    log = X.parse_kernel_log(DMESG)
    assert dict(log.events.schema) == {
        "host": pl.String,
        "pci": pl.String,
        "code": pl.Int16,
        "time": pl.Datetime("ms", "UTC"),
        "uptime_s": pl.Float64,
        "pid": pl.Int64,
        "message": pl.String,
        "line": pl.Int64,
    }
    empty = X.parse_kernel_log(["nothing here"])
    assert empty.events.schema == log.events.schema and len(empty) == 0


def test_reads_plain_and_gzipped_files(tmp_path: Path) -> None:
    plain = tmp_path / "kern.log"
    plain.write_text(SYSLOG)
    packed = tmp_path / "kern.log.1"  # rotated logs are gzipped without a .gz suffix
    packed.write_bytes(gzip.compress(SYSLOG.encode()))
    a = X.parse_kernel_log(plain, year=2024)
    b = X.parse_kernel_log(str(packed), year=2024)
    assert a.events.equals(b.events)
    assert a.events["code"].to_list() == [63, 48, 154]
    with pytest.raises(HealthError, match=r"missing\.log: no such file"):
        X.parse_kernel_log(tmp_path / "missing.log")


def test_malformed_examples_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "dmesg.txt"
    path.write_text("ok\n[ 1.0] NVRM: Xid (PCI:0000:3b:00): abc, nope\n")
    log = X.parse_kernel_log(path)
    assert log.malformed_examples == [f"{path} line 2: [ 1.0] NVRM: Xid (PCI:0000:3b:00): abc, nope"]


def test_unknown_time_zone_is_a_health_error() -> None:
    with pytest.raises(HealthError, match="unknown time zone 'Mars/Olympus'"):
        X.parse_kernel_log(DMESG, tz="Mars/Olympus")


def test_with_boot_time_fills_dmesg_times() -> None:
    log = X.parse_kernel_log(DMESG)
    events = X.with_boot_time(log, datetime(2024, 5, 6, 12, 0, 0))
    assert events["time"].to_list() == [
        datetime(2024, 5, 6, 12, 20, 34, 568000, tzinfo=UTC),
        datetime(2024, 5, 6, 13, 5, 47, 590000, tzinfo=UTC),
    ]


@pytest.mark.parametrize("code", [48, 64, 74, 79, 95, 119, 120, 140, 143, 46, 109, 158])
def test_hard_rules(code: int) -> None:
    assert code in X.HARD_XIDS
    assert X.severity(code) == "hard"
    assert X.severity_rank(code) == 4


@pytest.mark.parametrize("code", [63, 92, 94])
def test_precursor_rules(code: int) -> None:
    assert code in X.PRECURSOR_XIDS and X.severity(code) == "precursor" and X.severity_rank(code) == 3


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_benign_rules(code: int) -> None:
    assert code in X.BENIGN_XIDS and X.severity(code) == "benign" and X.severity_rank(code) == 1


def test_unknown_and_none() -> None:
    assert X.severity(999) == "unknown" and X.severity_rank(999) == 2
    assert X.severity_rank(0) == 0
    assert not (X.HARD_XIDS & X.PRECURSOR_XIDS) and not (X.HARD_XIDS & X.BENIGN_XIDS)


def test_every_code_of_the_research_table_is_catalogued() -> None:
    first = {13, 31, 43, 45, 46, 48, 62, 63, 64, 74, 79, 92, 94, 95, 109, 119, 120, 121, 136, 140, 143}
    table = first | set(range(144, 151)) | {154, 155, 156, 157, 158, 171, 172}
    assert table <= set(X.CATALOG)
    assert X.CATALOG[79].mnemonic == "GPU_HAS_FALLEN_OFF_THE_BUS"
    assert X.CATALOG[48].description == "Double Bit ECC Error"


def test_recovery_action_154_depends_on_the_new_action() -> None:
    assert X.severity(154) == "hard"
    assert X.severity(154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)") == "hard"
    assert X.severity(154, "GPU recovery action changed from 0x4 (Drain and Reset) to 0x0 (None)") == "benign"


def test_most_severe_prefers_hard_then_the_first_among_equals() -> None:
    assert X.most_severe(np.array([13, 94, 48, 79])) == 48
    assert X.most_severe(np.array([13, 999, 43])) == 999
    assert X.most_severe(np.array([0, 0])) == 0
    assert X.most_severe(np.array([], dtype=np.int64)) == 0
    assert X.most_severe(np.array([np.nan, 31.0])) == 31
    assert X.severity_ranks(np.array([0, 13, 63, 79, 500, -1])).tolist() == [0, 1, 3, 4, 2, 0]


def test_severity_rank_expr_matches_the_scalar_function() -> None:
    codes = [None, 0, 13, 31, 45, 63, 79, 94, 95, 119, 999]
    ranks = pl.DataFrame({"c": codes}, schema={"c": pl.Int64}).select(X.severity_rank_expr(pl.col("c")))
    assert ranks.to_series().to_list() == [0 if c is None else X.severity_rank(c) for c in codes]


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("00000000:3B:00.0", "0000:3b:00"),
        ("PCI:0000:b3:00", "0000:b3:00"),
        ("3b:00.0", "0000:3b:00"),
        ("0009:01:00", "0009:01:00"),
        ("  0000:3B:00  ", "0000:3b:00"),
    ],
)
def test_normalize_pci(raw: str, norm: str) -> None:
    assert X.normalize_pci(raw) == norm
    assert pl.select(X.normalize_pci_expr(pl.lit(raw))).item() == norm


def test_normalize_pci_rejects_garbage() -> None:
    with pytest.raises(HealthError, match="'nvidia0' is not a PCI bus id"):
        X.normalize_pci("nvidia0")
    assert pl.select(X.normalize_pci_expr(pl.lit("nvidia0"))).item() is None
