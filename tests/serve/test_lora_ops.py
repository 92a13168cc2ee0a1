"""Batched LoRA operators (SGMV / BGMV): torch and Triton backends against a dead-simple per-row loop oracle.

The Triton kernels run on CPU under TRITON_INTERPRET=1 (fp32 and fp16, small shapes: the interpreter is slow and
gives wrong bf16 results); the ``gpu`` tests run the compiled kernels (fp16/bf16/fp32) where CUDA exists.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from gpufleet.errors import ServeError  # noqa: E402
from gpufleet.serve.ops import get_lora_ops, group_rows, lora_torch, segments_from_indices  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
INTERPRET_AT_START = os.environ.get("TRITON_INTERPRET") == "1"  # conftest sets it on CPU-only machines
TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


# ---------------------------------------------------------------------------------------------------- oracle
def oracle_shrink(x, a_stack, idx, ranks=None):
    """v[i] = x[i] @ A[idx[i]] in float64, one row at a time (only the first ranks[l] columns of a padded slot)."""
    v = torch.zeros(x.shape[0], a_stack.shape[2], dtype=torch.float64)
    for i in range(x.shape[0]):
        slot = int(idx[i])
        if slot >= 0:
            r = a_stack.shape[2] if ranks is None else ranks[slot]
            v[i, :r] = x[i].double().cpu() @ a_stack[slot, :, :r].double().cpu()
    return v


def oracle_add_lora(y, x, a_stack, b_stack, scales, idx, ranks=None):
    """y[i] + scale[l] * x[i] @ A[l] @ B[l] in float64, one row at a time."""
    out = y.double().cpu().clone()
    v = oracle_shrink(x, a_stack, idx, ranks)
    for i in range(x.shape[0]):
        slot = int(idx[i])
        if slot >= 0:
            r = b_stack.shape[1] if ranks is None else ranks[slot]
            out[i] += float(scales[slot]) * (v[i, :r] @ b_stack[slot, :r].double().cpu())
    return out


def rows_of_segments(seg_indptr, seg_lora, rows):
    """The per-row slot ids that segments describe (-1 outside every segment)."""
    idx = [-1] * rows
    for s, slot in enumerate(seg_lora.tolist()):
        for i in range(int(seg_indptr[s]), int(seg_indptr[s + 1])):
            idx[i] = slot
    return torch.tensor(idx)


# ---------------------------------------------------------------------------------------------------- inputs
def make_case(rows, h_in, h_out, rank, slots, dtype, seed=0, ranks=None, device="cpu"):
    """Random x, y, stacks and scales of O(1) magnitude; slots of smaller rank are zero-padded to ``rank``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, h_in, generator=g)
    y = torch.randn(rows, h_out, generator=g)
    a = torch.randn(slots, h_in, rank, generator=g) / h_in**0.5
    b = torch.randn(slots, rank, h_out, generator=g) / rank**0.5
    if ranks is not None:
        for slot, r in enumerate(ranks):
            a[slot, :, r:] = 0
            b[slot, r:, :] = 0
    scales = torch.rand(slots, generator=g) + 0.5
    return [t.to(device=device, dtype=dtype) for t in (x, y, a, b)] + [scales.to(device)]


def assert_close(got, ref, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(got.double().cpu(), ref, rtol=tol, atol=tol)


def random_idx(rows, slots, seed, none_share=0.2):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, slots, (rows,), generator=g)
    idx[torch.rand(rows, generator=g) < none_share] = -1
    return idx


# ---------------------------------------------------------------------------------------------------- metadata
def test_segments_from_indices_runs_and_empty():
    indptr, lora = segments_from_indices(torch.tensor([2, 2, -1, 0, 0, 0, 2]))
    assert indptr.tolist() == [0, 2, 3, 6, 7]
    assert lora.tolist() == [2, -1, 0, 2]
    indptr, lora = segments_from_indices(torch.zeros(0, dtype=torch.long))
    assert indptr.tolist() == [0] and lora.tolist() == []


def test_group_rows_is_a_stable_sort_into_segments():
    idx = torch.tensor([3, -1, 1, 3, 1, 0, -1, 3])
    order, indptr, lora = group_rows(idx)
    assert sorted(order.tolist()) == list(range(8))
    assert order.tolist() == [1, 6, 5, 2, 4, 0, 3, 7]  # stable: equal ids keep their order
    assert lora.tolist() == [-1, 0, 1, 3]
    assert torch.equal(rows_of_segments(indptr, lora, 8), idx[order])


