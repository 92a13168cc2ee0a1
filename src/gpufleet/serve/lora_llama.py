"""A Llama-architecture model whose seven projections add per-request LoRA deltas (Punica's batched LoRA).

Parameter names follow Hugging Face's ``LlamaForCausalLM`` (``model.layers.0.self_attn.q_proj.weight`` ...), so a
safetensors folder loads with ``load_state_dict`` and PEFT adapters name the same modules. One ``forward`` runs
a whole engine step: the prompts being prefilled and one token of every decoding request, in one batch whose
rows may each belong to a different adapter. The base weights run one GEMM for all rows; each projection then
adds ``scale · (x @ A[slot]) @ B[slot]`` through the SGMV / BGMV operators.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gpufleet.serve.config import LlamaConfig
from gpufleet.serve.kv_cache import KVCache
from gpufleet.serve.ops.lora_torch import add_lora_planned, add_lora_segments_planned

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoRABatch:
    """Which adapter slot each row uses and where the stacked adapter weights are.

    ``stacks(layer, proj) -> (a [L, h_in, r], b [L, r, h_out]) | None`` (None: no adapter targets it);
    ``row_slots`` [N] (-1: no adapter); ``seg_indptr`` / ``seg_lora``: the same as contiguous segments (rows are
    grouped by slot), used for the prompt rows; the per-row form serves the decode rows.
    """

    stacks: object
    scales: torch.Tensor
    row_slots: torch.Tensor
    seg_indptr: torch.Tensor
    seg_lora: torch.Tensor
    ops: object
    any_adapter: bool
    decode_plan: object = None  # a per-step padded layout of the decode rows (torch backend on CPU), or None
    prefill_plan: object = None  # the prompt rows' segments as host lists (torch backend on CPU), or None
    step_plan: object = None  # every row's tiles for a fused kernel (``add(y, x, a, b, scales)``, Triton), or None


@dataclass
class DecodeGroup:
    """Decode rows of similar context length, attended together: their K/V gathered into one padded table."""

    rows: torch.Tensor  # [d] positions among the step's decode rows
    slot_table: torch.Tensor  # [d, T] pool positions of each row's context (padded with 0)
    mask: torch.Tensor  # [d, 1, 1, T] True where the table holds context


#: A decode row joins a group while its context is at least this share of the group's longest, so padding
#: never more than doubles the K/V that attention reads (one table padded to the longest context in the batch
#: read 3-4x the real K/V at Punica's length spread)
GROUP_FILL = 0.5


def decode_groups(contexts: list[torch.Tensor], device: torch.device | str = "cpu") -> list[DecodeGroup]:
    """Split decode rows (each with its context's pool positions) into groups by length, longest first."""
    order = sorted(range(len(contexts)), key=lambda i: -len(contexts[i]))
    groups: list[list[int]] = []
    for i in order:
        if groups and len(contexts[i]) >= GROUP_FILL * len(contexts[groups[-1][0]]):
            groups[-1].append(i)
        else:
            groups.append([i])
    out = []
    for members in groups:
        longest = len(contexts[members[0]])
        table = torch.zeros(len(members), longest, dtype=torch.long)
        lengths = torch.tensor([len(contexts[i]) for i in members])
        for row, i in enumerate(members):
            table[row, : len(contexts[i])] = contexts[i]
        mask = (torch.arange(longest)[None, :] < lengths[:, None])[:, None, None, :]
        out.append(DecodeGroup(torch.tensor(members, device=device), table.to(device), mask.to(device)))
    return out


@dataclass
class StepBatch:
    """One engine step's rows: prompts first (each a contiguous run), then one row per decoding request."""

    tokens: torch.Tensor  # [N] long
    positions: torch.Tensor  # [N] long
    slots: torch.Tensor  # [N] flat KV-pool position of each row's K/V
    prefill_spans: list[tuple[int, int]]  # (first row, length) of each prompt
    decode_rows: int  # the last decode_rows rows are decodes
    decode_groups: list[DecodeGroup]  # the decode rows by context length (context includes the new token)
    logits_rows: torch.Tensor  # rows whose next-token logits are wanted (last of each prompt, every decode)


def attention_backends(device: torch.device) -> contextlib.AbstractContextManager:
    """SDPA kernels for a step on ``device``: on CUDA, flash / memory-efficient / math but not cuDNN.

    cuDNN's attention builds an execution plan for every new shape, about 27 ms each on an H200 (torch 2.11);
    decode groups change shape every step (rows, context length), so serving spent most of its time planning:
    the first run of the wide model's Distinct bench went at 669 tokens/s, a second run over the now-cached
    shapes at 4,943."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inverse_frequencies(config: LlamaConfig) -> torch.Tensor:
    """RoPE frequencies, with Llama 3's scaling of the low frequencies when the config asks for it."""
    dim = config.head_size
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling
    if not scaling:
        return inv.float()
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    original = scaling.get("original_max_position_embeddings", 8192)
    wavelen = 2 * math.pi / inv
    low_wavelen, high_wavelen = original / low, original / high
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_mid, mid, scaled).float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE (Hugging Face's rotate-half convention) to x [N, heads, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        h, hd = config.hidden_size, config.head_size
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.q_proj = nn.Linear(h, self.heads * hd, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.heads * hd, h, bias=False)


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaBody(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaLoRAForCausalLM(nn.Module):
    """Llama with batched multi-adapter LoRA on q, k, v, o, gate, up and down; HF parameter names."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaBody(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inverse_frequencies(config), persistent=False)

    # ---------------------------------------------------------------------------------------- pieces
    def _project(
        self, x: torch.Tensor, layer: int, name: str, linear: nn.Linear, lora: LoRABatch | None, prefill_rows: int
    ) -> torch.Tensor:
        y = F.linear(x, linear.weight)
        if lora is None or not lora.any_adapter:
            return y
        stacks = lora.stacks(layer, name)
        if stacks is None:
            return y
        a, b = stacks
        if lora.step_plan is not None:  # prompt and decode rows together, one launch planned once per step
            return lora.step_plan.add(y, x, a, b, lora.scales)
        if prefill_rows and lora.prefill_plan is not None:  # prompt rows, segments planned once per step
            add_lora_segments_planned(y[:prefill_rows], x[:prefill_rows], a, b, lora.prefill_plan)
        elif prefill_rows:  # prompt rows: segments (one adapter per run of rows)
            lora.ops.add_lora(
                y[:prefill_rows],
                x[:prefill_rows],
                a,
                b,
                lora.scales,
                seg_indptr=lora.seg_indptr,
                seg_lora=lora.seg_lora,
            )
        if prefill_rows < x.shape[0] and lora.decode_plan is not None:  # decode rows, layout planned once per step
            add_lora_planned(y[prefill_rows:], x[prefill_rows:], a, b, lora.scales, lora.decode_plan)
        elif prefill_rows < x.shape[0]:  # decode rows: one adapter index per row
            lora.ops.add_lora(y[prefill_rows:], x[prefill_rows:], a, b, lora.scales, idx=lora.row_slots[prefill_rows:])
        return y

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]

    def _attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: StepBatch, kv: KVCache
    ) -> torch.Tensor:
        """Causal attention of each prompt over itself, and of each decode row over its cached context."""
        kv.write(layer, batch.slots, k, v)
        out = torch.empty_like(q)
        for start, length in batch.prefill_spans:
            qs = q[start : start + length].transpose(0, 1)
            ks = k[start : start + length].transpose(0, 1)
            vs = v[start : start + length].transpose(0, 1)
            out[start : start + length] = F.scaled_dot_product_attention(
                qs, ks, vs, is_causal=True, enable_gqa=True
            ).transpose(0, 1)
        d = batch.decode_rows
        if d:
            q_dec, out_dec = q[-d:], out[-d:]
            for group in batch.decode_groups:
                kd, vd = kv.gather(layer, group.slot_table)  # [d, T, kvh, hd], valid until the next gather
                qd = q_dec.index_select(0, group.rows).unsqueeze(2)  # [d, h, 1, hd]
                att = F.scaled_dot_product_attention(
                    qd, kd.transpose(1, 2), vd.transpose(1, 2), attn_mask=group.mask, enable_gqa=True
                )
                out_dec.index_copy_(0, group.rows, att.squeeze(2))
        return out

    # ---------------------------------------------------------------------------------------- forward
    @torch.inference_mode()
    def forward(self, batch: StepBatch, kv: KVCache, lora: LoRABatch | None = None) -> torch.Tensor:
        """Next-token logits [len(batch.logits_rows), vocab] for one engine step."""
        n = batch.tokens.shape[0]
        prefill_rows = n - batch.decode_rows
        x = self.model.embed_tokens(batch.tokens)
        cos, sin = self._rope(batch.positions, x.dtype)
        with attention_backends(x.device):
            x = self._layers(x, cos, sin, n, prefill_rows, batch, kv, lora)
        x = self.model.norm(x[batch.logits_rows])
        return F.linear(x, self.lm_head.weight).float()

    def _layers(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        n: int,
        prefill_rows: int,
        batch: StepBatch,
        kv: KVCache,
        lora: LoRABatch | None,
    ) -> torch.Tensor:
        for i, layer in enumerate(self.model.layers):
            att, mlp = layer.self_attn, layer.mlp
            h = layer.input_layernorm(x)
            q = self._project(h, i, "q_proj", att.q_proj, lora, prefill_rows).view(n, att.heads, att.head_dim)
            k = self._project(h, i, "k_proj", att.k_proj, lora, prefill_rows).view(n, att.kv_heads, att.head_dim)
            v = self._project(h, i, "v_proj", att.v_proj, lora, prefill_rows).view(n, att.kv_heads, att.head_dim)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            a = self._attention(q, k, v, i, batch, kv).reshape(n, att.heads * att.head_dim)
            x = x + self._project(a, i, "o_proj", att.o_proj, lora, prefill_rows)
            h = layer.post_attention_layernorm(x)
            gate = self._project(h, i, "gate_proj", mlp.gate_proj, lora, prefill_rows)
            up = self._project(h, i, "up_proj", mlp.up_proj, lora, prefill_rows)
            x = x + self._project(F.silu(gate) * up, i, "down_proj", mlp.down_proj, lora, prefill_rows)
        return x
