"""Telemetry readers (dcgm-exporter text, CSV, Parquet), hourly resampling and kernel-log XID merging."""

from __future__ import annotations

import gzip
import os
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from gpufleet.errors import HealthError
from gpufleet.health import readers as R
from gpufleet.health.xid import parse_kernel_log

H100 = 'modelName="NVIDIA H100 80GB HBM3"'
DRV = 'DCGM_FI_DRIVER_VERSION="535.129.03"'


def _labels(gpu: int, host: str, uuid: str, pci: str, extra: str = "") -> str:
    base = f'gpu="{gpu}",UUID="{uuid}",pci_bus_id="{pci}",device="nvidia{gpu}",{H100},Hostname="{host}",{DRV}'
    return "{" + base + extra + "}"


G0 = _labels(0, "node-1", "GPU-5fd4b0a2-6ad4-0f3b-8c1e-1b2f3c4d5e6f", "00000000:3B:00.0")
G1 = _labels(1, "node-1", "GPU-927d7444-b45a-7c49-8402-5e686e46a026", "00000000:B3:00.0")

# Two scrapes of dcgm-exporter's /metrics (default counters plus the ECC/violation lines one enables for
# failure prediction), separated by '# scrape' markers; the second uses newer DCGM alias names.
EXPOSITION = f"""\
# scrape 2024-05-06T12:00:00Z
# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{G0} 1980
DCGM_FI_DEV_SM_CLOCK{G1} 1755
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{G0} 34
DCGM_FI_DEV_GPU_TEMP{G1} 41
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{G0} 409.692000
DCGM_FI_DEV_POWER_USAGE{G1} 118.25
# HELP DCGM_FI_DEV_ECC_SBE_VOL_TOTAL Total number of single-bit volatile ECC errors.
# TYPE DCGM_FI_DEV_ECC_SBE_VOL_TOTAL counter
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{G0} 12
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{G1} 0
# HELP DCGM_FI_DEV_CLOCK_THROTTLE_REASONS Current clock throttle reasons.
# TYPE DCGM_FI_DEV_CLOCK_THROTTLE_REASONS gauge
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{G0} 72
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{G1} 1
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{G0[:-1]},err_code="0",err_msg="No Error"}} 0
DCGM_FI_DEV_XID_ERRORS{G1[:-1]},err_code="13",err_msg="Graphics Engine Exception"}} 13
# HELP DCGM_FI_DEV_VGPU_FUTURE_THING A field gpufleet does not know.
# TYPE DCGM_FI_DEV_VGPU_FUTURE_THING gauge
DCGM_FI_DEV_VGPU_FUTURE_THING{G0} 7
# HELP dcgm_exporter_build_info not per GPU
dcgm_exporter_build_info{{version="3.3.5"}} 1
DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="GPU-5fd4b0a2 34
this is not a sample
DCGM_FI_DEV_POWER_USAGE{G1} n/a
# scrape 2024-05-06T12:00:30Z
DCGM_FI_DEV_GPU_TEMP_CELSIUS{G0} 36
DCGM_FI_DEV_GPU_TEMP_CELSIUS{G1} 43
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{G0} 15
DCGM_FI_DEV_GPU_TEMP{G0} 38 1714996845000
"""

T0 = datetime(2024, 5, 6, 12, 0, 0, tzinfo=UTC)
T30 = datetime(2024, 5, 6, 12, 0, 30, tzinfo=UTC)
T45 = datetime(2024, 5, 6, 12, 0, 45, tzinfo=UTC)


@pytest.fixture
def exposition(tmp_path: Path) -> Path:
    path = tmp_path / "node-1.prom"
    path.write_text(EXPOSITION)
    return path