# ---------------------------------------------------------------------------------------------------- torch backend
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rank", [8, 16, 24, 32, 64, 128])
@pytest.mark.parametrize(("h_in", "h_out"), [(37, 129), (1000, 37), (129, 1000)])
def test_torch_bgmv_matches_oracle(dtype, rank, h_in, h_out):
    ops = get_lora_ops("torch")
    x, y, a, b, scales = make_case(23, h_in, h_out, rank, 6, dtype, seed=rank + h_in)
    idx = random_idx(23, 6, seed=rank)
    v = ops.bgmv_shrink(x, a, idx)
    assert v.dtype == torch.float32 and v.shape == (23, rank)
    assert_close(v, oracle_shrink(x, a, idx), torch.float32)
    out = ops.bgmv_expand(y.clone(), v, b, idx, scales)
    assert out.dtype == dtype
    assert_close(out, oracle_add_lora(y, x, a, b, scales, idx), dtype)


@pytest.mark.parametrize(
    ("rows", "slots", "grouped", "sorts"),
    [(4, 4, False, False), (64, 8, False, True), (64, 8, True, False), (3, 32, False, False)],
)
def test_torch_bgmv_both_strategies(monkeypatch, rows, slots, grouped, sorts):
    """Few runs of equal ids are computed in place; many runs are first sorted by slot (Punica's regrouping)."""
    calls = []
    monkeypatch.setattr(lora_torch, "group_rows", lambda idx, _f=lora_torch.group_rows: calls.append(1) or _f(idx))
    monkeypatch.setattr(lora_torch, "_padded_pays", lambda idx: False)  # the padded form has its own test
    x, y, a, b, scales = make_case(rows, 65, 70, 16, slots, torch.float32, seed=rows)
    idx = random_idx(rows, slots, seed=slots)
    if grouped:
        idx = idx.sort().values
    out = get_lora_ops("torch").add_lora(y.clone(), x, a, b, scales, idx=idx)
    assert_close(out, oracle_add_lora(y, x, a, b, scales, idx), torch.float32)
    assert bool(calls) == sorts


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("rows", "slots", "expect_padded"), [(32, 32, True), (32, 6, True), (40, 8, True), (32, 1, False), (9, 3, False)]
)
def test_torch_padded_form_for_many_adapters(monkeypatch, dtype, rows, slots, expect_padded):
    """Many adapters with few rows each run as one padded bmm pair over the slots in use; same result."""
    calls = []
    real = lora_torch._add_lora_padded
    monkeypatch.setattr(lora_torch, "_add_lora_padded", lambda *a: calls.append(1) or real(*a))
    x, y, a, b, scales = make_case(rows, 129, 37, 16, slots + 3, dtype, seed=rows + slots)
    if slots == rows:  # Distinct: every row its own adapter
        idx = torch.randperm(rows, generator=torch.Generator().manual_seed(1))
    else:
        idx = torch.arange(rows) % slots
    idx = idx + 2  # slots 2 .. slots+1: a range that does not start at 0
    idx[::7] = -1
    out = get_lora_ops("torch").add_lora(y.clone(), x, a, b, scales, idx=idx)
    assert_close(out, oracle_add_lora(y, x, a, b, scales, idx), dtype)
    assert bool(calls) == expect_padded


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_torch_dense_plan_for_a_full_distinct_batch(dtype):
    """Row i on slot lo + i for every row (a full Distinct batch sorted by slot) takes the no-padding path; any
    other layout does not, and both match the oracle."""
    x, y, a, b, scales = make_case(12, 129, 37, 16, 20, dtype, seed=3)
    dense = torch.arange(12) + 5
    for idx, expect in (
        (dense, True),
        (dense.flip(0), False),
        (torch.cat([dense[:6], dense[7:], dense[6:7]]), False),
        (torch.cat([dense[:11], torch.tensor([-1])]), False),
    ):
        plan = lora_torch.padded_plan(idx)
        assert plan is not None and plan.dense == expect
        out = lora_torch.add_lora_planned(y.clone(), x, a, b, scales, plan)
        assert_close(out, oracle_add_lora(y, x, a, b, scales, idx), dtype)


