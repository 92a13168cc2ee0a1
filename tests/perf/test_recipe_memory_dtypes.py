"""Revision 9: the memory model counts the gradient buffer and optimizer state the published recipes use.

Every published run that ran must fit as published (issue 28, bar item 5). Five fresh5 layouts and one each of fresh2
and fresh4 were predicted over their GPU's memory at revision 8 because every row was charged fp32 gradients and fp32
Adam states and, under FSDP, a persistent bf16 shard besides the fp32 one. The recipes say otherwise (docs/perf.md,
revision 9).
"""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.perf.efficiency import default_efficiency, jobspeed_efficiency
from gpufleet.perf.ground_truth import read_cases
from gpufleet.perf.memory import state_bytes_per_param
from gpufleet.perf.options import TrainOptions
from gpufleet.perf.step import evaluate
from gpufleet.perf.validate import predict_case

#: The rows revision 8 predicted over memory, with the GiB it predicted (docs/perf.md, revision 9's memory table).
FORMERLY_OVER = {
    81: ("MPT-13B on 8 A100-80GB", 80.7),
    109: ("Llama3.1-8B on 8 H100", 80.8),
    134: ("Nemotron4-340B on 128 H100", 92.9),
    135: ("Nemotron4-340B on 128 H100", 88.4),
    142: ("Nemotron4-15B on 16 H100", 88.6),
    143: ("Nemotron4-15B on 16 H100", 84.9),
    156: ("Llama3.1-405B on 512 H100", 83.4),
}


@pytest.fixture(scope="module")
def cases():
    found, _ = read_cases()
    return {c.row: c for c in found}


def test_megatron_distributed_optimizer_table_with_bf16_gradients():
    d = np.array([1.0, 8.0])
    # Megatron-LM docs/distrib_optimizer.md: bf16 params + fp32 grads 18 and 6 + 12/d; fp16 params + fp16 grads 20
    # and 4 + 16/d (the optimizer's fp32 copy of the gradient shard)
    assert state_bytes_per_param(0, d) == pytest.approx([18.0, 18.0])
    assert state_bytes_per_param(1, d) == pytest.approx([18.0, 6.0 + 12.0 / 8.0])
    assert state_bytes_per_param(0, d, grad_bytes=2.0) == pytest.approx([20.0, 20.0])
    assert state_bytes_per_param(1, d, grad_bytes=2.0) == pytest.approx([20.0, 4.0 + 16.0 / 8.0])
    # PyTorch FSDP: the fp32 shard is the master copy, no persistent bf16 shard: 16/d, not 18/d
    assert state_bytes_per_param(3, d) == pytest.approx([18.0, 18.0 / 8.0])
    assert state_bytes_per_param(3, d, sharded_fp32_params=True) == pytest.approx([16.0, 2.0])


def test_formerly_over_rows_fit_as_published(cases):
    for row, (label, before) in FORMERLY_OVER.items():
        case = cases[row]
        assert case.label.startswith(label.split(" on ")[0]) and f"on {case.gpus} " in case.label
        p = predict_case(case, default_efficiency())
        limit = case.system.gpu.memory_gb
        assert before > limit  # what revision 8 predicted
        assert p["fits"], f"row {row} {case.label}: {p['memory_gb']:.1f} of {limit:g} GiB"


def test_every_published_row_of_every_split_fits(cases):
    over = []
    for case in cases.values():
        p = predict_case(case, default_efficiency())
        if not p["fits"]:
            over.append(f"row {case.row} {case.label}: {p['memory_gb']:.1f} of {case.system.gpu.memory_gb:g} GiB")
    assert not over, over


def test_recipe_settings_are_read_from_the_rows(cases):
    # dgxc-benchmarking's recipes: grad_sync_dtype bf16 (v24.11.1 / v25.01 yamls) and grad_reduce_in_fp32 false
    # (NeMo 2.0 performance recipes, v25.04); the v25.01 Nemotron-4 340B yaml keeps Adam in bf16 (optim.dtype: bf16)
    assert cases[109].options.grad_reduce_bytes == 2 and cases[156].options.grad_reduce_bytes == 2
    assert cases[134].options.optimizer_bytes == 6.0 and cases[146].options.optimizer_bytes == 12.0
    # DeepSeek-V3 in v25.05: its bf16 recipe leaves grad_reduce_in_fp32 at the default (true)
    dsv3 = next(c for c in cases.values() if c.model.name == "deepseek-v3" and "dgxc" in c.source)
    assert dsv3.options.grad_reduce_bytes == 4
    # NeMo-Framework-Launcher 24.07 / 24.12 H100 fp8 scripts (optim.grad_sync_dtype=bf16) and Megatron-Bridge
    # performance configs (grad_reduce_in_fp32 false: 25.09 yamls, 25.11 / 26.x set_*_common_configs)
    for row in (38, 46, 55, 59, 60, 95, 99, 100, 106, 108):
        assert cases[row].options.grad_reduce_bytes == 2, row
    # Megatron-LM's --bf16 forces fp32 reduction (r0.8 table, MoE README); MLPerf v3.1's config was not found
    for row in (23, 31, 47):
        assert cases[row].options.grad_reduce_bytes == 4, row
    assert cases[81].options.sharded_fp32_params  # MosaicML's FSDP (PyTorch FSDP) keeps fp32 shards only


def test_bf16_gradients_shrink_states_and_leave_the_simulator_alone(cases):
    case = cases[156]
    fp32 = case.options.model_copy(update={"grad_reduce_bytes": 4})

    def mem(options, eff):
        args = (case.model, case.system, case.gbs, case.tp, case.pp, case.dp, case.cp, 1, 8, 0, case.seq)
        return float(evaluate(*args, options, eff)["memory_states_gb"])

    assert mem(case.options, default_efficiency()) < mem(fp32, default_efficiency()) - 5.0
    # the simulator's frozen revision 1 charges what it always did
    assert mem(case.options, jobspeed_efficiency()) == pytest.approx(mem(fp32, jobspeed_efficiency()))


def test_default_options_unchanged():
    assert TrainOptions().grad_reduce_bytes == 4 and not TrainOptions().sharded_fp32_params
