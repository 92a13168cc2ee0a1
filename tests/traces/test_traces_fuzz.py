"""Property: the loader never crashes on small CSVs of mixed garbage.

Either the file as a whole is refused with a TraceError, or every row read is accounted for as a
valid job or a rejected row, and the valid jobs really are valid.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.errors import TraceError
from gpufleet.traces import CANONICAL_COLUMNS, POLARS_SCHEMA, load_trace

NAMES = [
    "submit_s",
    "duration_s",
    "num_gpus",
    "job_id",
    "vc",
    "kind",
    "user",
    "gpu_type",
    "timestamp",
    "duration",
    "cluster",
    "gpu_time",
    "submission_time",
    "num_gpu",
    "x",
    "",
]
GOOD = st.sampled_from(["1", "2", "8", "10", "60", "3600.5", "2017-10-09 07:01:55", "a1", "train"])
CELLS = st.one_of(
    GOOD,
    GOOD,
    GOOD,
    st.sampled_from(
        [
            "1",
            "0",
            "-1",
            "nan",
            "inf",
            "-0",
            "1.5",
            "1e3",
            "1e400",
            "99999999999",
            "",
            " ",
            "train",
            "inference",
            "2017-10-09 07:01:55",
            "2017-10-09T07:01:55Z",
            "2017-13-40 25:00:00",
            "abc",
            '"a,b"',
            '"',
            "\t",
            "é",
            ",",
            "\r",
        ]
    ),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\n"), max_size=6),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(2**40), 2**40).map(str),
)


@st.composite
def garbage_csv(draw: st.DrawFn) -> str:
    header = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6))
    if draw(st.booleans()):
        header += ["submit_s", "duration_s", "num_gpus"]
    width = len(header)
    rows = draw(
        st.lists(
            st.one_of(
                st.lists(CELLS, min_size=width, max_size=width),
                st.lists(CELLS, min_size=width, max_size=width),
                st.lists(CELLS, min_size=0, max_size=width + 2),
            ),
            max_size=8,
        )
    )
    ending = draw(st.sampled_from(["", "\n", "\n\n", "\r\n"]))
    return ",".join(header) + "\n" + "\n".join(",".join(r) for r in rows) + ending


BAD = st.sampled_from(["0", "-1", "nan", "inf", "1.5", "", "abc", "2017-13-40 25:00:00", "99999999999", "serve"])


@st.composite
def plausible_csv(draw: st.DrawFn) -> str:
    """Well-formed CSVs with recognised columns and a sprinkling of bad values: exercises the row path."""
    header = draw(st.permutations(["submit_s", "duration_s", "num_gpus", *draw(st.sets(st.sampled_from(NAMES)))]))
    header = list(dict.fromkeys(header))
    cell = st.one_of(GOOD, GOOD, GOOD, BAD)
    rows = draw(st.lists(st.lists(cell, min_size=len(header), max_size=len(header)), max_size=10))
    return ",".join(header) + "\n" + "\n".join(",".join(r) for r in rows) + "\n"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(garbage_csv(), plausible_csv()), suffix=st.sampled_from([".csv", ".csv.gz"]))
def test_loader_never_crashes_on_garbage(text: str, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"fuzz{suffix}"
        data = text.encode("utf-8", errors="surrogatepass")
        if suffix.endswith(".gz"):
            import gzip

            data = gzip.compress(data)
        path.write_bytes(data)
        try:
            load = load_trace(path)
        except TraceError as exc:
            assert str(path) in str(exc)
            return
    jobs = load.jobs
    assert jobs.height + sum(load.rejected.values()) == load.rows_read
    assert set(load.rejected) == set(load.rejected_examples)
    assert {c: jobs.schema[c] for c in CANONICAL_COLUMNS} == POLARS_SCHEMA
    if jobs.height:
        assert jobs.select(
            (pl.col("duration_s") > 0).all()
            & pl.col("duration_s").is_finite().all()
            & (pl.col("num_gpus") > 0).all()
            & (pl.col("submit_s") >= 0).all()
            & pl.col("job_id").is_unique().all()
            & pl.col("kind").is_in(["train", "inference"]).all()
        ).item()
        assert jobs["submit_s"].is_sorted()
