"""NVIDIA XID errors: a catalog with failure severities, and a parser for the kernel-log lines they appear in.

The driver logs every XID to the kernel ring buffer as ``NVRM: Xid (PCI:<domain>:<bus>:<device>): <code>,
<details>``. This module turns dmesg, ``dmesg -T``, journalctl/kern.log (ISO timestamps) and classic syslog
exports into one event frame, so that failure labels do not depend on DCGM's sticky, last-value-only
``DCGM_FI_DEV_XID_ERRORS`` gauge.

Severity classes (used to label failures and to pick "the most severe XID of an hour"):

- ``hard``: the GPU needs a reset, a reboot or replacement (the "hard failure" rule of thumb);
- ``precursor``: a soft event that precedes hard failures (row remapping, high SBE rate, contained ECC);
- ``benign``: usually an application fault, harmless in isolation;
- ``unknown``: a code outside the catalog.

The rules and their sources are listed in ``docs/health_telemetry.md``.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import polars as pl

from gpufleet.errors import HealthError

SEVERITIES = ("hard", "precursor", "unknown", "benign")


class XidInfo(NamedTuple):
    """One catalog entry: NVIDIA's mnemonic, its description and gpufleet's failure severity."""

    mnemonic: str
    description: str
    severity: str


# Mnemonics follow NVIDIA's XID catalog (without the ROBUST_CHANNEL_ prefix); descriptions follow the
# XID documentation as tabulated by dcgm-exporter. Severities: see the module docstring and the docs.
CATALOG: dict[int, XidInfo] = {
    8: XidInfo("FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "benign"),
    13: XidInfo("GR_EXCEPTION", "Graphics Engine Exception", "benign"),
    31: XidInfo("MMU_ERR_FLT", "GPU memory page fault", "benign"),
    32: XidInfo("PBDMA_ERROR", "Invalid or corrupted push buffer stream", "benign"),
    43: XidInfo("RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "benign"),
    44: XidInfo("GR_FAULT_DURING_CTXSW", "Graphics Engine fault during context switch", "unknown"),
    45: XidInfo("PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors", "benign"),
    46: XidInfo("GPU_TIMEOUT_ERROR", "GPU stopped processing", "hard"),
    48: XidInfo("GPU_ECC_DBE", "Double Bit ECC Error", "hard"),
    61: XidInfo("PMU_BREAKPOINT", "Internal micro-controller breakpoint/warning", "unknown"),
    62: XidInfo("PMU_HALT_ERROR", "Internal micro-controller halt", "hard"),
    63: XidInfo("INFOROM_DRAM_RETIREMENT_EVENT", "ECC page retirement or row remapping recording event", "precursor"),
    64: XidInfo("INFOROM_DRAM_RETIREMENT_FAILURE", "ECC page retirement or row remapper recording failure", "hard"),
    69: XidInfo("GR_CLASS_ERROR", "Graphics Engine class error", "benign"),
    74: XidInfo("NVLINK_ERROR", "NVLINK Error", "hard"),
    79: XidInfo("GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "hard"),
    92: XidInfo("EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "precursor"),
    93: XidInfo("INFOROM_ERASE_LIMIT_EXCEEDED", "Non-fatal violation of provisioned InfoROM wear limit", "unknown"),
    94: XidInfo("CONTAINED_ERROR", "Contained ECC error", "precursor"),
    95: XidInfo("UNCONTAINED_ERROR", "Uncontained ECC error", "hard"),
    109: XidInfo("CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", "hard"),
    119: XidInfo("GSP_RPC_TIMEOUT", "GSP RPC Timeout", "hard"),
    120: XidInfo("GSP_ERROR", "GSP Error", "hard"),
    121: XidInfo("C2C_ERROR", "C2C Link Error", "precursor"),
    136: XidInfo("ALI_TRAINING_FAIL", "ALI Training Fail", "hard"),
    140: XidInfo("UNRECOVERABLE_ECC_ERROR_ESCAPE", "Unrecovered ECC Error", "hard"),
    143: XidInfo("GPU_INIT_ERROR", "GPU Initialization Failure", "hard"),
    144: XidInfo("NVLINK_SAW_ERROR", "NVLINK: SAW Error", "hard"),
    145: XidInfo("NVLINK_RLW_ERROR", "NVLINK: RLW Error", "hard"),
    146: XidInfo("NVLINK_TLW_ERROR", "NVLINK: TLW Error", "hard"),
    147: XidInfo("NVLINK_TREX_ERROR", "NVLINK: TREX Error", "hard"),
    148: XidInfo("NVLINK_NVLPW_CTRL_ERROR", "NVLINK: NVLPW_CTRL Error", "hard"),
    149: XidInfo("NVLINK_NETIR_ERROR", "NVLINK: NETIR Error", "hard"),
    150: XidInfo("NVLINK_MSE_ERROR", "NVLINK: MSE Error", "hard"),
    154: XidInfo("GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "hard"),
    155: XidInfo("NVLINK_SW_DEFINED_ERROR", "NVLINK: SW Defined Error", "hard"),
    156: XidInfo("RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", "precursor"),
    157: XidInfo("RESOURCE_RETIREMENT_FAILURE", "Resource Retirement Failure", "hard"),
    158: XidInfo("GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", "hard"),
    171: XidInfo("UNCORRECTABLE_DRAM_ERROR", "Uncorrectable DRAM Error", "hard"),
    172: XidInfo("UNCORRECTABLE_SRAM_ERROR", "Uncorrectable SRAM Error", "hard"),
}

#: XIDs after which the GPU needs a reset, reboot or replacement.
HARD_XIDS: frozenset[int] = frozenset(c for c, i in CATALOG.items() if i.severity == "hard")
#: XIDs that precede hard failures (soft events).
PRECURSOR_XIDS: frozenset[int] = frozenset(c for c, i in CATALOG.items() if i.severity == "precursor")
#: XIDs that are application faults when seen in isolation.
BENIGN_XIDS: frozenset[int] = frozenset(c for c, i in CATALOG.items() if i.severity == "benign")

#: Rank of each severity class: a larger rank is more severe; 0 means "no XID".
RANKS: dict[str, int] = {"hard": 4, "precursor": 3, "unknown": 2, "benign": 1}


_RECOVERY_NONE = re.compile(r"\bto 0x0 \(None\)", re.IGNORECASE)


def severity(code: int, message: str | None = None) -> str:
    """The severity class of an XID code: ``hard``, ``precursor``, ``benign`` or ``unknown``.

    XID 154 (recovery action changed) is hard unless ``message`` says the action changed *to* none
    (``... from 0x4 (Drain and Reset) to 0x0 (None)``), which is benign.
    """
    info = CATALOG.get(int(code))
    if info is None:
        return "unknown"
    if int(code) == 154 and message is not None and _RECOVERY_NONE.search(message):
        return "benign"
    return info.severity


def severity_rank(code: int) -> int:
    """4 hard > 3 precursor > 2 unknown > 1 benign > 0 none (code 0 or negative)."""
    code = int(code)
    return 0 if code <= 0 else RANKS[severity(code)]


def severity_ranks(codes: np.ndarray) -> np.ndarray:
    """:func:`severity_rank` of every code of an integer array (int8); NaN and codes <= 0 rank 0."""
    values = np.asarray(codes, dtype=np.float64)
    ranks = np.full(values.shape, RANKS["unknown"], dtype=np.int8)
    valid = np.isfinite(values) & (values > 0)
    ranks[~valid] = 0
    for code, info in CATALOG.items():
        ranks[valid & (values == code)] = RANKS[info.severity]
    return ranks


def most_severe(codes: np.ndarray) -> int:
    """The most severe code of ``codes`` (0 if none); between equally severe codes, the first one.

    Order ``codes`` by time: the first of equally severe XIDs is usually the cause, the later ones its echo.
    """
    values = np.asarray(codes, dtype=np.float64).ravel()
    if values.size == 0:
        return 0
    ranks = severity_ranks(values)
    best = int(np.argmax(ranks))
    return 0 if ranks[best] == 0 else int(values[best])


def severity_rank_expr(codes: pl.Expr) -> pl.Expr:
    """Polars expression: the severity rank (Int8) of an integer XID column; null and <= 0 rank 0."""
    known = pl.lit(RANKS["unknown"], dtype=pl.Int8)
    mapping = {code: RANKS[info.severity] for code, info in CATALOG.items()}
    ranked = codes.cast(pl.Int64).replace_strict(mapping, default=known, return_dtype=pl.Int8)
    return pl.when(codes.is_null() | (codes <= 0)).then(pl.lit(0, dtype=pl.Int8)).otherwise(ranked)


# ---------------------------------------------------------------------------------------------------
# PCI ids

_PCI = re.compile(r"^(?:pci:)?(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})(?:\.[0-7])?$")


def normalize_pci(pci: str) -> str:
    """The short lower-case bus id NVRM prints: ``00000000:3B:00.0``, ``PCI:0000:3b:00`` → ``0000:3b:00``.

    Raises HealthError when ``pci`` is not a PCI bus id.
    """
    m = _PCI.match(pci.strip().lower())
    if m is None:
        raise HealthError(f"'{pci}' is not a PCI bus id; expected e.g. 00000000:3B:00.0 or 0000:3b:00")
    domain = (m.group(1) or "0").zfill(4)[-4:]
    return f"{domain}:{m.group(2).zfill(2)}:{m.group(3).zfill(2)}"


def normalize_pci_expr(col: pl.Expr) -> pl.Expr:
    """Polars expression of :func:`normalize_pci` (null where the value is not a PCI bus id)."""
    lowered = col.str.strip_chars().str.to_lowercase()
    pattern = r"^(?:pci:)?(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})(?:\.[0-7])?$"
    domain = lowered.str.extract(pattern, 1).fill_null("0").str.zfill(4).str.slice(-4)
    bus = lowered.str.extract(pattern, 2).str.zfill(2)
    device = lowered.str.extract(pattern, 3).str.zfill(2)
    return pl.concat_str([domain, bus, device], separator=":")


# ---------------------------------------------------------------------------------------------------
# kernel-log parsing

_MARKER = "NVRM: Xid"
# ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.`` (gpud's
# ``NVRM: Xid.*?: (\d+),`` plus the PCI id); old drivers print the id without ``PCI:``, MIG adds
# `` GPU-I:00 GPU-CI:00`` after it.
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)(?: [^)]*)?\): "
    r"(?P<code>\d+)(?:,\s*(?P<rest>.*?))?\s*$"
)
_PID = re.compile(r"^pid=(?:'?(?P<pid>\d+)'?|'?<unknown>'?)\s*(?:,\s*|$)")
_NAME = re.compile(r"^name=(?:<unknown>|[^,]*?)\s*(?:,\s*|$)")
# ``[ 1234.567890] NVRM: ...`` (dmesg, also after ``kernel:`` in syslog/journal lines)
_UPTIME = re.compile(r"\[\s*(?P<up>\d+\.\d+)\]\s*$")
# ``[Mon May  6 12:01:02 2024] NVRM: ...`` (dmesg -T)
_CTIME = re.compile(r"^\[(?P<ts>[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\]\s*")
# ``2024-05-06T12:01:02.123456+00:00 node-7 kernel: ...`` (journalctl -o short-iso, rsyslog RFC 3339)
_ISO = re.compile(
    r"^(?P<ts>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s+(?P<host>\S+)\s+"
    r"kernel(?:\[\d+\])?:\s*"
)
# ``May  6 12:01:02 node-7 kernel: ...`` (syslog, journalctl short)
_SYSLOG = re.compile(
    r"^(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) (?P<hms>\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d+))?\s+(?P<host>\S+)\s+"
    r"kernel(?:\[\d+\])?:\s*"
)
_MONTHS = {
    m: i
    for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)
}
_EXAMPLES = 5

EVENT_SCHEMA: dict[str, pl.DataType] = {
    "host": pl.String(),
    "pci": pl.String(),
    "code": pl.Int16(),
    "time": pl.Datetime("ms", "UTC"),
    "uptime_s": pl.Float64(),
    "pid": pl.Int64(),
    "message": pl.String(),
    "line": pl.Int64(),
}


@dataclass
class XidLog:
    """XID events parsed from a kernel log, one row per event in file order (see ``EVENT_SCHEMA``).

    ``time`` is null for plain dmesg lines, which carry only the seconds since boot (``uptime_s``).
    ``malformed`` counts lines that mention ``NVRM: Xid`` but could not be parsed.
    """

    events: pl.DataFrame
    lines: int = 0
    malformed: int = 0
    malformed_examples: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return self.events.height


class _Clock:
    """Turns the timestamp prefixes of one log into UTC datetimes (with syslog's year rollover)."""

    def __init__(self, year: int, tz: str) -> None:
        try:
            self.zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise HealthError(f"unknown time zone '{tz}'; pass an IANA name such as UTC or Europe/Berlin") from None
        self.year = year
        self.last_month = 0

    def local(self, naive: datetime) -> datetime:
        return naive.replace(tzinfo=self.zone).astimezone(UTC)

    def iso(self, text: str) -> datetime:
        text = text.replace(",", ".").replace(" ", "T", 1)
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        elif re.search(r"[+-]\d{4}$", text):
            text = f"{text[:-2]}:{text[-2:]}"
        stamp = datetime.fromisoformat(text)
        return self.local(stamp) if stamp.tzinfo is None else stamp.astimezone(UTC)

    def syslog(self, m: re.Match[str]) -> datetime:
        month = _MONTHS[m["mon"]]
        if self.last_month and month < self.last_month - 6:  # Dec -> Jan: a new year began
            self.year += 1
        self.last_month = month
        hour, minute, second = (int(x) for x in m["hms"].split(":"))
        micro = int((m["frac"] or "0")[:6].ljust(6, "0"))
        return self.local(datetime(self.year, month, int(m["day"]), hour, minute, second, micro))


def read_text(path: Path, what: str) -> str:
    """The text of ``path``, gunzipped when it starts with the gzip magic; HealthError naming ``what``."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except FileNotFoundError:
        raise HealthError(f"{path}: no such file; pass the path of a {what}") from None
    except IsADirectoryError:
        raise HealthError(f"{path}: is a directory; pass the path of a {what}") from None
    except (OSError, EOFError) as exc:
        raise HealthError(f"{path}: cannot read the {what} ({exc}); check the file") from None
    return raw.decode("utf-8", errors="replace")


def _open_lines(source: str | Path | Iterable[str]) -> tuple[Iterator[str], str]:
    if isinstance(source, str) and ("\n" in source or _MARKER in source):
        return iter(source.splitlines()), "<text>"
    if isinstance(source, str | Path):
        path = Path(source)
        return iter(read_text(path, "kernel log (dmesg, journalctl or syslog export)").splitlines()), str(path)
    return (line.rstrip("\r\n") for line in source), "<lines>"


def _payload(rest: str | None) -> tuple[int | None, str]:
    """pid and message from the text after the code: ``pid=1234, name=python, GPU has fallen off the bus.``"""
    rest = (rest or "").strip()
    pid = None
    m = _PID.match(rest)
    if m is not None:
        pid = int(m["pid"]) if m["pid"] else None
        rest = rest[m.end() :]
        n = _NAME.match(rest)
        if n is not None:
            rest = rest[n.end() :]
    return pid, rest.strip()


def parse_kernel_log(
    source: str | Path | Iterable[str], host: str | None = None, year: int | None = None, tz: str = "UTC"
) -> XidLog:
    """Parse the XID events of a kernel log (a path, gzipped or not; log text; or an iterable of lines).

    Accepted line prefixes: plain dmesg ``[ 1234.567890]`` (uptime only, ``time`` null); ``dmesg -T``
    ``[Mon May  6 12:01:02 2024]``; journalctl/kern.log ISO ``2024-05-06T12:01:02.123456+00:00 node-7
    kernel:``; syslog ``May  6 12:01:02 node-7 kernel:`` (``year`` is the year of its first line, default
    this year, and a December→January step starts the next one); and none at all. Timestamps without a UTC
    offset are read in ``tz``. ``host`` names the host of lines that do not carry one (dmesg).

    Lines without ``NVRM: Xid`` are skipped; lines with it that cannot be parsed are counted as malformed.
    """
    lines, name = _open_lines(source)
    clock = _Clock(datetime.now(UTC).year if year is None else int(year), tz)
    rows: dict[str, list[object]] = {k: [] for k in EVENT_SCHEMA}
    examples: list[str] = []
    malformed = 0
    count = 0
    for number, text in enumerate(lines, start=1):
        count = number
        at = text.find(_MARKER)
        if at < 0:
            continue
        prefix = text[:at]
        m = _XID.search(text, at)
        stamp: datetime | None = None
        line_host = host
        try:
            if m is None or int(m["code"]) > np.iinfo(np.int16).max:
                raise ValueError("no XID code and PCI id")
            if (p := _ISO.match(prefix)) is not None:
                stamp, line_host, prefix = clock.iso(p["ts"]), p["host"], prefix[p.end() :]
            elif (p := _SYSLOG.match(prefix)) is not None:
                stamp, line_host, prefix = clock.syslog(p), p["host"], prefix[p.end() :]
            elif (p := _CTIME.match(prefix)) is not None:
                stamp, prefix = clock.local(datetime.strptime(p["ts"], "%a %b %d %H:%M:%S %Y")), prefix[p.end() :]
        except ValueError:
            malformed += 1
            if len(examples) < _EXAMPLES:
                examples.append(f"{name} line {number}: {text.strip()[:200]}")
            continue
        up = _UPTIME.search(prefix)
        pid, message = _payload(m["rest"])
        rows["host"].append(line_host)
        rows["pci"].append(normalize_pci(m["pci"]))
        rows["code"].append(int(m["code"]))
        rows["time"].append(stamp)
        rows["uptime_s"].append(float(up["up"]) if up else None)
        rows["pid"].append(pid)
        rows["message"].append(message)
        rows["line"].append(number)
    events = pl.DataFrame(rows, schema=EVENT_SCHEMA)
    return XidLog(events=events, lines=count, malformed=malformed, malformed_examples=examples)


def with_boot_time(log: XidLog, boot: datetime) -> pl.DataFrame:
    """Events with ``time`` filled from ``uptime_s`` for plain dmesg lines, given the host's boot time.

    ``boot`` is when the kernel started (``uptime -s`` or ``/proc/stat``'s ``btime``); naive means UTC.
    """
    start = boot if boot.tzinfo is not None else boot.replace(tzinfo=UTC)
    base = pl.lit(start.astimezone(UTC)).cast(pl.Datetime("ms", "UTC"))
    offset = pl.duration(milliseconds=(pl.col("uptime_s") * 1000).round(0).cast(pl.Int64))
    return log.events.with_columns(pl.col("time").fill_null(base + offset))


__all__ = [
    "BENIGN_XIDS",
    "CATALOG",
    "EVENT_SCHEMA",
    "HARD_XIDS",
    "PRECURSOR_XIDS",
    "RANKS",
    "SEVERITIES",
    "XidInfo",
    "XidLog",
    "most_severe",
    "normalize_pci",
    "normalize_pci_expr",
    "parse_kernel_log",
    "read_text",
    "severity",
    "severity_rank",
    "severity_rank_expr",
    "severity_ranks",
    "with_boot_time",
]