SEGMENT_CASES = {
    "mixed": ([0, 3, 3, 9, 10, 16], [2, 0, -1, 1, 3]),  # an empty and a -1 segment
    "rows_outside": ([2, 5, 11], [1, 0]),  # rows 0-1 and 11-23 belong to no segment
    "one_adapter": ([0, 16], [3]),
    "many_tiny": (list(range(25)), [i % 5 - 1 for i in range(24)]),  # regrouped by slot before the matmuls
    "none": ([0], []),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", list(SEGMENT_CASES))
def test_torch_sgmv_matches_oracle(dtype, case):
    ops = get_lora_ops("torch")
    indptr, lora = (torch.tensor(t, dtype=torch.long) for t in SEGMENT_CASES[case])
    x, y, a, b, scales = make_case(24, 129, 37, 24, 4, dtype, seed=len(case))
    idx = rows_of_segments(indptr, lora, 24)
    v = ops.sgmv_shrink(x, a, indptr, lora)
    assert v.dtype == torch.float32
    assert_close(v, oracle_shrink(x, a, idx), torch.float32)
    out = ops.sgmv_expand(y.clone(), v, b, indptr, lora, scales)
    assert_close(out, oracle_add_lora(y, x, a, b, scales, idx), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", list(SEGMENT_CASES))
def test_torch_segment_plan_reused_across_projections_matches_oracle(dtype, case):
    """The per-step segment plan (host lists made once) gives the oracle's result on every projection it serves,
    including many tiny segments (regrouped by slot) and rows outside every segment."""
    indptr, lora = (torch.tensor(t, dtype=torch.long) for t in SEGMENT_CASES[case])
    _, _, _, _, scales = make_case(24, 129, 37, 24, 4, dtype, seed=1)
    plan = lora_torch.segment_plan(indptr, lora, 24, scales)
    idx = rows_of_segments(indptr, lora, 24)
    for h_in, h_out, seed in ((129, 37, 2), (37, 129, 3)):  # two projections of different shapes, one plan
        x, y, a, b, _ = make_case(24, h_in, h_out, 24, 4, dtype, seed=seed)
        out = lora_torch.add_lora_segments_planned(y.clone(), x, a, b, plan)
        assert_close(out, oracle_add_lora(y, x, a, b, scales, idx), dtype)


def test_torch_segment_plan_refuses_bad_segments():
    with pytest.raises(ServeError, match="non-decreasing"):
        lora_torch.segment_plan(torch.tensor([0, 5, 3]), torch.tensor([0, 1]), 8, torch.ones(2))


@pytest.mark.parametrize("form", ["idx", "segments"])
def test_torch_padding_to_the_stack_rank_changes_nothing(form):
    ranks = [4, 8, 16, 11]
    x, y, a, b, scales = make_case(20, 100, 90, 16, 4, torch.float32, seed=7, ranks=ranks)
    idx = torch.tensor([0] * 5 + [1] * 3 + [-1] * 2 + [2] * 6 + [3] * 4)
    ops = get_lora_ops("torch")
    if form == "idx":
        out = ops.add_lora(y.clone(), x, a, b, scales, idx=idx)
    else:
        indptr, lora = segments_from_indices(idx)
        out = ops.add_lora(y.clone(), x, a, b, scales, seg_indptr=indptr, seg_lora=lora)
    assert_close(out, oracle_add_lora(y, x, a, b, scales, idx, ranks=ranks), torch.float32)


def test_torch_writes_into_strided_views():
    """y may be a column slice of a packed output (q|k|v) and x a row slice; only the view changes."""
    x, _, a, b, scales = make_case(12, 40, 30, 8, 3, torch.float32, seed=3)
    packed = torch.randn(12, 100)
    before = packed.clone()
    idx = torch.tensor([0, 1, 2, -1] * 3)
    get_lora_ops("torch").add_lora(packed[:, 50:80], x, a, b, scales, idx=idx)
    assert_close(packed[:, 50:80], oracle_add_lora(before[:, 50:80], x, a, b, scales, idx), torch.float32)
    assert torch.equal(packed[:, :50], before[:, :50]) and torch.equal(packed[:, 80:], before[:, 80:])


def test_torch_empty_batch():
    ops = get_lora_ops("torch")
    x, y, a, b, scales = make_case(0, 16, 16, 8, 2, torch.float32)
    assert ops.bgmv_shrink(x, a, torch.zeros(0, dtype=torch.long)).shape == (0, 8)
    assert ops.add_lora(y, x, a, b, scales, idx=torch.zeros(0, dtype=torch.long)).shape == (0, 16)


# ---------------------------------------------------------------------------------------------------- errors, choice
def test_bad_calls_raise_serve_error():
    ops = get_lora_ops("torch")
    x, y, a, b, scales = make_case(4, 16, 12, 8, 2, torch.float32)
    idx = torch.tensor([0, 1, 0, 1])
    indptr, lora = torch.tensor([0, 4]), torch.tensor([0])
    with pytest.raises(ServeError, match="either idx"):
        ops.add_lora(y, x, a, b, scales, idx=idx, seg_indptr=indptr, seg_lora=lora)
    with pytest.raises(ServeError, match="either idx"):
        ops.add_lora(y, x, a, b, scales, seg_indptr=indptr)
    with pytest.raises(ServeError, match="h_in"):
        ops.bgmv_shrink(x[:, :10], a, idx)
    with pytest.raises(ServeError, match="one per row"):
        ops.bgmv_shrink(x, a, idx[:3])
    with pytest.raises(ServeError, match="non-decreasing"):
        ops.sgmv_shrink(x, a, torch.tensor([0, 3, 2]), torch.tensor([0, 1]))
    with pytest.raises(ServeError, match="S\\+1"):
        ops.sgmv_shrink(x, a, torch.tensor([0, 4]), torch.tensor([0, 1]))
    with pytest.raises(ServeError, match="scales"):
        ops.bgmv_expand(y, torch.zeros(4, 8), b, idx, scales[:1])


def test_backend_choice(monkeypatch):
    assert get_lora_ops("torch").name == "torch"
    assert get_lora_ops("auto").name == ("auto" if HAS_CUDA and HAS_TRITON else "torch")
    with pytest.raises(ServeError, match="unknown LoRA backend"):
        get_lora_ops("cutlass")
    if not HAS_CUDA:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        with pytest.raises(ServeError, match="TRITON_INTERPRET=1"):
            get_lora_ops("triton")


def test_auto_dispatch_sends_cpu_tensors_to_torch():
    from gpufleet.serve.ops import LoraOps, _by_device

    def refuse(*args, **kwargs):
        raise AssertionError("CPU tensors reached the CUDA backend")

    torch_ops = get_lora_ops("torch")
    never = LoraOps("never", refuse, refuse, refuse, refuse, refuse)
    auto = _by_device("auto", torch_ops, never)
    x, y, a, b, scales = make_case(5, 30, 20, 8, 2, torch.float32)
    idx = torch.tensor([1, 0, -1, 1, 1])
    out = auto.add_lora(y.clone(), x, a, b, scales, idx=idx)
    assert_close(out, oracle_add_lora(y, x, a, b, scales, idx), torch.float32)
    assert_close(auto.bgmv_shrink(x, a, idx), oracle_shrink(x, a, idx), torch.float32)


def test_importing_the_ops_does_not_import_triton():
    code = "import sys, gpufleet.serve.ops as o; o.get_lora_ops('torch'); assert 'triton' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---------------------------------------------------------------------------------------------------- triton, CPU
@pytest.fixture
def interpreted(monkeypatch):
    """The Triton backend with kernels jitted under TRITON_INTERPRET=1 (checked: they are InterpretedFunctions)."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    if not INTERPRET_AT_START:
        # triton.language's own helpers were jitted compiled when triton was imported, and the interpreter cannot
        # call them: on a GPU machine the compiled tests above check the kernels; run these with TRITON_INTERPRET=1
        pytest.skip("Triton's interpreter needs TRITON_INTERPRET=1 before triton is imported (set it to run these)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from triton.runtime.interpreter import InterpretedFunction

    from gpufleet.serve.ops import lora_triton

    assert isinstance(lora_triton._kernel(lora_triton._sgmv_shrink_kernel), InterpretedFunction)
    return get_lora_ops("triton")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("rows", "h_in", "h_out", "rank"), [(9, 129, 37, 24), (2, 300, 70, 8), (5, 37, 1000, 128)])
def test_triton_bgmv_interpreted_matches_oracle(interpreted, dtype, rows, h_in, h_out, rank):
    x, y, a, b, scales = make_case(rows, h_in, h_out, rank, 3, dtype, seed=rows)
    idx = torch.tensor([0, -1, 2, 1, 2, 0, -1, 1, 1][:rows])
    v = interpreted.bgmv_shrink(x, a, idx)
    assert v.dtype == torch.float32
    assert_close(v, oracle_shrink(x, a, idx), torch.float32)
    out = interpreted.bgmv_expand(y.clone(), v, b, idx, scales)
    assert out.dtype == dtype
    assert_close(out, oracle_add_lora(y, x, a, b, scales, idx), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", ["mixed", "rows_outside", "one_adapter"])
def test_triton_sgmv_interpreted_matches_oracle(interpreted, dtype, case):
    indptr, lora = (torch.tensor(t, dtype=torch.long) for t in SEGMENT_CASES[case])
    x, y, a, b, scales = make_case(24, 129, 37, 24, 4, dtype, seed=len(case))
    idx = rows_of_segments(indptr, lora, 24)
    v = interpreted.sgmv_shrink(x, a, indptr, lora)
    assert_close(v, oracle_shrink(x, a, idx), torch.float32)
    out = interpreted.sgmv_expand(y.clone(), v, b, indptr, lora, scales)
    assert_close(out, oracle_add_lora(y, x, a, b, scales, idx), dtype)


def test_triton_split_k_and_padding_interpreted(interpreted, monkeypatch):
    """Forcing many programs splits h_in across them (atomic adds); padded slots still match the unpadded math."""
    from gpufleet.serve.ops import lora_triton

    monkeypatch.setattr(lora_triton, "_target_programs", lambda device: 64)
    ranks = [8, 16, 5]
    x, y, a, b, scales = make_case(6, 520, 33, 16, 3, torch.float32, seed=11, ranks=ranks)
    idx = torch.tensor([2, 2, 0, 1, 1, -1])
    assert lora_triton._split_k(6, 3, x.device) > 1
    indptr, lora = segments_from_indices(idx)
    ref = oracle_add_lora(y, x, a, b, scales, idx, ranks=ranks)
    assert_close(interpreted.add_lora(y.clone(), x, a, b, scales, idx=idx), ref, torch.float32)
    assert_close(interpreted.add_lora(y.clone(), x, a, b, scales, seg_indptr=indptr, seg_lora=lora), ref, torch.float32)


def test_triton_writes_into_strided_views_interpreted(interpreted):
    x, _, a, b, scales = make_case(6, 40, 30, 8, 3, torch.float16, seed=5)
    packed = torch.randn(6, 100).half()
    before = packed.clone()
    idx = torch.tensor([0, 1, 2, -1, 1, 0])
    interpreted.add_lora(packed[:, 50:80], x, a, b, scales, idx=idx)
    assert_close(packed[:, 50:80], oracle_add_lora(before[:, 50:80], x, a, b, scales, idx), torch.float16)
    assert torch.equal(packed[:, :50], before[:, :50]) and torch.equal(packed[:, 80:], before[:, 80:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("h_in", "h_out", "rank"), [(129, 37, 24), (37, 300, 128), (64, 48, 8)])
def test_triton_step_tiles_interpreted_match_oracle(interpreted, dtype, h_in, h_out, rank):
    """The engine's fused path: a step's rows (a prompt run longer than one tile, no-adapter rows, one-row decodes
    of distinct adapters) planned once as tiles, then one kernel per projection, on padded-rank slots too."""
    slots = [2] * 20 + [-1] * 3 + [0] + [3] * 17 + [1, -1, 3, 0]
    ranks = [rank, max(1, rank // 2), rank, 5]
    x, y, a, b, scales = make_case(len(slots), h_in, h_out, rank, 4, dtype, seed=h_in, ranks=ranks)
    plan = interpreted.plan_rows(slots, "cpu")
    out = plan.add(y.clone(), x, a, b, scales)
    assert out.dtype == dtype
    assert_close(out, oracle_add_lora(y, x, a, b, scales, torch.tensor(slots), ranks=ranks), dtype)
    twice = plan.add(out.clone(), x, a, b, scales)  # the plan is reused by every projection of a step
    assert_close(twice, oracle_add_lora(out, x, a, b, scales, torch.tensor(slots), ranks=ranks), dtype)


def test_triton_step_tiles_cut_runs_and_skip_rows_without_adapter(interpreted):
    from gpufleet.serve.ops import lora_triton

    slots = [4] * 35 + [-1, -1] + [1] + [4]
    plan = interpreted.plan_rows(slots, "cpu")
    assert plan.rows == len(slots) and plan.count == 5
    starts, ends, tile_slots = plan.tiles.tolist()
    assert list(zip(starts, ends, tile_slots, strict=True)) == [
        (0, 16, 4),
        (16, 32, 4),
        (32, 35, 4),
        (37, 38, 1),
        (38, 39, 4),
    ]
    assert all(e - s <= lora_triton.TILE_ROWS for s, e in zip(starts, ends, strict=True))
    assert interpreted.plan_rows([-1, -1, -1], "cpu") is None
    x, y, a, b, scales = make_case(len(slots), 16, 16, 8, 5, torch.float32)
    with pytest.raises(ServeError, match="tile plan covers 39 rows"):
        plan.add(y[:10], x[:10], a, b, scales)


# ---------------------------------------------------------------------------------------------------- triton, GPU
gpu_only = pytest.mark.skipif(not (HAS_CUDA and HAS_TRITON), reason="needs a CUDA GPU and triton")


@pytest.fixture
def compiled(monkeypatch):
    """The Triton backend with compiled (not interpreted) kernels."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return get_lora_ops("triton")


def cpu(*tensors):
    return [t.cpu() for t in tensors]


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("rows", "h_in", "h_out", "rank"),
    [(1, 4096, 4096, 16), (64, 4096, 11008, 64), (33, 1000, 129, 24), (256, 2048, 2048, 128)],
)
def test_triton_bgmv_on_gpu(compiled, dtype, rows, h_in, h_out, rank):
    x, y, a, b, scales = make_case(rows, h_in, h_out, rank, 8, dtype, seed=rows, device="cuda")
    idx = random_idx(rows, 8, seed=rows).cuda()
    v = compiled.bgmv_shrink(x, a, idx)
    assert v.dtype == torch.float32
    torch.testing.assert_close(v.double().cpu(), oracle_shrink(*cpu(x, a, idx)), rtol=1e-3, atol=1e-3)
    out = compiled.bgmv_expand(y.clone(), v, b, idx, scales)
    assert out.dtype == dtype
    assert_close(out, oracle_add_lora(*cpu(y, x, a, b, scales, idx)), dtype)
    assert_close(out, get_lora_ops("torch").add_lora(y.clone(), x, a, b, scales, idx=idx).double().cpu(), dtype)


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rank", [16, 64])
@pytest.mark.parametrize("host_segments", [True, False])
def test_triton_sgmv_on_gpu(compiled, dtype, rank, host_segments):
    indptr = torch.tensor([3, 100, 100, 300, 301, 500, 509])
    lora = torch.tensor([2, 0, -1, 5, 1, 7])
    x, y, a, b, scales = make_case(512, 4096, 1000, rank, 8, dtype, seed=rank, device="cuda")
    if not host_segments:  # on the GPU: the kernels size the grid without reading them back
        indptr, lora = indptr.cuda(), lora.cuda()
    idx = rows_of_segments(indptr.cpu(), lora.cpu(), 512)
    v = compiled.sgmv_shrink(x, a, indptr, lora)
    torch.testing.assert_close(v.double().cpu(), oracle_shrink(*cpu(x, a), idx), rtol=1e-3, atol=1e-3)
    out = compiled.sgmv_expand(y.clone(), v, b, indptr, lora, scales)
    assert_close(out, oracle_add_lora(*cpu(y, x, a, b, scales), idx), dtype)


@pytest.mark.gpu
@gpu_only
def test_auto_runs_triton_on_cuda_tensors_and_torch_on_cpu_ones(compiled, monkeypatch):
    from gpufleet.serve.ops import lora_torch, lora_triton

    used = []
    for module, name in ((lora_triton, "triton"), (lora_torch, "torch")):  # spies first: auto binds at creation
        monkeypatch.setattr(
            module, "add_lora", lambda *a, _f=module.add_lora, _n=name, **k: used.append(_n) or _f(*a, **k)
        )
    auto = get_lora_ops("auto")
    assert compiled.name == "triton" and auto.name == "auto"
    for device in ("cuda", "cpu"):
        x, y, a, b, scales = make_case(8, 64, 48, 16, 4, torch.float32, device=device)
        idx = torch.tensor([0, 1, -1, 3, 3, 2, 0, 1], device=device)
        out = auto.add_lora(y.clone(), x, a, b, scales, idx=idx)
        assert_close(out, oracle_add_lora(*cpu(y, x, a, b, scales, idx)), torch.float32)
    assert used == ["triton", "torch"]


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("h_in", "h_out", "rank"), [(4096, 11008, 16), (2048, 2048, 64), (1000, 129, 24)])
def test_triton_step_tiles_on_gpu(compiled, dtype, h_in, h_out, rank):
    slots = [3] * 40 + [-1] * 5 + list(range(8)) + [5] * 7
    x, y, a, b, scales = make_case(len(slots), h_in, h_out, rank, 8, dtype, seed=rank, device="cuda")
    plan = compiled.plan_rows(slots, "cuda")
    out = plan.add(y.clone(), x, a, b, scales)
    assert_close(out, oracle_add_lora(*cpu(y, x, a, b, scales), torch.tensor(slots)), dtype)
