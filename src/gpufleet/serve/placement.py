"""Punica's cluster scheduler over several engine instances: placement, a FCFS queue, migration by recomputation.

``PunicaPlacement`` is pure bookkeeping (no I/O, no clock, no torch), after the first author's server
(abcdabcd987/punica-server-experimental, ``rust/src/scheduler/scheduler.rs``):

* a new request goes to the instance with the **largest batch** that still has room (batch < max batch and
  free KV blocks >= blocks of its prompt + (batch + 1), one block per running request for the next token),
  ties broken by the **number of requests of the same adapter** there, then **fewest free blocks**, then the
  larger instance id. Filling the busiest instance first consolidates the load: lightly used instances drain.
* the queue is FCFS by arrival time and stops at the first request that cannot be placed (head-of-line).
* after each step of an instance, if its free blocks cannot give every running request one more token
  (free < batch), requests are **evicted newest first**, as the issue asks and as Punica's code comment says
  (its code actually pops the *oldest*; ``evict="oldest"`` reproduces that). An evicted request is re-queued
  with its original arrival time and **migrates by recomputation**: its prompt becomes prompt + the tokens
  generated so far, prefilled again wherever it is placed next (no KV transfer).

``PlacementFrontend`` applies it to live ``GenerationBackend`` instances, so that one HTTP server can sit in
front of several engine processes.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gpufleet.errors import ServeError
from gpufleet.serve.protocol import (
    GenerationBackend,
    GenerationChunk,
    OverloadedError,
    SamplingParams,
    UnknownAdapterError,
)

DEFAULT_MAX_BATCH = 32  # Punica's max_batch_size per GPU
DEFAULT_BLOCK_SIZE = 16  # Punica's KV block (page) length in tokens
UNLIMITED_BLOCKS = 1 << 40  # capacity of a backend that reports no state
SUMMED_STATE = frozenset(
    {
        "batch",
        "max_batch",
        "waiting",
        "free_blocks",
        "total_blocks",
        "served",
        "adapter_hits",
        "adapter_misses",
        "adapter_loads",
        "adapter_evictions",
    }
)


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks that hold ``tokens`` tokens (Punica's ``calc_init_blocks``)."""
    return -(-tokens // block_size)


@dataclass
class RunningRequest:
    """A request on an instance: when it arrived (first, before any migration), its adapter, its length."""

    arrival: float
    request_id: str
    lora_id: str | None
    tokens: int  # prompt + generated so far: the KV cache it holds


@dataclass
class InstanceState:
    """One engine instance as placement sees it. Free blocks are derived: total minus what running requests hold."""

    instance_id: str
    total_blocks: int
    block_size: int = DEFAULT_BLOCK_SIZE
    max_batch: int = DEFAULT_MAX_BATCH
    running: dict[str, RunningRequest] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        """Requests running on the instance."""
        return len(self.running)

    @property
    def used_blocks(self) -> int:
        """KV blocks the running requests hold."""
        return sum(blocks_for(r.tokens, self.block_size) for r in self.running.values())

    @property
    def free_blocks(self) -> int:
        """KV blocks left (negative if tokens were appended past capacity without a step check)."""
        return self.total_blocks - self.used_blocks

    def same_adapter_count(self, lora_id: str | None) -> int:
        """Running requests of adapter ``lora_id`` (None: the base model): Punica's affinity tie-break."""
        return sum(1 for r in self.running.values() if r.lora_id == lora_id)


@dataclass
class PlacementRequest:
    """A request waiting for an instance. ``instances`` limits where it may run (None: anywhere)."""

    request_id: str
    lora_id: str | None
    prompt_tokens: int  # after a migration: the original prompt + the tokens generated before it
    arrival: float
    instances: frozenset[str] | None = None
    migrations: int = 0


@dataclass(frozen=True)
class PlacementEvent:
    """One decision, for tests and benchmarks: queued, placed, evicted (migration), dropped or finished."""

    kind: Literal["queue", "place", "evict", "drop", "finish"]
    request_id: str
    instance_id: str | None
    tokens: int


@dataclass
class Decisions:
    """What one call changed: requests placed (id, instance), evicted and re-queued, dropped as unplaceable."""

    placed: list[tuple[str, str]] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def extend(self, other: Decisions) -> Decisions:
        """Append ``other``'s decisions after these; returns self."""
        self.placed += other.placed
        self.evicted += other.evicted
        self.dropped += other.dropped
        return self


def _order(request: PlacementRequest | RunningRequest) -> tuple[float, str]:
    return (request.arrival, request.request_id)


class PunicaPlacement:
    """Punica's scheduler state: instances, the FCFS queue, an event log and counters."""

    def __init__(
        self, instances: Iterable[InstanceState] = (), *, evict: Literal["newest", "oldest"] = "newest"
    ) -> None:
        if evict not in ("newest", "oldest"):
            raise ServeError(f"evict must be 'newest' or 'oldest', not {evict!r}")
        self.evict = evict
        self.instances: dict[str, InstanceState] = {}
        self.requests: dict[str, PlacementRequest] = {}  # every known request, queued or running
        self.location: dict[str, str] = {}  # request id -> instance id, for running requests
        self._queue: list[PlacementRequest] = []  # sorted by (arrival, request id)
        self.events: list[PlacementEvent] = []
        self.counters: Counter[str] = Counter()
        for state in instances:
            self.add_instance(state)

    # ----------------------------------------------------------------------------------------- instances
    def add_instance(self, state: InstanceState) -> None:
        """Register an instance (with whatever is already running on it)."""
        if state.instance_id in self.instances:
            raise ServeError(f"instance '{state.instance_id}' is registered twice; instance ids must be unique")
        self.instances[state.instance_id] = state
        for rid, r in state.running.items():
            self.location[rid] = state.instance_id
            self.requests.setdefault(rid, PlacementRequest(rid, r.lora_id, r.tokens, r.arrival))

    def set_capacity(
        self,
        instance_id: str,
        *,
        total_blocks: int | None = None,
        block_size: int | None = None,
        max_batch: int | None = None,
    ) -> None:
        """Update an instance's capacity from its own report; what runs there stays as placement knows it."""
        inst = self.instances[instance_id]
        inst.total_blocks = inst.total_blocks if total_blocks is None else total_blocks
        inst.block_size = inst.block_size if block_size is None else block_size
        inst.max_batch = inst.max_batch if max_batch is None else max_batch

    # --------------------------------------------------------------------------------------------- queries
    @property
    def queue(self) -> list[PlacementRequest]:
        """Waiting requests, oldest first."""
        return list(self._queue)

    def where(self, request_id: str) -> str | None:
        """The instance running ``request_id``; None while it waits (or is unknown)."""
        return self.location.get(request_id)

    def choose_instance(self, request: PlacementRequest) -> str | None:
        """Punica's choice: max of (batch, same-adapter count, -free blocks, id) among instances with room."""
        best: tuple[int, int, int, str] | None = None
        for inst in self._candidates(request):
            if not self._has_room(inst, request.prompt_tokens):
                continue
            key = (inst.batch_size, inst.same_adapter_count(request.lora_id), -inst.free_blocks, inst.instance_id)
            best = key if best is None or key > best else best
        return None if best is None else best[3]

    def fits_somewhere(self, request: PlacementRequest) -> bool:
        """Whether some allowed instance could take the request once empty (else it would block the queue)."""
        return any(
            inst.max_batch >= 1 and inst.total_blocks >= blocks_for(request.prompt_tokens, inst.block_size) + 1
            for inst in self._candidates(request)
        )

    def _candidates(self, request: PlacementRequest) -> list[InstanceState]:
        if request.instances is None:
            return list(self.instances.values())
        return [self.instances[i] for i in request.instances if i in self.instances]

    @staticmethod
    def _has_room(inst: InstanceState, prompt_tokens: int) -> bool:
        if inst.batch_size >= inst.max_batch:
            return False
        return inst.free_blocks >= blocks_for(prompt_tokens, inst.block_size) + inst.batch_size + 1

    # ----------------------------------------------------------------------------------------------- changes
    def submit(self, request: PlacementRequest) -> Decisions:
        """Queue a new request (by its arrival time) and schedule the queue."""
        if request.request_id in self.requests:
            raise ServeError(f"request '{request.request_id}' is already queued or running; request ids must be unique")
        self.requests[request.request_id] = request
        self.counters["submitted"] += 1
        self._enqueue(request)
        return self.schedule_queue()

    def schedule_queue(self) -> Decisions:
        """Place waiting requests oldest first; stop at the first that fits nowhere (head-of-line, as Punica)."""
        decisions = Decisions()
        while self._queue:
            head = self._queue[0]
            target = self.choose_instance(head)
            if target is None:
                break
            self._queue.pop(0)
            self._place(head, target)
            decisions.placed.append((head.request_id, target))
        return decisions

    def on_token(self, instance_id: str, request_id: str, n: int = 1) -> None:
        """A running request grew by ``n`` tokens (call ``on_step`` before appending a step's tokens)."""
        self.instances[instance_id].running[request_id].tokens += n

    def set_tokens(self, request_id: str, tokens: int) -> None:
        """A running request's length as its engine reports it (prompt + generated so far)."""
        instance_id = self.location.get(request_id)
        if instance_id is not None:
            self.instances[instance_id].running[request_id].tokens = tokens

    def on_step(self, instance_id: str) -> Decisions:
        """Before a step: evict until every running request can get one more token's block, then schedule."""
        inst = self.instances[instance_id]
        decisions = Decisions()
        while inst.running and inst.free_blocks < inst.batch_size:
            pick = max if self.evict == "newest" else min
            victim = pick(inst.running.values(), key=_order)
            if self._evict(inst, victim):
                decisions.evicted.append(victim.request_id)
            else:
                decisions.dropped.append(victim.request_id)
        return decisions.extend(self.schedule_queue())

    def finish(self, request_id: str) -> Decisions:
        """A request ended (finished, cancelled or failed): free its place, then schedule the queue."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return Decisions()
        instance_id = self.location.pop(request_id, None)
        tokens = request.prompt_tokens
        if instance_id is not None:
            tokens = self.instances[instance_id].running.pop(request_id).tokens
        else:
            self._queue.remove(request)
        self.counters["finished"] += 1
        self._log("finish", request_id, instance_id, tokens)
        return self.schedule_queue()

    # ---------------------------------------------------------------------------------------------- helpers
    def _enqueue(self, request: PlacementRequest) -> None:
        bisect.insort(self._queue, request, key=_order)
        self._log("queue", request.request_id, None, request.prompt_tokens)

    def _place(self, request: PlacementRequest, instance_id: str) -> None:
        self.instances[instance_id].running[request.request_id] = RunningRequest(
            request.arrival, request.request_id, request.lora_id, request.prompt_tokens
        )
        self.location[request.request_id] = instance_id
        self.counters["placements"] += 1
        self._log("place", request.request_id, instance_id, request.prompt_tokens)

    def _evict(self, inst: InstanceState, victim: RunningRequest) -> bool:
        """Take ``victim`` off ``inst``; re-queue it as prompt + generated (True) or drop it if it fits nowhere."""
        del inst.running[victim.request_id]
        del self.location[victim.request_id]
        request = self.requests[victim.request_id]
        request.prompt_tokens = victim.tokens
        request.migrations += 1
        if not self.fits_somewhere(request):
            del self.requests[victim.request_id]
            self.counters["dropped"] += 1
            self._log("drop", victim.request_id, inst.instance_id, victim.tokens)
            return False
        self.counters["migrations"] += 1
        self._log("evict", victim.request_id, inst.instance_id, victim.tokens)
        self._enqueue(request)
        return True

    def _log(
        self,
        kind: Literal["queue", "place", "evict", "drop", "finish"],
        request_id: str,
        instance_id: str | None,
        tokens: int,
    ) -> None:
        self.events.append(PlacementEvent(kind, request_id, instance_id, tokens))


# ------------------------------------------------------------------------------------------ the front end
@dataclass
class _Job:
    """One request routed by the front end: where it runs now and what it has generated (kept across moves)."""

    request_id: str
    prompt: str | list[int]
    adapter: str | None
    params: SamplingParams
    placed: asyncio.Event = field(default_factory=asyncio.Event)
    instance: str | None = None
    dropped: bool = False
    finished: bool = False
    attempts: int = 0
    prompt_tokens: int | None = None
    token_ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def resume_prompt(self) -> str | list[int]:
        """The prompt to prefill: the original, plus what was generated before a migration."""
        if isinstance(self.prompt, str):
            return self.prompt + "".join(self.texts)
        return list(self.prompt) + self.token_ids

    def resume_params(self) -> SamplingParams:
        """The sampling parameters with the token budget that is left."""
        return replace(self.params, max_tokens=max(1, self.params.max_tokens - len(self.token_ids)))

    def tokens(self) -> int:
        """Prompt + generated: the KV cache this request holds."""
        return (self.prompt_tokens or 0) + len(self.token_ids)

    def record(self, chunk: GenerationChunk, instance_id: str) -> GenerationChunk:
        """Keep the chunk's token; return it as the caller sees it (its id, counts over every attempt)."""
        if self.prompt_tokens is None:
            self.prompt_tokens = chunk.prompt_tokens
        self.token_ids.append(chunk.token_id)
        self.texts.append(chunk.text)
        return replace(
            chunk,
            request_id=self.request_id,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=len(self.token_ids),
            extra={**chunk.extra, "instance": instance_id, "attempt": self.attempts},
        )

    def dropped_chunk(self) -> GenerationChunk:
        """The last chunk of a request that outgrew every instance's KV cache."""
        return GenerationChunk(
            self.request_id,
            -1,
            "",
            "length",
            prompt_tokens=self.prompt_tokens or 0,
            completion_tokens=len(self.token_ids),
            extra={"dropped": True},
        )


@asynccontextmanager
async def _closing(stream: AsyncIterator[GenerationChunk]) -> AsyncIterator[AsyncIterator[GenerationChunk]]:
    """Close a backend's stream however the attempt ends, so that its engine frees the request."""
    try:
        yield stream
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


def _capacity(report: Any, inst: InstanceState) -> dict[str, int | None]:
    """Capacity from a backend's ``state()``: an InstanceState or a mapping (engine-style dict)."""
    if isinstance(report, InstanceState):
        return {"total_blocks": report.total_blocks, "block_size": report.block_size, "max_batch": report.max_batch}
    if isinstance(report, Mapping):
        block_size = report.get("block_size") or inst.block_size
        total = report.get("total_blocks")
        if total is None and report.get("free_blocks") is not None:
            total = report["free_blocks"] + sum(blocks_for(r.tokens, block_size) for r in inst.running.values())
        return {"total_blocks": total, "block_size": block_size, "max_batch": report.get("max_batch")}
    raise ServeError(
        f"state() of instance '{inst.instance_id}' returned {type(report).__name__}; expected an "
        f"InstanceState or a mapping with free_blocks/total_blocks, block_size and max_batch"
    )


class PlacementFrontend:
    """A ``GenerationBackend`` over several: ``PunicaPlacement`` picks the instance, evictions migrate requests.

    Backends may offer two optional methods:

    * ``state()``: an ``InstanceState``, or a mapping with ``total_blocks`` (or ``free_blocks``), ``block_size``
      and ``max_batch`` (an ``Engine.state()`` dict). It gives the instance's KV capacity and is read before every
      decision about the instance. Without it, an instance has unlimited blocks and ``max_batch`` requests.
    * ``count_tokens(prompt: str) -> int``: the length of a text prompt before its first chunk reports it.

    What runs where is the front end's own record (it routed every request), as in Punica's scheduler. A migrated
    request is cancelled on its instance and restarted elsewhere with prompt + generated so far (text prompts
    continue as text, token-id prompts as ids) and the remaining token budget; its chunks keep flowing to the
    caller under the original request id. With temperature > 0 the continuation samples afresh from the seed.
    A request evicted while its instance is still computing notices at its next chunk from there (the token is
    kept), then its stream there is closed, which makes that engine abort it.
    """

    def __init__(
        self,
        backends: Mapping[str, GenerationBackend],
        *,
        max_queue: int = 1024,
        max_batch: int = DEFAULT_MAX_BATCH,
        evict: Literal["newest", "oldest"] = "newest",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not backends:
            raise ServeError("PlacementFrontend needs at least one backend")
        bases = sorted({b.base_model_name() for b in backends.values()})
        if len(bases) != 1:
            raise ServeError(f"every instance must serve the same base model; got {bases}")
        self._backends = dict(backends)
        self._base = bases[0]
        self._clock = clock
        self.max_queue = max_queue
        self.placement = PunicaPlacement(
            [InstanceState(iid, UNLIMITED_BLOCKS, max_batch=max_batch) for iid in self._backends], evict=evict
        )
        self._jobs: dict[str, _Job] = {}
        self.refresh()

    def base_model_name(self) -> str:
        """The base model every instance serves."""
        return self._base

    def adapter_names(self) -> list[str]:
        """Every adapter some instance serves."""
        return sorted({name for b in self._backends.values() for name in b.adapter_names()})

    def count_tokens(self, prompt: str) -> int:
        """Tokens of a text prompt, as placement counts them."""
        return self._count(prompt)

    def state(self) -> dict[str, int]:
        """The instances' counters summed (batch, waiting, KV blocks, adapter slots), for ``/metrics``."""
        total: dict[str, int] = {}
        for backend in self._backends.values():
            report = getattr(backend, "state", None)
            value = report() if callable(report) else None
            if isinstance(value, InstanceState):
                blocks = {"total_blocks": value.total_blocks, "free_blocks": value.free_blocks}
                value = {"batch": value.batch_size, **blocks}
            for key, number in (value or {}).items():
                if key in SUMMED_STATE and isinstance(number, int | float):
                    total[key] = total.get(key, 0) + int(number)
        return total

    async def load_adapter(self, name: str, folder: Any) -> None:
        """Load ``name`` on every live instance that can load adapters; all or none (undone where it succeeded)."""
        done: list[str] = []
        try:
            for iid, backend in self._backends.items():
                load = getattr(backend, "load_adapter", None)
                if callable(load) and not getattr(backend, "down_reason", None):
                    await load(name, folder)
                    done.append(iid)
        except BaseException:
            for iid in done:
                await self._backends[iid].unload_adapter(name)  # type: ignore[attr-defined]
            raise
        if not done:
            raise ServeError("no instance can load adapters at runtime")

    async def unload_adapter(self, name: str) -> None:
        """Unload ``name`` from every instance that serves it."""
        for backend in self._backends.values():
            if name in backend.adapter_names() and callable(getattr(backend, "unload_adapter", None)):
                await backend.unload_adapter(name)  # type: ignore[attr-defined]

    def refresh(self, instance_id: str | None = None) -> None:
        """Read the capacity of one instance (or all) from its ``state()``, where it has one."""
        for iid in [instance_id] if instance_id is not None else list(self._backends):
            state = getattr(self._backends[iid], "state", None)
            if callable(state):
                self.placement.set_capacity(iid, **_capacity(state(), self.placement.instances[iid]))

    async def generate(
        self, prompt: str | list[int], adapter: str | None, params: SamplingParams, request_id: str
    ) -> AsyncIterator[GenerationChunk]:
        """Place the request, stream its chunks, follow it across migrations; refusals raise before any chunk."""
        request = self._admit(prompt, adapter, request_id)
        job = _Job(request_id, prompt, adapter, params)
        self._jobs[request_id] = job
        try:
            self._apply(self.placement.submit(request))
            while not job.finished:
                await job.placed.wait()
                if job.dropped:
                    yield job.dropped_chunk()
                    return
                async with aclosing(self._run(job)) as chunks:
                    async for chunk in chunks:
                        yield chunk
        finally:
            self._jobs.pop(request_id, None)
            self._apply(self.placement.finish(request_id))

    def _admit(self, prompt: str | list[int], adapter: str | None, request_id: str) -> PlacementRequest:
        if request_id in self._jobs:
            raise ServeError(f"request id '{request_id}' is already in flight; request ids must be unique")
        allowed = self._serving(adapter)
        if len(self.placement.queue) >= self.max_queue:
            raise OverloadedError(
                f"{len(self.placement.queue)} requests are waiting for an instance (the limit is "
                f"{self.max_queue}); retry shortly"
            )
        self.refresh()
        request = PlacementRequest(request_id, adapter, self._count(prompt), self._clock(), allowed)
        if not self.placement.fits_somewhere(request):
            raise ServeError(
                f"the prompt ({request.prompt_tokens} tokens) needs more KV cache than any instance has; shorten it"
            )
        return request

    def _serving(self, adapter: str | None) -> frozenset[str] | None:
        if adapter is None:
            return None
        allowed = frozenset(iid for iid, b in self._backends.items() if adapter in b.adapter_names())
        if not allowed:
            raise UnknownAdapterError(
                f"adapter '{adapter}' is not served by any instance (adapters: "
                f"{', '.join(self.adapter_names()) or 'none'})."
            )
        return allowed

    def _count(self, prompt: str | list[int]) -> int:
        if not isinstance(prompt, str):
            return len(prompt)
        for backend in self._backends.values():
            count = getattr(backend, "count_tokens", None)
            if callable(count):
                return int(count(prompt))
        return len(prompt.encode()) // 4 + 1  # about 4 bytes a token

    async def _run(self, job: _Job) -> AsyncIterator[GenerationChunk]:
        """One attempt on the job's instance, until it finishes or placement moves it away."""
        iid = job.instance
        assert iid is not None
        job.attempts += 1
        backend_id = job.request_id if job.attempts == 1 else f"{job.request_id}~{job.attempts - 1}"
        stream = self._backends[iid].generate(job.resume_prompt(), job.adapter, job.resume_params(), backend_id)
        async with _closing(stream) as chunks:
            async for chunk in chunks:
                out = job.record(chunk, iid)
                self._account(job, iid, out)
                yield out
                if job.finished or job.instance != iid:
                    return

    def _account(self, job: _Job, iid: str, chunk: GenerationChunk) -> None:
        """Punica's per-chunk bookkeeping: grow the request, then evict/migrate on its instance and schedule."""
        if chunk.finish_reason is not None:
            job.finished = True
            self._apply(self.placement.finish(job.request_id))
            return
        if self.placement.where(job.request_id) == iid:
            self.placement.set_tokens(job.request_id, job.tokens())
        self.refresh(iid)
        self._apply(self.placement.on_step(iid))

    def _apply(self, decisions: Decisions) -> None:
        for rid in decisions.evicted:
            if (job := self._jobs.get(rid)) is not None:
                job.instance = None
                job.placed.clear()
        for rid in decisions.dropped:
            if (job := self._jobs.get(rid)) is not None:
                job.instance, job.dropped = None, True
                job.placed.set()
        for rid, iid in decisions.placed:
            if (job := self._jobs.get(rid)) is not None:
                job.instance = iid
                job.placed.set()