def test_prometheus_exposition_to_canonical_frame(exposition: Path) -> None:
    read = R.read_telemetry(exposition)
    frame = read.frame
    assert frame.columns == [
        "gpu",
        "node",
        "time",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_VGPU_FUTURE_THING",
        "hostname",
        "uuid",
        "pci_bus_id",
        "model",
    ]
    assert frame.schema["gpu"] == pl.UInt32 and frame.schema["node"] == pl.UInt32
    assert frame.schema["time"] == pl.Datetime("ms", "UTC")
    assert frame.schema["DCGM_FI_DEV_GPU_TEMP"] == pl.Float32
    assert frame.schema["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == pl.Int64
    assert frame.schema["DCGM_FI_DEV_XID_ERRORS"] == pl.Int64
    assert frame.schema["DCGM_FI_DEV_VGPU_FUTURE_THING"] == pl.Float32
    assert read.unknown_fields == ["DCGM_FI_DEV_VGPU_FUTURE_THING"]
    assert read.source == str(exposition)
    rows = frame.select("gpu", "time", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL").rows()
    assert rows == [
        (0, T0, 34.0, 12.0),
        (0, T30, 36.0, 15.0),
        (0, T45, 38.0, None),
        (1, T0, 41.0, 0.0),
        (1, T30, 43.0, None),
    ]
    first = frame.row(0, named=True)
    assert first["DCGM_FI_DEV_SM_CLOCK"] == 1980.0
    assert first["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(409.692)
    assert first["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 72
    assert first["DCGM_FI_DEV_XID_ERRORS"] == 0
    assert first["DCGM_FI_DEV_VGPU_FUTURE_THING"] == 7.0
    assert first["hostname"] == "node-1"
    assert first["uuid"] == "GPU-5fd4b0a2-6ad4-0f3b-8c1e-1b2f3c4d5e6f"
    assert first["pci_bus_id"] == "00000000:3B:00.0"
    assert first["model"] == "NVIDIA H100 80GB HBM3"
    gpu1 = frame.filter(pl.col("gpu") == 1).row(0, named=True)
    assert gpu1["DCGM_FI_DEV_XID_ERRORS"] == 13 and gpu1["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 1
    assert gpu1["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(118.25)  # the later 'n/a' line is malformed


def test_prometheus_malformed_lines_are_counted_with_line_numbers(exposition: Path) -> None:
    read = R.read_telemetry(exposition)
    lines = EXPOSITION.splitlines()
    bad = [i + 1 for i, line in enumerate(lines) if line.endswith((" n/a", "not a sample", "GPU-5fd4b0a2 34"))]
    assert read.malformed == 3
    assert [e.split(":")[0] for e in read.malformed_examples] == [f"{exposition} line {n}" for n in bad]
    assert read.malformed_examples[1] == f"{exposition} line {bad[1]}: this is not a sample"


def test_prometheus_multi_host_codes_follow_host_then_gpu_index(tmp_path: Path) -> None:
    def sample(host: str, gpu: int, value: float) -> str:
        pci = f"00000000:{0x18 + gpu:02X}:00.0"
        return f"DCGM_FI_DEV_GPU_TEMP{_labels(gpu, host, f'GPU-{host}-{gpu}', pci)} {value}"

    text = "\n".join(
        [
            sample("node-b", 1, 50),
            sample("node-b", 0, 51),
            sample("node-a", 7, 52),
            sample("node-a", 0, 53),
            sample("node-c", 0, 54),
        ]
    )
    path = tmp_path / "scrape-1714996800.prom"
    path.write_text(text + "\n")
    frame = R.read_telemetry(path).frame
    assert frame.select("gpu", "node", "hostname", "DCGM_FI_DEV_GPU_TEMP").rows() == [
        (0, 0, "node-a", 53.0),
        (1, 0, "node-a", 52.0),
        (2, 1, "node-b", 51.0),
        (3, 1, "node-b", 50.0),
        (4, 2, "node-c", 54.0),
    ]
    # no sample timestamps and no scrape markers: the epoch seconds in the file name give the time
    assert frame["time"].unique().to_list() == [datetime(2024, 5, 6, 12, 0, tzinfo=UTC)]


def test_prometheus_folder_of_scrapes_times_from_names_and_mtime(tmp_path: Path) -> None:
    folder = tmp_path / "scrapes"
    folder.mkdir()

    def line(value: int) -> str:
        return f"DCGM_FI_DEV_GPU_TEMP{G0} {value}\n"

    (folder / "dcgm-20240506T120000Z.prom").write_text(line(30))
    (folder / "dcgm-2024-05-06T13:00:00.txt.gz").write_bytes(gzip.compress(line(31).encode()))
    no_stamp = folder / "latest.prom"
    no_stamp.write_text(line(32))
    mtime = datetime(2024, 5, 6, 14, 0, 0, tzinfo=UTC).timestamp()
    os.utime(no_stamp, (mtime, mtime))
    (folder / "README.md").write_text("not a scrape")
    read = R.read_telemetry(folder)
    assert read.frame.select("time", "DCGM_FI_DEV_GPU_TEMP").rows() == [
        (datetime(2024, 5, 6, 12, tzinfo=UTC), 30.0),
        (datetime(2024, 5, 6, 13, tzinfo=UTC), 31.0),
        (datetime(2024, 5, 6, 14, tzinfo=UTC), 32.0),
    ]
    assert read.malformed == 0


def test_prometheus_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(HealthError, match=r"empty: no \*.prom or \*.txt scrape files"):
        R.read_telemetry(empty)
    junk = tmp_path / "junk.prom"
    junk.write_text("# HELP x\nnode_load1 0.5\nnot a metric line\n")
    with pytest.raises(HealthError, match=r"junk.prom: no per-GPU samples found \(1 malformed lines\)"):
        R.read_telemetry(junk)
    marker = tmp_path / "bad-marker.prom"
    marker.write_text(f"# scrape yesterday\nDCGM_FI_DEV_GPU_TEMP{G0} 30\n")
    with pytest.raises(HealthError, match=r"bad-marker.prom line 1: scrape marker time 'yesterday' is not ISO 8601"):
        R.read_telemetry(marker)
    with pytest.raises(HealthError, match="--columns does not apply to the prometheus reader"):
        R.read_telemetry(marker, columns={"time": "t"})


WIDE_CSV = """\
timestamp,hostname,gpu,uuid,DCGM_FI_DEV_GPU_TEMP_CELSIUS,DCGM_FI_DEV_POWER_USAGE,DCGM_FI_DEV_CLOCK_THROTTLE_REASONS,DCGM_FI_DEV_XID_ERRORS,driver,my_custom_metric
2024-05-06T12:00:00Z,node-2,0,GPU-b,40,300.5,0,0,535.129.03,1.5
2024-05-06T12:00:00Z,node-1,1,GPU-a1,41,301.5,8,0,535.129.03,2.5
2024-05-06T12:10:00Z,node-1,1,GPU-a1,45,,64,79,535.129.03,
"""


def test_wide_csv_with_aliases_unknown_and_string_columns(tmp_path: Path) -> None:
    path = tmp_path / "wide.csv"
    path.write_text(WIDE_CSV)
    read = R.read_telemetry(path)
    frame = read.frame
    assert frame.columns == [
        "gpu",
        "node",
        "time",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
        "my_custom_metric",
        "hostname",
        "uuid",
    ]
    assert read.unknown_fields == ["my_custom_metric"]  # 'driver' is text outside the catalog: dropped
    assert frame.rows() == [
        (0, 0, T0, 8, 41.0, 301.5, 0, 2.5, "node-1", "GPU-a1"),
        (0, 0, datetime(2024, 5, 6, 12, 10, tzinfo=UTC), 64, 45.0, None, 79, None, "node-1", "GPU-a1"),
        (1, 1, T0, 0, 40.0, 300.5, 0, 1.5, "node-2", "GPU-b"),
    ]


def test_wide_csv_epoch_seconds_and_column_mapping(tmp_path: Path) -> None:
    path = tmp_path / "wide.csv.gz"
    path.write_bytes(gzip.compress(b"ts_unix,node_id,card,temp_c\n1714996800,7,0,33\n1714996860,7,0,34\n"))
    read = R.read_telemetry(
        path, columns={"time": "ts_unix", "host": "node_id", "gpu": "card", "DCGM_FI_DEV_GPU_TEMP": "temp_c"}
    )
    assert read.frame.columns == ["gpu", "node", "time", "DCGM_FI_DEV_GPU_TEMP"]  # numeric host: no hostname
    assert read.frame["time"].to_list() == [T0, datetime(2024, 5, 6, 12, 1, tzinfo=UTC)]
    assert read.frame["DCGM_FI_DEV_GPU_TEMP"].to_list() == [33.0, 34.0]
    assert read.unknown_fields == []


LONG_CSV = """\
node_name,gpu_id,ts,metric,val
node-1,0,2024-05-06 12:00:00,DCGM_FI_DEV_GPU_TEMP,35
node-1,0,2024-05-06 12:00:00,DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,0
node-1,0,2024-05-06 12:00:00,DCGM_FI_DEV_ROW_REMAP_PENDING,1
node-1,0,2024-05-06 12:00:00,dcgm_fi_dev_memory_temp_celsius,51
node-1,0,2024-05-06 12:00:00,gpu_fan_rpm,3000
node-1,1,2024-05-06 12:00:00,DCGM_FI_DEV_GPU_TEMP,39
"""


def test_long_csv_with_columns_mapping(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_text(LONG_CSV)
    read = R.read_telemetry(path, columns={"time": "ts", "field": "metric", "value": "val"})
    frame = read.frame
    assert frame.columns == [
        "gpu",
        "node",
        "time",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "gpu_fan_rpm",
        "hostname",
    ]
    assert read.unknown_fields == ["gpu_fan_rpm"]
    assert frame.rows() == [
        (0, 0, T0, 51.0, 35.0, 0.0, 1.0, 3000.0, "node-1"),
        (1, 0, T0, None, 39.0, None, None, None, "node-1"),
    ]


def test_missing_required_column_names_file_column_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "notime.csv"
    path.write_text("hostname,gpu,DCGM_FI_DEV_GPU_TEMP\nnode-1,0,30\n")
    with pytest.raises(HealthError) as err:
        R.read_telemetry(path)
    message = str(err.value)
    assert str(path) in message
    assert "no 'time' column" in message
    assert "--columns time=<source column>" in message
    assert "hostname, gpu, DCGM_FI_DEV_GPU_TEMP" in message

    nogpu = tmp_path / "nogpu.csv"
    nogpu.write_text("time,DCGM_FI_DEV_GPU_TEMP\n2024-05-06T12:00:00Z,30\n")
    with pytest.raises(HealthError, match=r"nogpu.csv: no 'gpu' column .*--columns gpu=<source column>"):
        R.read_telemetry(nogpu)

    novalue = tmp_path / "novalue.csv"
    novalue.write_text("time,gpu,field\n2024-05-06T12:00:00Z,0,DCGM_FI_DEV_GPU_TEMP\n")
    with pytest.raises(HealthError, match=r"novalue.csv: no 'value' column for a long telemetry table"):
        R.read_telemetry(novalue)


def test_bad_mapping_and_bad_times_are_health_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("time,gpu,DCGM_FI_DEV_GPU_TEMP\n2024-05-06T12:00:00Z,0,30\nsoon,0,31\n")
    with pytest.raises(HealthError, match=r"t.csv column 'time': value 'soon' \(row 2\) is not a time"):
        R.read_telemetry(path)
    with pytest.raises(HealthError, match=r"--columns time=stamp: the file has no column 'stamp'"):
        R.read_telemetry(path, columns={"time": "stamp"})
    with pytest.raises(HealthError, match=r"--columns DCGM_FI_DEV_POWER_USAGE=watts: the file has no column"):
        R.read_telemetry(path, columns={"DCGM_FI_DEV_POWER_USAGE": "watts"})
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(HealthError, match=r"empty\.csv: the file is empty"):
        R.read_telemetry(empty)


def test_mixed_time_formats_parse(tmp_path: Path) -> None:
    path = tmp_path / "mixed.csv"
    path.write_text("time,gpu,DCGM_FI_DEV_GPU_TEMP\n2024-05-06T14:00:30+02:00,0,30\n2024-05-06 12:00:00,0,31\n")
    assert R.read_telemetry(path).frame["time"].to_list() == [T0, T30]


def _canonical_frame() -> pl.DataFrame:
    times = [datetime(2024, 5, 6, h, tzinfo=UTC) for h in (0, 1)]
    return pl.DataFrame(
        {
            "gpu": [0, 0, 1, 1, 8, 8],
            "node": [0, 0, 0, 0, 1, 1],
            "time": times * 3,
            "DCGM_FI_DEV_GPU_TEMP": [30.0, 31.0, 32.0, None, 34.0, 35.0],
            "DCGM_FI_DEV_XID_ERRORS": [0, 0, 0, 79, 0, 0],
        },
        schema={
            "gpu": pl.UInt32,
            "node": pl.UInt32,
            "time": pl.Datetime("ms", "UTC"),
            "DCGM_FI_DEV_GPU_TEMP": pl.Float32,
            "DCGM_FI_DEV_XID_ERRORS": pl.Int64,
        },
    )


def test_canonical_parquet_reads_back_unchanged(tmp_path: Path) -> None:
    frame = _canonical_frame().with_columns(pl.col("gpu").replace_strict({0: 0, 1: 1, 8: 2}, return_dtype=pl.UInt32))
    path = tmp_path / "fleet.parquet"
    frame.write_parquet(path)
    read = R.read_telemetry(path)
    assert read.frame.equals(frame)
    assert read.unknown_fields == [] and read.malformed == 0
    named = frame.with_columns(
        pl.when(pl.col("node") == 0).then(pl.lit("a-node")).otherwise(pl.lit("b-node")).alias("hostname")
    )
    named.write_parquet(path)
    assert R.read_telemetry(path).frame.equals(named)


def test_parquet_errors(tmp_path: Path) -> None:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(HealthError, match=r"broken\.parquet: not a readable Parquet file"):
        R.read_telemetry(path)


def test_read_telemetry_errors_and_detection(tmp_path: Path, exposition: Path) -> None:
    with pytest.raises(HealthError, match=r"nope\.csv: no such file or folder"):
        R.read_telemetry(tmp_path / "nope.csv")
    with pytest.raises(
        HealthError, match="unknown telemetry reader 'influx'; available readers: csv, parquet, prometheus"
    ):
        R.read_telemetry(exposition, reader="influx")
    dump = tmp_path / "metrics"
    dump.write_text(EXPOSITION)
    assert R.detect_reader(dump) == "prometheus"
    assert R.detect_reader(tmp_path / "x.parquet") == "parquet"
    table = tmp_path / "table"
    table.write_text(WIDE_CSV)
    assert R.detect_reader(table) == "csv"
    assert R.read_telemetry(dump).frame.height == 5


def test_parse_column_map() -> None:
    assert R.parse_column_map("time=ts, gpu=card,DCGM_FI_DEV_GPU_TEMP=temp_c") == {
        "time": "ts",
        "gpu": "card",
        "DCGM_FI_DEV_GPU_TEMP": "temp_c",
    }
    with pytest.raises(HealthError, match="--columns: malformed pair 'time'"):
        R.parse_column_map("time,gpu=card")


def _fine_frame() -> pl.DataFrame:
    """Two GPUs sampled every 20 minutes over two hours, with counters, bitmasks and XIDs."""
    minutes = [0, 20, 40, 60, 80, 100]
    times = [datetime(2024, 5, 6, 12 + m // 60, m % 60, tzinfo=UTC) for m in minutes]
    return pl.DataFrame(
        {
            "gpu": [0] * 6 + [1] * 6,
            "node": [0] * 12,
            "time": times * 2,
            "DCGM_FI_DEV_GPU_TEMP": [30, 33, 36, 40, None, 44, 50, 50, 50, 51, 52, 53],
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": [5, 7, 9, 9, 10, 10, 0, 0, 0, 0, 0, 0],
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": [0, 0x8, 0x40, 0x1, 0x1, 0x80, 0, 0, 0, None, None, None],
            "DCGM_FI_DEV_XID_ERRORS": [0, 13, 13, 94, 48, 79, 31, 0, 0, 0, 0, 0],
            "hostname": ["node-1"] * 12,
        },
        schema={
            "gpu": pl.UInt32,
            "node": pl.UInt32,
            "time": pl.Datetime("ms", "UTC"),
            "DCGM_FI_DEV_GPU_TEMP": pl.Float32,
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": pl.Float32,
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": pl.Int64,
            "DCGM_FI_DEV_XID_ERRORS": pl.Int64,
            "hostname": pl.String,
        },
    )


def test_resample_hourly_semantics() -> None:
    hourly = R.resample_hourly(_fine_frame())
    h12, h13 = datetime(2024, 5, 6, 12, tzinfo=UTC), datetime(2024, 5, 6, 13, tzinfo=UTC)
    assert hourly.schema == _fine_frame().schema
    assert hourly.rows() == [
        # gauge mean (nulls skipped), counter last=max, bitmask OR, most severe XID
        (0, 0, h12, 33.0, 9.0, 0x8 | 0x40, 13, "node-1"),
        (0, 0, h13, 42.0, 10.0, 0x1 | 0x80, 48, "node-1"),  # 48 and 79 are both hard: the first one wins
        (1, 0, h12, 50.0, 0.0, 0, 31, "node-1"),
        (1, 0, h13, 52.0, 0.0, None, 0, "node-1"),
    ]


def test_resample_hourly_unknown_fields_are_averaged_and_needs_keys() -> None:
    frame = _fine_frame().select("gpu", "node", "time", pl.col("DCGM_FI_DEV_GPU_TEMP").alias("fan_rpm"))
    assert R.resample_hourly(frame)["fan_rpm"].to_list()[:2] == [33.0, 42.0]
    with pytest.raises(HealthError, match="resample_hourly: the frame has no node column"):
        R.resample_hourly(frame.drop("node"))


def test_resample_hourly_xid_precursor_beats_benign_and_unknown_beats_benign() -> None:
    frame = _fine_frame().with_columns(
        pl.Series("DCGM_FI_DEV_XID_ERRORS", [13, 63, 43, 31, 999, 45, 0, 0, 0, None, None, None], dtype=pl.Int64)
    )
    assert R.resample_hourly(frame)["DCGM_FI_DEV_XID_ERRORS"].to_list() == [63, 999, 0, None]


KERNEL_LOG = """\
2024-05-06T12:05:00+00:00 node-1 kernel: NVRM: Xid (PCI:0000:3b:00): 94, pid=7062, name=python3, Contained: CE User Channel (0x9). RST: No, D-RST: No
2024-05-06T12:40:00+00:00 node-1 kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=7062, name=python3, Graphics Exception: ChID 000c, Class 0000cbc0, Offset 00000000, Data 00000000
2024-05-06T13:59:59+00:00 node-1 kernel: NVRM: Xid (PCI:0000:b3:00): 79, pid=1234, name=python, GPU has fallen off the bus.
2024-05-06T15:10:00+00:00 node-1 kernel: NVRM: Xid (PCI:0000:b3:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.
2024-05-06T12:30:00+00:00 node-9 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.
[ 1234.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.
"""  # noqa: E501


def _hourly_with_pci() -> pl.DataFrame:
    frame = R.resample_hourly(_fine_frame().drop("DCGM_FI_DEV_XID_ERRORS"))
    return frame.with_columns(
        pl.when(pl.col("gpu") == 0)
        .then(pl.lit("00000000:3B:00.0"))
        .otherwise(pl.lit("00000000:B3:00.0"))
        .alias("pci_bus_id")
    )


def test_merge_xid_events_on_host_and_pci() -> None:
    events = parse_kernel_log(KERNEL_LOG).events
    with pytest.warns(UserWarning, match="2 of 6 XID events left out"):
        merged = R.merge_xid_events(_hourly_with_pci(), events)
    h = [datetime(2024, 5, 6, x, tzinfo=UTC) for x in (12, 13, 15)]
    assert merged.columns == [
        "gpu",
        "node",
        "time",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "hostname",
        "pci_bus_id",
    ]
    assert merged.select("gpu", "time", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_TEMP", "hostname").rows() == [
        (0, h[0], 94, 33.0, "node-1"),  # 94 (precursor) beats 13 (benign) in the same hour
        (0, h[1], 0, 42.0, "node-1"),
        (1, h[0], 0, 50.0, "node-1"),
        (1, h[1], 79, 52.0, "node-1"),
        (1, h[2], 48, None, "node-1"),  # no telemetry that hour: a row is added for the XID
    ]
    assert merged.schema["DCGM_FI_DEV_XID_ERRORS"] == pl.Int64


def test_merge_xid_events_keeps_a_more_severe_dcgm_value() -> None:
    frame = _hourly_with_pci().with_columns(pl.lit(48, dtype=pl.Int64).alias("DCGM_FI_DEV_XID_ERRORS"))
    events = parse_kernel_log(KERNEL_LOG.splitlines()[:1]).events  # XID 94 on gpu 0 at 12:05
    merged = R.merge_xid_events(frame, events)
    assert merged["DCGM_FI_DEV_XID_ERRORS"].to_list() == [48, 48, 48, 48]


def test_merge_xid_events_with_pci_to_gpu_mapping() -> None:
    frame = _hourly_with_pci().drop("pci_bus_id", "hostname")
    events = parse_kernel_log(KERNEL_LOG.splitlines()[2:3]).events  # 79 on 0000:b3:00 at 13:59:59
    merged = R.merge_xid_events(frame, events, pci_to_gpu={"00000000:B3:00.0": 1, "node-1/0000:3b:00": 0})
    assert merged["DCGM_FI_DEV_XID_ERRORS"].to_list() == [0, 0, 0, 79]
    with pytest.raises(HealthError, match="merge_xid_events: the frame has no pci_bus_id column"):
        R.merge_xid_events(frame, events)
    with pytest.raises(HealthError, match="pci_to_gpu: key 'nvidia1' is not a PCI bus id"):
        R.merge_xid_events(frame, events, pci_to_gpu={"nvidia1": 1})


def test_merge_xid_events_host_less_dmesg_matches_a_unique_pci() -> None:
    frame = _hourly_with_pci()
    log = parse_kernel_log(
        [
            "[Mon May  6 12:30:00 2024] NVRM: Xid (PCI:0000:b3:00): 119, pid=1, name=x, Timeout "
            "after 6s of waiting for RPC response from GPU1 GSP!"
        ]
    )
    merged = R.merge_xid_events(frame, log.events)
    assert merged.filter(pl.col("gpu") == 1)["DCGM_FI_DEV_XID_ERRORS"].to_list() == [119, 0]


def test_merge_xid_events_needs_an_hourly_frame() -> None:
    events = parse_kernel_log(KERNEL_LOG).events
    with pytest.raises(HealthError, match=r"not hourly; call resample_hourly\(frame\) first"):
        R.merge_xid_events(_fine_frame(), events)
    with pytest.raises(HealthError, match="events have no 'pci' column"):
        R.merge_xid_events(_hourly_with_pci(), events.drop("pci"))
