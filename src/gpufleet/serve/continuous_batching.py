"""The serving engine: continuous batching of requests for many adapters over one base model (vLLM's shape:
the scheduler decides, the model runs, the engine loops).

Every ``step`` admits waiting requests first-come-first-served (batch cap, free KV blocks, an adapter slot),
then runs ONE forward over the new prompts and one token of every running request, whatever their adapters, and
samples the next tokens. A request that cannot get a KV block for its next token preempts the newest running
request, which goes back to the head of the queue and is recomputed later (prompt + what it generated).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from itertools import groupby

import torch

from gpufleet.errors import ServeError
from gpufleet.serve.adapters import AdapterCache, AdapterStore, LoRAAdapter
from gpufleet.serve.kv_cache import KVCache
from gpufleet.serve.lora_llama import LlamaLoRAForCausalLM, LoRABatch, StepBatch, decode_groups
from gpufleet.serve.ops.lora_torch import padded_plan, segment_plan
from gpufleet.serve.protocol import GenerationChunk, OverloadedError, SamplingParams, UnknownAdapterError
from gpufleet.serve.sampling import sample_next
from gpufleet.serve.tokenizer import ByteTokenizer, Tokenizer


def _segments(row_slots: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs of equal consecutive slots as ``(seg_indptr, seg_lora)`` on ``device``, worked out on the host list
    (``segments_from_indices`` on a GPU tensor would wait for the device to report how many runs there are)."""
    indptr, lora = [0], []
    for slot, run in groupby(row_slots):
        indptr.append(indptr[-1] + sum(1 for _ in run))
        lora.append(slot)
    return (
        torch.tensor(indptr, dtype=torch.long).to(device),
        torch.tensor(lora, dtype=torch.long).to(device),
    )


@dataclass(frozen=True)
class EngineConfig:
    """Batch cap, KV cache size, adapter slots and queue bound of one engine (one GPU)."""

    max_batch: int = 32
    block_size: int = 16
    kv_blocks: int = 2048
    adapter_slots: int = 32
    max_rank: int | None = None
    max_waiting: int = 4096
    max_prefills_per_step: int | None = None
    lora_backend: str = "auto"


@dataclass
class Request:
    """One request's state from arrival to finish."""

    id: str
    prompt: list[int]
    adapter: str | None
    params: SamplingParams
    arrival: float
    output: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    cached: int = 0  # tokens whose K/V are in the cache
    slot: int = -1
    generator: torch.Generator | None = None
    text_sent: int = 0
    finish_reason: str | None = None
    preemptions: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def sort_key(self) -> int:
        return self.slot


