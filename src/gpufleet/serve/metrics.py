"""Prometheus metrics of one server (``GET /metrics``), in a registry of its own so that apps never collide.

Counters and histograms are labelled by tenant and adapter. Label values are bounded: each label keeps the first
``max_label_values`` distinct values it sees and files the rest under ``"other"``, so that adapters loaded at
runtime or many tenants cannot grow the series without bound. Backend figures (running and waiting requests, KV
blocks, adapter-slot hits, misses and loads) are read from the backend's ``state()`` at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

OTHER = "other"
BASE_LABEL = "base"  # the adapter label of a request for the base model
UNAUTHENTICATED = "unauthenticated"  # the tenant label of a request without a valid key
NO_ADAPTER = "none"  # the adapter label of a request refused before its model was resolved
DEFAULT_MAX_LABEL_VALUES = 64
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class BoundedLabel:
    """Keeps at most ``limit`` distinct values of one label; later new values become ``"other"``. The
    ``reserved`` values (the server's own, such as "unauthenticated") always pass and do not count."""

    def __init__(self, limit: int, reserved: tuple[str, ...] = ()) -> None:
        self.limit = limit
        self.reserved = frozenset(reserved)
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen or value in self.reserved:
            return value
        if len(self._seen) < self.limit:
            self._seen.add(value)
            return value
        return OTHER


class _BackendCollector(Collector):
    """Gauges and counters read from the backend's ``state()`` and the server's queue when scraped."""

    def __init__(self, state: Callable[[], Mapping[str, Any] | None], queue: Callable[[], tuple[int, int]]) -> None:
        self._state, self._queue = state, queue

    def collect(self) -> Iterator[Metric]:
        running, waiting = self._queue()
        state = dict(self._state() or {})
        engine_waiting = int(state.get("waiting", 0) or 0)
        yield GaugeMetricFamily(
            "gpufleet_requests_running", "Requests the server has passed to the backend.", value=running
        )
        yield GaugeMetricFamily(
            "gpufleet_requests_waiting",
            "Requests waiting: in the server's fair queue plus the engine's own queue.",
            value=waiting + engine_waiting,
        )
        total, free = state.get("total_blocks"), state.get("free_blocks")
        if total is not None and free is not None:
            yield GaugeMetricFamily("gpufleet_kv_blocks_used", "KV-cache blocks in use.", value=total - free)
            yield GaugeMetricFamily("gpufleet_kv_blocks_total", "KV-cache blocks in all.", value=total)
        if "batch" in state:
            batch = state["batch"]
            yield GaugeMetricFamily("gpufleet_batch_size", "Requests in the engine's running batch.", value=batch)
        for key, help_text in (
            ("adapter_hits", "Admissions whose adapter was already in a device slot."),
            ("adapter_misses", "Admissions whose adapter had to be loaded into a slot."),
            ("adapter_loads", "Adapters written into a device slot."),
            ("adapter_evictions", "Adapters evicted from a device slot."),
        ):
            if key in state:
                yield CounterMetricFamily(f"gpufleet_{key}", help_text, value=state[key])


class ServeMetrics:
    """The server's metrics in its own ``CollectorRegistry``; ``render()`` is the ``/metrics`` body."""

    def __init__(
        self,
        state: Callable[[], Mapping[str, Any] | None],
        queue: Callable[[], tuple[int, int]],
        max_label_values: int = DEFAULT_MAX_LABEL_VALUES,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.tenant_label = BoundedLabel(max_label_values, (UNAUTHENTICATED, OTHER))
        self.adapter_label = BoundedLabel(max_label_values, (NO_ADAPTER, OTHER))
        labels = ("tenant", "adapter")
        self.requests = Counter(
            "gpufleet_requests", "Requests answered, by HTTP status.", (*labels, "status"), registry=self.registry
        )
        self.prompt_tokens = Counter(
            "gpufleet_prompt_tokens", "Prompt tokens of served requests.", labels, registry=self.registry
        )
        self.generation_tokens = Counter(
            "gpufleet_generation_tokens",
            "Tokens generated and reported to clients (usage.completion_tokens).",
            labels,
            registry=self.registry,
        )
        self.errors = Counter(
            "gpufleet_request_errors",
            "Requests refused or failed, by error code.",
            (*labels, "code"),
            registry=self.registry,
        )
        self.ttft = Histogram(
            "gpufleet_time_to_first_token_seconds",
            "From the request's arrival to its first generated token (queueing included).",
            labels,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "gpufleet_inter_token_latency_seconds",
            "Between consecutive generated tokens of one request.",
            labels,
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_BackendCollector(state, queue))

    def labels(self, tenant: str, adapter: str | None) -> tuple[str, str]:
        """Bounded (tenant, adapter) label values."""
        return self.tenant_label(tenant), self.adapter_label(BASE_LABEL if adapter is None else adapter)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
