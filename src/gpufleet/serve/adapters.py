"""LoRA adapters: read PEFT's format from disk, keep them in CPU memory, and stage the active ones in slots.

A PEFT adapter folder holds ``adapter_config.json`` (r, lora_alpha, target_modules, ...) and
``adapter_model.safetensors`` (``...layers.{i}.self_attn.q_proj.lora_A.weight`` [r, h_in] and ``lora_B.weight``
[h_out, r]). ``AdapterCache`` keeps ``slots`` adapters resident on the device in stacked tensors
(``a [slots, h_in, r_max]``, ``b [slots, r_max, h_out]`` per layer and projection), loads on demand and evicts
the least recently used adapter that no running request holds; evicted adapters stay in CPU memory.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from gpufleet.errors import ServeError
from gpufleet.serve.config import LlamaConfig
from gpufleet.serve.lora_llama import PROJECTIONS
from gpufleet.serve.protocol import UnknownAdapterError

_KEY = re.compile(
    r"layers\.(\d+)\.(?:self_attn|mlp)\.(" + "|".join(PROJECTIONS) + r")\.lora_([AB])(?:\.[\w-]+)?\.weight$"
)
_UNSUPPORTED = {"use_dora": "DoRA", "fan_in_fan_out": "fan_in_fan_out (Conv1D layers)"}


@dataclass
class LoRAAdapter:
    """One adapter on the CPU: per (layer, projection) ``(A [h_in, r], B [r, h_out])`` with its scale folded in B."""

    name: str
    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())


def _scale(config: dict, module_key: str, rank: int) -> float:
    alpha = config.get("alpha_pattern", {}).get(module_key, config.get("lora_alpha", rank))
    return alpha / (rank**0.5) if config.get("use_rslora") else alpha / rank


def load_peft_adapter(folder: str | Path, model_config: LlamaConfig, name: str | None = None) -> LoRAAdapter:
    """Read a PEFT LoRA folder; check its shapes against the base model; fold each module's scale into B."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path, weights_path = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not cfg_path.is_file() or not weights_path.is_file():
        raise ServeError(
            f"{folder}: a PEFT adapter needs adapter_config.json and adapter_model.safetensors "
            "(save it with PeftModel.save_pretrained)"
        )
    config = json.loads(cfg_path.read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise ServeError(f"{cfg_path}: peft_type {config.get('peft_type')!r}; only LoRA adapters can be batched")
    for key, what in _UNSUPPORTED.items():
        if config.get(key):
            raise ServeError(f"{cfg_path}: {what} is not supported by the batched LoRA kernels")
    if config.get("bias", "none") != "none" or config.get("modules_to_save"):
        raise ServeError(f"{cfg_path}: adapters that train biases or whole modules cannot share the base model")
    tensors = load_file(str(weights_path))
    parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.search(key)
        if match is None:
            raise ServeError(f"{weights_path}: tensor {key!r} is not a LoRA weight of a Llama projection")
        parts.setdefault((int(match[1]), match[2]), {})[match[3]] = tensor.float()
    weights = {}
    shapes = model_config.projection_shapes()
    rank = 0
    for (layer, proj), ab in sorted(parts.items()):
        if set(ab) != {"A", "B"} or layer >= model_config.num_hidden_layers:
            raise ServeError(
                f"{weights_path}: layer {layer} {proj} has {sorted(ab)} (needs lora_A and lora_B "
                f"of a layer below {model_config.num_hidden_layers})"
            )
        a, b = ab["A"], ab["B"]
        h_in, h_out = shapes[proj]
        if a.shape[1] != h_in or b.shape[0] != h_out or a.shape[0] != b.shape[1]:
            raise ServeError(
                f"{weights_path}: layer {layer} {proj}: A {tuple(a.shape)} / B {tuple(b.shape)} do not "
                f"fit the base model ({h_in} -> {h_out}); was it trained on another model?"
            )
        r = a.shape[0]
        rank = max(rank, r)
        scale = _scale(config, f"model.layers.{layer}.{'self_attn' if proj[0] in 'qkvo' else 'mlp'}.{proj}", r)
        weights[(layer, proj)] = (a.t().contiguous(), (b.t() * scale).contiguous())
    if not weights:
        raise ServeError(f"{weights_path}: no LoRA weights found")
    return LoRAAdapter(name=name or folder.name, rank=rank, weights=weights)


class AdapterStore:
    """Adapters by name: a folder of PEFT adapter folders (one per name), read from disk on first use."""

    def __init__(self, model_config: LlamaConfig, folder: str | Path | None = None) -> None:
        self.model_config = model_config
        self.paths: dict[str, Path] = {}
        self.loaded: dict[str, LoRAAdapter] = {}
        if folder is not None:
            root = Path(folder)
            if not root.is_dir():
                raise ServeError(f"--adapters {folder}: no such folder (one PEFT adapter folder per name)")
            for sub in sorted(root.iterdir()):
                if (sub / "adapter_config.json").is_file():
                    self.paths[sub.name] = sub

    def names(self) -> list[str]:
        return sorted(set(self.paths) | set(self.loaded))

    def max_rank(self) -> int:
        """The largest rank among the adapters (read from adapter_config.json, without loading weights)."""
        ranks = [a.rank for a in self.loaded.values()]
        for name, path in self.paths.items():
            if name not in self.loaded:
                config = json.loads((path / "adapter_config.json").read_text())
                ranks.append(max([int(config.get("r", 8)), *map(int, config.get("rank_pattern", {}).values())]))
        return max(ranks, default=8)

    def add(self, adapter: LoRAAdapter) -> None:
        """Register an adapter built in memory (tests, benchmarks) or loaded at runtime."""
        self.loaded[adapter.name] = adapter

    def remove(self, name: str) -> None:
        """Forget ``name`` (its folder and its weights); unknown names raise UnknownAdapterError."""
        if name not in self:
            raise UnknownAdapterError(f"adapter {name!r} is not served here; GET /v1/models lists the adapters")
        self.paths.pop(name, None)
        self.loaded.pop(name, None)

    def __contains__(self, name: str) -> bool:
        return name in self.paths or name in self.loaded

    def get(self, name: str) -> LoRAAdapter:
        if name not in self.loaded:
            if name not in self.paths:
                raise UnknownAdapterError(f"adapter {name!r} is not served here; GET /v1/models lists the adapters")
            self.loaded[name] = load_peft_adapter(self.paths[name], self.model_config, name)
        return self.loaded[name]


class AdapterCache:
    """``slots`` adapters resident in stacked device tensors; LRU eviction among adapters no request holds."""

    def __init__(
        self,
        store: AdapterStore,
        slots: int = 32,
        max_rank: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        cfg = store.model_config
        max_rank = max_rank or store.max_rank()
        self.store, self.slots, self.max_rank = store, slots, max_rank
        self.dtype, self.device = dtype, device
        dims = cfg.projection_shapes()
        self._a = {
            (layer, p): torch.zeros(slots, dims[p][0], max_rank, dtype=dtype, device=device)
            for layer in range(cfg.num_hidden_layers)
            for p in PROJECTIONS
        }
        self._b = {
            (layer, p): torch.zeros(slots, max_rank, dims[p][1], dtype=dtype, device=device)
            for layer in range(cfg.num_hidden_layers)
            for p in PROJECTIONS
        }
        self.scales = torch.ones(slots, dtype=torch.float32, device=device)
        self._staging: torch.Tensor | None = None  # pinned host buffer for loads onto a GPU (see _copy_in)
        self._staged: torch.cuda.Event | None = None  # recorded after the last load's copies from it
        self._slot_of: OrderedDict[str, int] = OrderedDict()  # LRU order: least recent first
        self._holders: dict[str, int] = {}
        self._targets: dict[tuple[int, str], int] = {}
        self._free = list(range(slots - 1, -1, -1))
        self.loads = 0
        self.evictions = 0
        self.hits = 0
        self.misses = 0

    def resident(self) -> list[str]:
        return list(self._slot_of)

    def can_acquire(self, name: str) -> bool:
        """True when ``name`` is resident, a slot is free, or an unheld adapter can be evicted."""
        return name in self._slot_of or bool(self._free) or any(self._holders.get(n, 0) == 0 for n in self._slot_of)

    def acquire(self, name: str) -> int:
        """The slot of ``name`` (loading it, evicting the least recently used unheld adapter if needed)."""
        if name in self._slot_of:
            self._slot_of.move_to_end(name)
            self.hits += 1
        else:
            self.misses += 1
            adapter = self.store.get(name)
            if adapter.rank > self.max_rank:
                raise ServeError(
                    f"adapter {name!r} has rank {adapter.rank}, above this server's --max-rank {self.max_rank}"
                )
            if self._free:
                slot = self._free.pop()
                self._write(slot, adapter)
            else:
                slot, evicted = self._evict()
                self._write(slot, adapter, replacing=evicted)
            self._slot_of[name] = slot
            self.loads += 1
        self._holders[name] = self._holders.get(name, 0) + 1
        return self._slot_of[name]

    def release(self, name: str) -> None:
        self._holders[name] -= 1

    def drop(self, name: str, adapter: LoRAAdapter) -> None:
        """Take ``name`` (whose weights are ``adapter``) out of its slot, if resident; it must not be held."""
        if self._holders.get(name, 0):
            raise ServeError(f"adapter {name!r} is held by {self._holders[name]} running request(s)")
        self._holders.pop(name, None)
        slot = self._slot_of.pop(name, None)
        if slot is not None:
            self._clear(slot, adapter)
            self._free.append(slot)

    def _evict(self) -> tuple[int, LoRAAdapter]:
        """The slot of the least recently used unheld adapter, and that adapter (its weights are still there)."""
        for name in self._slot_of:
            if self._holders.get(name, 0) == 0:
                slot = self._slot_of.pop(name)
                self.evictions += 1
                return slot, self.store.get(name)
        raise ServeError("every adapter slot is held by a running request; raise --adapter-slots")

    def _write(self, slot: int, adapter: LoRAAdapter, replacing: LoRAAdapter | None = None) -> None:
        """Put ``adapter`` in ``slot``. A slot holds its adapter's weights zero-padded to the slots' rank and zeros
        for the projections it does not target; an evicted adapter's weights are overwritten rather than cleared
        first, and only what the new one leaves uncovered is zeroed."""
        stale: list[torch.Tensor] = []
        if replacing is not None:
            for key in replacing.weights:
                self._targets[key] -= 1
                if key not in adapter.weights:
                    stale += [self._a[key][slot], self._b[key][slot]]
                elif adapter.weights[key][0].shape[1] < self.max_rank:
                    r = adapter.weights[key][0].shape[1]
                    stale += [self._a[key][slot, :, r:], self._b[key][slot, r:, :]]
        if stale:
            torch._foreach_zero_(stale)
        pairs = []
        for key, (a, b) in adapter.weights.items():
            r = a.shape[1]
            pairs += [(self._a[key][slot, :, :r], a), (self._b[key][slot, :r, :], b)]
            self._targets[key] = self._targets.get(key, 0) + 1
        self._copy_in(pairs)

    def _copy_in(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """dst.copy_(src) for each pair (CPU sources, converted to the slots' dtype).

        On a GPU the sources are converted into one pinned staging buffer and copied without waiting: a copy from
        pageable memory blocks the host, and loading an adapter took 2 x 7 x layers of those (1.7 ms for the
        2-layer wide model on an H200, a quarter of a decode step, paid once per request under Distinct)."""
        if torch.device(self.device).type != "cuda":
            for dst, src in pairs:
                dst.copy_(src)
            return
        total = sum(src.numel() for _, src in pairs)
        if self._staging is None or self._staging.numel() < total:
            if self._staged is not None:
                self._staged.synchronize()
            self._staging, self._staged = torch.empty(total, dtype=self.dtype, pin_memory=True), None
        if self._staged is not None:
            self._staged.synchronize()  # the previous load's copies have finished reading the buffer
        offset = 0
        for dst, src in pairs:
            buffer = self._staging[offset : offset + src.numel()].view(src.shape)
            buffer.copy_(src)
            dst.copy_(buffer, non_blocking=True)
            offset += src.numel()
        self._staged = torch.cuda.Event()
        self._staged.record()

    def _clear(self, slot: int, adapter: LoRAAdapter) -> None:
        # one batched launch on a GPU instead of 2 x 7 x layers of them
        torch._foreach_zero_([s[slot] for key in adapter.weights for s in (self._a[key], self._b[key])])
        for key in adapter.weights:
            self._targets[key] -= 1

    def stacks(self, layer: int, proj: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The stacked weights of one projection, or None when no resident adapter touches it."""
        key = (layer, proj)
        return (self._a[key], self._b[key]) if self._targets.get(key, 0) else None
