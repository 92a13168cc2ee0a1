"""Megatron-Core's --recompute-modules (memory only): Megatron-Bridge's DeepSeek-V3 recipe on 1,024 H100s fits."""

from __future__ import annotations

import dataclasses

import numpy as np

from gpufleet.perf.ground_truth import read_cases
from gpufleet.perf.model_spec import get_model
from gpufleet.perf.options import TrainOptions
from gpufleet.perf.step import evaluate
from gpufleet.perf.system import System
from gpufleet.perf.validate import predict_case, seen_cases


def _bridge_deepseek():
    cases, _ = read_cases()
    return next(c for c in seen_cases(cases) if c.label.startswith("DeepSeek-V3") and c.options.stack == "nemo")


def test_bridge_deepseek_v3_recipe_recomputes_mla_up_projections_and_fits():
    case = _bridge_deepseek()
    assert case.options.recompute_modules == ("mla_up_proj", "mlp")  # read from the row's notes
    with_recipe = predict_case(case)
    assert with_recipe["fits"] and with_recipe["memory_gb"] < case.system.gpu.memory_gb
    bare = dataclasses.replace(case, options=case.options.model_copy(update={"recompute_modules": ()}))
    without = predict_case(bare)
    assert without["memory_gb"] > with_recipe["memory_gb"] + 10.0  # MLA's per-head Q, K and V: 128 heads x 448 B
    assert without["step_time_s"] == with_recipe["step_time_s"]  # memory only: the time is unchanged


def test_recompute_modules_act_only_under_selective_recompute():
    model = get_model("llama3-8b")
    system = System.build("h100", "ib-ndr")
    base = TrainOptions(precision="bf16")
    mlp = base.model_copy(update={"recompute_modules": ("mlp",)})
    codes = np.array([0, 1, 2])
    a = evaluate(model, system, 64, 1, 2, 32, 1, 1, 1, codes, None, base)["memory_activations_gb"]
    b = evaluate(model, system, 64, 1, 2, 32, 1, 1, 1, codes, None, mlp)["memory_activations_gb"]
    assert b[1] < a[1]  # selective: the dense MLP keeps only its input
    assert b[0] == a[0] and b[2] == a[2]  # no recompute / full recompute: unchanged
    mla = base.model_copy(update={"recompute_modules": ("mla_up_proj",)})
    c = evaluate(model, system, 64, 1, 2, 32, 1, 1, 1, codes, None, mla)["memory_activations_gb"]
    assert np.array_equal(c, a)  # a model without latent attention has no up-projections to recompute