class Engine:
    """Continuous batching over a LoRA-aware Llama; ``add_request`` then ``step`` until ``has_work`` is False."""

    def __init__(
        self,
        model: LlamaLoRAForCausalLM,
        store: AdapterStore,
        config: EngineConfig | None = None,
        tokenizer: Tokenizer | None = None,
        name: str = "base",
    ) -> None:
        from gpufleet.serve.ops import get_lora_ops

        self.model, self.store, self.config = model, store, config or EngineConfig()
        self.name = name
        cfg = model.config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.kv = KVCache(
            cfg.num_hidden_layers,
            self.config.kv_blocks,
            self.config.block_size,
            cfg.num_key_value_heads,
            cfg.head_size,
            dtype=self.dtype,
            device=self.device,
        )
        # the CPU (torch) operators compute LoRA in fp32: slots stored in fp32 convert each adapter once when it is
        # loaded, not its whole stack at every projection of every step (half of a bf16 step went to that copy)
        lora_dtype = torch.float32 if self.device.type == "cpu" else self.dtype
        self.adapters = AdapterCache(store, self.config.adapter_slots, self.config.max_rank, lora_dtype, self.device)
        self.ops = get_lora_ops(self.config.lora_backend)
        self.tokenizer = tokenizer or ByteTokenizer()
        self.eos = set(cfg.eos_ids) | set(self.tokenizer.eos_ids)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.steps = 0
        self.preemptions = 0

    # ------------------------------------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt: list[int], adapter: str | None, params: SamplingParams) -> Request:
        """Queue a request; unknown adapters and a full queue are refused here, before any work."""
        if adapter is not None and adapter not in self.store:
            raise UnknownAdapterError(f"adapter {adapter!r} is not served here; GET /v1/models lists the adapters")
        if len(self.waiting) >= self.config.max_waiting:
            raise OverloadedError(f"{len(self.waiting)} requests are waiting (--max-waiting); retry later")
        if not prompt:
            raise ServeError("the prompt is empty")
        limit = self.model.config.max_position_embeddings
        if len(prompt) >= limit:
            raise ServeError(f"the prompt has {len(prompt)} tokens; this model takes at most {limit - 1}")
        if self.kv.allocator.blocks_for(len(prompt) + 1) > self.kv.allocator.num_blocks:
            raise ServeError(f"the prompt has {len(prompt)} tokens, more than the whole KV cache holds")
        request = Request(request_id, list(prompt), adapter, params, time.monotonic())
        if params.seed is not None:
            request.generator = torch.Generator(device="cpu").manual_seed(params.seed)
        self.waiting.append(request)
        self.requests[request_id] = request
        return request

    def abort(self, request_id: str) -> None:
        """Drop a request wherever it is (client went away)."""
        request = self.requests.get(request_id)
        if request is None:
            return
        if request in self.running:
            self.running.remove(request)
            self._free(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.requests.pop(request_id, None)

    def add_adapter(self, adapter: LoRAAdapter) -> None:
        """Serve an adapter loaded at runtime; refused if its rank exceeds the slots' rank or the name is taken."""
        if adapter.name in self.store:
            raise ServeError(f"adapter {adapter.name!r} is already served")
        if adapter.rank > self.adapters.max_rank:
            raise ServeError(
                f"adapter {adapter.name!r} has rank {adapter.rank}, above this server's adapter slots "
                f"(rank {self.adapters.max_rank}); restart with --max-rank {adapter.rank} or more"
            )
        self.store.add(adapter)

    def remove_adapter(self, name: str) -> None:
        """Stop serving ``name``: out of its slot and out of the store. Refused while a request uses it."""
        users = [r.id for r in self.requests.values() if r.adapter == name]
        if users:
            raise ServeError(f"adapter {name!r} is used by {len(users)} request(s) in the engine; abort them first")
        if name in self.adapters.resident():
            self.adapters.drop(name, self.store.get(name))
        self.store.remove(name)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def state(self) -> dict[str, int]:
        """What a placement layer needs (batch size, free KV blocks, queue length) and adapter-slot counters."""
        return {
            "batch": len(self.running),
            "max_batch": self.config.max_batch,
            "waiting": len(self.waiting),
            "free_blocks": self.kv.allocator.free,
            "total_blocks": self.kv.allocator.num_blocks,
            "block_size": self.config.block_size,
            "adapter_hits": self.adapters.hits,
            "adapter_misses": self.adapters.misses,
            "adapter_loads": self.adapters.loads,
            "adapter_evictions": self.adapters.evictions,
        }

    # ------------------------------------------------------------------------------------------ scheduling
    def _free(self, request: Request) -> None:
        self.kv.allocator.release(request.blocks)
        request.blocks, request.cached = [], 0
        if request.slot >= 0 and request.adapter is not None:
            self.adapters.release(request.adapter)
        request.slot = -1

    def _ensure_decode_room(self) -> None:
        """Every running request needs a slot for one more token; preempt the newest while one cannot get it."""
        alloc = self.kv.allocator
        for request in sorted(self.running, key=lambda r: r.arrival):
            if request not in self.running:
                continue
            while alloc.blocks_for(request.cached + 1) > len(request.blocks):
                if alloc.free:
                    request.blocks += alloc.allocate(1)
                    continue
                victim = max(self.running, key=lambda r: r.arrival)
                self.running.remove(victim)
                self._free(victim)
                victim.preemptions += 1
                self.preemptions += 1
                self.waiting.appendleft(victim)
                if victim is request:
                    break

    def _admit(self) -> list[Request]:
        """FCFS admissions: stop at the first request that does not fit (head-of-line, as Punica does)."""
        admitted: list[Request] = []
        alloc = self.kv.allocator
        cap = self.config.max_prefills_per_step
        while self.waiting and len(self.running) < self.config.max_batch and (cap is None or len(admitted) < cap):
            request = self.waiting[0]
            need = alloc.blocks_for(len(request.tokens) + 1)
            if need > alloc.free or (request.adapter is not None and not self.adapters.can_acquire(request.adapter)):
                break
            self.waiting.popleft()
            request.blocks = alloc.allocate(need)
            request.slot = self.adapters.acquire(request.adapter) if request.adapter is not None else -1
            self.running.append(request)
            admitted.append(request)
        return admitted

    # ------------------------------------------------------------------------------------------ one step
    def step(self) -> list[GenerationChunk]:
        """Admit, run one forward over prompts and decodes, sample, and report one chunk per request."""
        self._ensure_decode_room()
        prefills = sorted(self._admit(), key=Request.sort_key)
        decodes = sorted((r for r in self.running if r not in prefills), key=Request.sort_key)
        if not prefills and not decodes:
            return []
        batch, lora = self._build(prefills, decodes)
        logits = self.model(batch, self.kv, lora)
        ordered = prefills + decodes
        for request in prefills:
            request.cached = len(request.tokens)
        for request in decodes:
            request.cached += 1
        next_ids = sample_next(logits, [r.params for r in ordered], [r.generator for r in ordered])
        self.steps += 1
        return [self._advance(request, token) for request, token in zip(ordered, next_ids, strict=True)]

    def _build(self, prefills: list[Request], decodes: list[Request]) -> tuple[StepBatch, LoRABatch]:
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[torch.Tensor] = []
        spans: list[tuple[int, int]] = []
        row_slots: list[int] = []
        for request in prefills:
            seq = request.tokens
            spans.append((len(tokens), len(seq)))
            tokens += seq
            positions += range(len(seq))
            slots.append(self.kv.slots(request.blocks, 0, len(seq)))
            row_slots += [request.slot] * len(seq)
        contexts = []
        for request in decodes:
            pos = request.cached  # the last sampled token is not cached yet
            tokens.append(request.tokens[-1])
            positions.append(pos)
            context = self.kv.slots(request.blocks, 0, pos + 1)
            contexts.append(context)
            slots.append(context[-1:])
            row_slots.append(request.slot)
        logits_rows = [start + length - 1 for start, length in spans] + list(
            range(len(tokens) - len(decodes), len(tokens))
        )
        dev = self.device
        batch = StepBatch(
            tokens=torch.tensor(tokens, device=dev),
            positions=torch.tensor(positions, device=dev),
            slots=torch.cat(slots).to(dev),
            prefill_spans=spans,
            decode_rows=len(decodes),
            decode_groups=decode_groups(contexts, dev),
            logits_rows=torch.tensor(logits_rows, device=dev),
        )
        row = torch.tensor(row_slots, dtype=torch.long, device=dev)
        prefill_rows = len(tokens) - len(decodes)
        any_adapter = any(s >= 0 for s in row_slots)  # from the host list: no read-back from the device
        seg_indptr, seg_lora = _segments(row_slots[:prefill_rows], dev)
        plan = prefill_plan = step_plan = None
        if any_adapter and self.ops.plan_rows is not None:  # Triton: every row's tiles, one launch per projection
            step_plan = self.ops.plan_rows(row_slots, dev)
        elif self.device.type == "cpu" and self.ops.name != "triton":  # torch kernels: plan the rows once per step
            if decodes:
                plan = padded_plan(row[prefill_rows:])
            if prefill_rows:
                prefill_plan = segment_plan(seg_indptr, seg_lora, prefill_rows, self.adapters.scales)
        lora = LoRABatch(
            stacks=self.adapters.stacks,
            scales=self.adapters.scales,
            row_slots=row,
            seg_indptr=seg_indptr,
            seg_lora=seg_lora,
            ops=self.ops,
            any_adapter=any_adapter,
            decode_plan=plan,
            prefill_plan=prefill_plan,
            step_plan=step_plan,
        )
        return batch, lora

    def _advance(self, request: Request, token: int) -> GenerationChunk:
        request.output.append(token)
        params = request.params
        reason = None
        text = self.tokenizer.decode(request.output)
        if (not params.ignore_eos and token in self.eos) or token in params.stop_token_ids:
            reason = "stop"
        elif params.stop and any(s in text for s in params.stop):
            cut = min(text.index(s) for s in params.stop if s in text)
            text = text[:cut]
            reason = "stop"
        elif (
            len(request.output) >= params.max_tokens or len(request.tokens) >= self.model.config.max_position_embeddings
        ):
            reason = "length"
        delta = text[request.text_sent :]
        if reason is None and delta.endswith("\ufffd"):  # half a UTF-8 character: wait for the rest
            delta = ""
        request.text_sent += len(delta)
        if reason is not None:
            request.finish_reason = reason
            self.running.remove(request)
            self._free(request)
            self.requests.pop(request.id, None)
        return GenerationChunk(
            request.id, token, delta, reason, prompt_tokens=len(request.prompt), completion_tokens=len(request.output)
        )
