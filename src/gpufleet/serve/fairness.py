"""Per-tenant fairness: token-bucket rate limits and a fair admission queue in front of the backend.

* ``TokenBucket``: ``rate`` units per second, at most ``capacity`` saved up. A tenant has one for requests
  (``requests_per_s``, one second of burst) and one for tokens (``tokens_per_min``, one minute of burst). A
  request is charged its prompt plus ``max_tokens`` when admitted; what it did not generate is refunded at the
  end, so the bucket counts the tokens really served.
* ``FairQueue``: at most ``max_running`` requests are in the backend; the others wait here, FCFS within a
  tenant, and a freed place goes to the waiting tenant with the fewest requests running (ties: the oldest head
  of queue). A tenant may hold at most its share of the waiting places, so one tenant's flood cannot fill the
  queue: only that tenant gets 429 (``TenantLimitError``), the others still queue.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet.serve.protocol import OverloadedError
from gpufleet.serve.tenants import Tenant


class TenantLimitError(OverloadedError):
    """One tenant is over its own limit (rate or queue share): 429 for it only, with ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float, reason: str) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason


class TokenBucket:
    """``rate`` per second, up to ``capacity`` in store; starts full."""

    def __init__(self, rate: float, capacity: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.capacity, self._clock = rate, capacity, clock
        self.level = capacity
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._at) * self.rate)
        self._at = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` is available (0 now; inf if it exceeds the capacity)."""
        self._refill()
        if amount > self.capacity:
            return math.inf
        return max(0.0, (amount - self.level) / self.rate)

    def take(self, amount: float) -> None:
        """Remove ``amount`` (may go negative only through ``take`` after ``wait_for`` said 0)."""
        self._refill()
        self.level -= amount

    def give_back(self, amount: float) -> None:
        """Return unused units (never above capacity)."""
        self._refill()
        self.level = min(self.capacity, self.level + amount)


class RateLimiter:
    """Each tenant's request and token buckets; ``admit`` charges both or raises ``TenantLimitError``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._requests: dict[str, TokenBucket] = {}
        self._tokens: dict[str, TokenBucket] = {}

    def _buckets(self, tenant: Tenant) -> tuple[TokenBucket | None, TokenBucket | None]:
        if tenant.requests_per_s is not None and tenant.name not in self._requests:
            rate = tenant.requests_per_s
            self._requests[tenant.name] = TokenBucket(rate, max(1.0, rate), self._clock)
        if tenant.tokens_per_min is not None and tenant.name not in self._tokens:
            per_min = tenant.tokens_per_min
            self._tokens[tenant.name] = TokenBucket(per_min / 60.0, float(per_min), self._clock)
        return self._requests.get(tenant.name), self._tokens.get(tenant.name)

    def request_wait(self, tenant: Tenant) -> float:
        """Seconds until the tenant's request bucket has room for one more (0: now); charges nothing."""
        requests, _ = self._buckets(tenant)
        return 0.0 if requests is None else requests.wait_for(1)

    def admit(self, tenant: Tenant, tokens: int) -> None:
        """Charge one request and ``tokens`` tokens, or raise (charging nothing) when either bucket is short."""
        requests, budget = self._buckets(tenant)
        waits = [0.0]
        if requests is not None:
            waits.append(requests.wait_for(1))
        if budget is not None:
            need = budget.wait_for(tokens)
            if math.isinf(need):
                raise TenantLimitError(
                    f"tenant '{tenant.name}': this request needs {tokens} tokens (prompt + max_tokens), more "
                    f"than its tokens_per_min of {tenant.tokens_per_min}; lower max_tokens",
                    60.0,
                    "request_too_large",
                )
            waits.append(need)
        wait = max(waits)
        if wait > 0:
            what = "requests_per_s" if requests is not None and requests.wait_for(1) > 0 else "tokens_per_min"
            raise TenantLimitError(
                f"tenant '{tenant.name}' is over its {what} limit; retry in {math.ceil(wait)} s", wait, what
            )
        if requests is not None:
            requests.take(1)
        if budget is not None:
            budget.take(tokens)

    def refund(self, tenant: Tenant, tokens: int) -> None:
        """Give back tokens charged but not generated."""
        budget = self._tokens.get(tenant.name)
        if budget is not None and tokens > 0:
            budget.give_back(tokens)


@dataclass
class _Waiter:
    seq: int
    future: asyncio.Future[None]


@dataclass
class _TenantQueue:
    running: int = 0
    waiting: deque[_Waiter] = field(default_factory=deque)


class FairQueue:
    """At most ``max_running`` requests in the backend (None: no bound); the rest wait fairly (module docstring).

    ``max_waiting`` bounds all waiting requests (beyond: ``OverloadedError`` for everyone); a tenant may hold at
    most ``tenant.max_queued`` or ``ceil(queue_share * max_waiting)`` of them (beyond: ``TenantLimitError``).
    Use ``async with queue.slot(tenant):`` around a request's time in the backend.
    """

    def __init__(self, max_running: int | None, max_waiting: int | None = None, queue_share: float = 1.0) -> None:
        self.max_running, self.max_waiting, self.queue_share = max_running, max_waiting, queue_share
        self._tenants: dict[str, _TenantQueue] = {}
        self._seq = itertools.count()
        self.running = 0

    @property
    def waiting(self) -> int:
        """Requests waiting for a place in the backend."""
        return sum(len(q.waiting) for q in self._tenants.values())

    def tenant_share(self, tenant: Tenant) -> int | None:
        """The most waiting places ``tenant`` may hold (None: no bound)."""
        if tenant.max_queued is not None:
            return tenant.max_queued
        if self.max_waiting is None:
            return None
        return max(1, math.ceil(self.queue_share * self.max_waiting))

    async def acquire(self, tenant: Tenant) -> None:
        """Wait for a place (FCFS within the tenant); refusals raise at once, before any waiting."""
        queue = self._tenants.setdefault(tenant.name, _TenantQueue())
        if self.max_running is None or (self.running < self.max_running and not self.waiting):
            self._start(queue)
            return
        share = self.tenant_share(tenant)
        if share is not None and len(queue.waiting) >= share:
            raise TenantLimitError(
                f"tenant '{tenant.name}' already has {len(queue.waiting)} requests waiting, its share of the "
                f"queue; retry shortly",
                1.0,
                "queue_share",
            )
        if self.max_waiting is not None and self.waiting >= self.max_waiting:
            raise OverloadedError(f"{self.waiting} requests are waiting (the limit is {self.max_waiting}); retry later")
        waiter = _Waiter(next(self._seq), asyncio.get_running_loop().create_future())
        queue.waiting.append(waiter)
        try:
            await waiter.future
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(tenant)  # it was given a place just as it was cancelled: pass the place on
            else:
                queue.waiting.remove(waiter)
            raise

    def release(self, tenant: Tenant) -> None:
        """A request of ``tenant`` left the backend: hand its place to the next waiting request."""
        self._tenants[tenant.name].running -= 1
        self.running -= 1
        self._dispatch()

    def _start(self, queue: _TenantQueue) -> None:
        queue.running += 1
        self.running += 1

    def _dispatch(self) -> None:
        while self.max_running is None or self.running < self.max_running:
            ready = [q for q in self._tenants.values() if q.waiting]
            if not ready:
                return
            queue = min(ready, key=lambda q: (q.running, q.waiting[0].seq))
            waiter = queue.waiting.popleft()
            self._start(queue)
            waiter.future.set_result(None)
