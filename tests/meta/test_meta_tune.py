"""Choosing on validation tasks: grid parsing, local grid runs ranked by validation score, the best model kept,
the quality comparison choosing every setting and the best meta variant on validation, and the count baselines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gpufleet.errors import MetaError  # noqa: E402
from gpufleet.meta.evaluate import LoadedModel, evaluate_model  # noqa: E402
from gpufleet.meta.loader import TaskStore  # noqa: E402
from gpufleet.meta.metrics import selection_score  # noqa: E402
from gpufleet.meta.popularity import Popularity, entity_column, score_baseline  # noqa: E402
from gpufleet.meta.prepare import PrepareConfig, prepare_file  # noqa: E402
from gpufleet.meta.quality import compare_methods  # noqa: E402
from gpufleet.meta.trainer import TrainConfig  # noqa: E402
from gpufleet.meta.tune import best_model, grid_points, parse_grid, train_point  # noqa: E402


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    """80 users with a taste for one of 4 item groups and their own base rate, 40 items, explicit 0/1 labels."""
    rng = np.random.default_rng(7)
    folder = tmp_path_factory.mktemp("meta-tune")
    rows = []
    for u in range(80):
        liked, base = u % 4, rng.uniform(-1.0, 1.0)
        for k, item in enumerate(rng.choice(40, 24, replace=False)):
            logit = base + (1.5 if item % 4 == liked else -0.5) + 0.05 * (item - 20)
            rows.append(f"{u},{item},{int(rng.random() < 1 / (1 + np.exp(-logit)))},{1000 * u + k},{item % 4}")
    csv = folder / "clicks.csv"
    csv.write_text("uid,iid,click,ts,group\n" + "\n".join(rows) + "\n")
    prepare_file(
        csv,
        {"user": "uid", "item": "iid", "label": "click", "time": "ts"},
        PrepareConfig(support_size=8, query_size=12, min_query=5, val_fraction=0.25),
        folder / "tasks",
        sparse=["group"],
    )
    return folder / "tasks"


def _base(tasks: Path, **kw) -> TrainConfig:
    settings = dict(tasks=tasks, epochs=3, patience=1, tasks_per_step=8, emb_dim=8, bottom=(8,), top=(8,), prefetch=0)
    settings.update(kw)
    return TrainConfig(**settings)


def test_parse_grid_reads_values_and_names_the_fix() -> None:
    assert parse_grid("inner_lr=0.1,0.3; inner-steps=1,2") == {"inner_lr": (0.1, 0.3), "inner_steps": (1, 2)}
    assert grid_points({"a": (1, 2), "b": ("x",)}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    for bad, words in (("lr=0.1", "inner_lr"), ("inner_steps=one", "int"), ("", "empty"), ("inner_lr=", "no value")):
        with pytest.raises(MetaError, match=words):
            parse_grid(bad)


def test_grid_is_ranked_by_validation_and_keeps_the_best_model(tasks: Path, tmp_path: Path) -> None:
    grid = {"inner_lr": (0.0, 0.5)}
    out = tmp_path / "best.pt"
    kept = best_model(_base(tasks), grid, out)
    assert sorted(r.settings["inner_lr"] for r in kept) == [0.0, 0.5]
    assert kept[0].score >= kept[1].score
    for r in kept:  # a point's score is its best validation epoch's
        assert r.score == max(h["score"] for h in r.history)
    model = LoadedModel.load(out)
    assert model.maml.inner_lr == kept[0].settings["inner_lr"]
    again = evaluate_model(model, TaskStore.open(tasks, "val"))
    assert selection_score(again) == pytest.approx(kept[0].score, abs=1e-6)
    with pytest.raises(MetaError, match="patience"):
        train_point(_base(tasks, patience=None), {})


def test_quality_chooses_every_setting_and_the_best_variant_on_validation(tasks: Path) -> None:
    variants = {"maml": {"order": "first"}, "memory": {"order": "first", "adapt": "decision", "memory": 8}}
    # two points for the plain model's fine-tuning, one per meta variant: the choice between variants is tested
    result = compare_methods(tasks, _base(tasks), grid={"inner_lr": (0.1,), "inner_steps": (1, 2)}, variants=variants)
    methods = result["methods"]
    assert set(methods) == {"plain", "plain-finetuned", "popularity", "task-bias", "maml", "memory"}
    assert result["best_meta"] == max(variants, key=lambda n: methods[n]["val_score"])
    assert methods["plain-finetuned"]["chosen"]["inner_steps"] in (1, 2)
    for row in methods.values():
        assert 0.0 <= row["cold"]["auc"] <= 1.0 and row["cold"]["tasks"] == TaskStore.open(tasks, "cold").num_tasks


def test_count_baselines(tasks: Path) -> None:
    train, cold = TaskStore.open(tasks, "train"), TaskStore.open(tasks, "cold")
    assert [f.name for f in train.meta.sparse][entity_column(train)] == "item"
    pop = Popularity.fit(train)
    ids = np.concatenate([train.support.ids[:, pop.column], train.query.ids[:, pop.column]])
    assert pop.counts.sum() == ids.size and pop.counts[ids[0]] == (ids == ids[0]).sum()
    plain, biased = (score_baseline(pop, cold, 10.0, bias) for bias in (False, True))
    assert biased.gauc == pytest.approx(plain.gauc)  # a per-task shift cannot re-rank inside a task
    assert biased.auc > plain.auc  # users differ in base rate, which the support set reveals


def test_tune_command_prints_the_validation_table(tasks: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.meta import meta_app

    out = tmp_path / "best.pt"
    done = CliRunner().invoke(
        meta_app, ["tune", str(tasks), "--grid", "inner_lr=0.2", "--adapt", "decision", "-o", str(out)]
    )
    assert done.exit_code == 0, done.output
    assert "val GAUC" in done.output and "0.2" in done.output and out.is_file()
    adapted = LoadedModel.load(out).model.adapted  # the decision layers: the top MLP's three linear layers
    assert len(adapted) == 6 and all(n.startswith("top.") for n in adapted)
