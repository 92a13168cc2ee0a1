"""The inference load model: servers the inference service needs over time, as a step function.

Aryl (Lyra, EuroSys'23) loans idle inference servers to training and takes them back when inference
traffic rises. The simulator needs that traffic as a piecewise-constant step function of *servers
needed*: :class:`InferenceLoad`. Every server of the inference pool that is not needed is idle and may
be loaned. Time 0 is the start of the job trace; times are seconds. The sources that make one live
beside this module (:mod:`gpufleet.traces.inference`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufleet.errors import ConfigError, TraceError

if TYPE_CHECKING:
    import polars as pl

DAY_S = 86400.0
EPS = 1e-9  # rounding tolerance before ceil: 768.0000000001 GPUs must stay 96 servers


@dataclass(frozen=True, eq=False)
class InferenceLoad:
    """Servers the inference service needs over time.

    ``servers[i]`` holds from ``time_s[i]`` until ``time_s[i+1]`` (the last step holds forever); before
    ``time_s[0] == 0`` the first value holds. Arrays are stored read-only; construction checks the
    invariants (TraceError naming the broken one). Equality is identity (arrays do not compare as bools).
    """

    name: str
    time_s: np.ndarray  # float64, strictly increasing, time_s[0] == 0.0 (seconds since the job trace's start)
    servers: np.ndarray  # int64 >= 0
    pool_servers: int  # size of the inference pool it was made for (servers), servers <= pool_servers always

    def __post_init__(self) -> None:
        time = np.array(self.time_s, dtype=np.float64).ravel()
        servers = np.array(self.servers).ravel()
        where = f"inference load {self.name!r}"
        if time.size == 0 or time.size != servers.size:
            raise TraceError(
                f"{where}: time_s and servers need the same, non-zero length (got {time.size} and {servers.size})"
            )
        if servers.dtype.kind == "f":
            if not np.all(np.isfinite(servers)) or np.any(servers != np.round(servers)):
                raise TraceError(f"{where}: servers must be whole numbers")
        elif servers.dtype.kind not in "iub":
            raise TraceError(f"{where}: servers must be whole numbers, got dtype {servers.dtype}")
        servers = servers.astype(np.int64)
        pool = self.pool_servers
        if isinstance(pool, bool) or not isinstance(pool, (int, np.integer)) or pool < 0:
            raise TraceError(f"{where}: pool_servers must be a whole number >= 0, got {self.pool_servers!r}")
        if not np.all(np.isfinite(time)) or time[0] != 0.0 or np.any(np.diff(time) <= 0):
            raise TraceError(f"{where}: time_s must be finite, start at 0.0 and strictly increase")
        if servers.min() < 0 or servers.max() > self.pool_servers:
            raise TraceError(
                f"{where}: servers must lie in [0, pool_servers={self.pool_servers}], "
                f"got {servers.min()}..{servers.max()}"
            )
        time.setflags(write=False)
        servers.setflags(write=False)
        object.__setattr__(self, "time_s", time)
        object.__setattr__(self, "servers", servers)
        object.__setattr__(self, "pool_servers", int(self.pool_servers))

    def __repr__(self) -> str:
        return (
            f"InferenceLoad(name={self.name!r}, steps={self.time_s.size}, pool_servers={self.pool_servers}, "
            f"last_step_s={self.time_s[-1]:g})"
        )

    def _index(self, t: np.ndarray | float) -> np.ndarray:
        """Index of the step in force at ``t`` (0 before time 0)."""
        idx = np.searchsorted(self.time_s, t, side="right") - 1
        return np.maximum(idx, 0)

    def at(self, t: float) -> int:
        """Servers needed at time ``t``: the step that started at or before ``t`` (a step owns its start)."""
        return int(self.servers[self._index(t)])

    def idle_at(self, t: float) -> int:
        """Idle servers at time ``t``: ``pool_servers - at(t)``, the servers that may be loaned."""
        return self.pool_servers - self.at(t)

    def _integral(self, t: np.ndarray) -> np.ndarray:
        """Server-seconds needed from time 0 to each ``t`` (negative before 0, where the first value holds)."""
        widths = np.diff(self.time_s)
        cum = np.concatenate(([0.0], np.cumsum(widths * self.servers[:-1])))
        idx = self._index(t)
        return cum[idx] + self.servers[idx] * (t - self.time_s[idx])

    def mean_utilisation(self, start: float, end: float) -> float:
        """Time-weighted mean of servers needed / pool_servers over [start, end] (0.0 for an empty pool).

        ``start == end`` gives the utilisation at that instant; ``end < start`` is a ConfigError.
        """
        if not (math.isfinite(start) and math.isfinite(end)) or end < start:
            raise ConfigError(f"mean_utilisation: need finite start <= end, got start={start}, end={end}")
        if self.pool_servers == 0:
            return 0.0
        if end == start:
            return self.at(start) / self.pool_servers
        g = self._integral(np.array([start, end], dtype=np.float64))
        return float((g[1] - g[0]) / (end - start) / self.pool_servers)

    def hourly_utilisation(self, start: float = 0.0, end: float | None = None) -> np.ndarray:
        """Mean utilisation for each hour of day 0..23 (``t % 86400``), time-weighted over [start, end].

        ``end`` defaults to :meth:`default_end`. Hours that [start, end] never reaches are NaN.
        """
        end = self.default_end() if end is None else end
        if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
            raise ConfigError(f"hourly_utilisation: need finite start < end, got start={start}, end={end}")
        first = math.floor(start / 3600.0)
        edges = np.arange(first, math.ceil(end / 3600.0) + 1, dtype=np.float64) * 3600.0
        edges = np.clip(edges, start, end)
        seconds = np.diff(edges)
        used = self._integral(edges)
        hours = (np.arange(first, first + seconds.size) % 24).astype(np.int64)
        total_s = np.bincount(hours, weights=seconds, minlength=24)
        total_used = np.bincount(hours, weights=np.diff(used), minlength=24)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = total_used / total_s / max(self.pool_servers, 1)
        return np.where(total_s > 0, share, np.nan)

    def default_end(self) -> float:
        """End of the period the load describes: last step + the median step width (1 day for one step)."""
        if self.time_s.size == 1:
            return DAY_S
        return float(self.time_s[-1] + np.median(np.diff(self.time_s)))

    def describe(self, start: float = 0.0, end: float | None = None) -> dict[str, Any]:
        """Summary over [start, end] (default: :meth:`default_end`): steps, utilisation, idle servers.

        Keys: name, pool_servers, start_s, end_s, steps (steps in force during the window), mean/peak/
        trough_utilisation, mean_servers_needed, mean_idle_servers, and hourly_utilisation (24 values).
        """
        end = self.default_end() if end is None else end
        if end <= start:
            raise ConfigError(f"describe: need start < end, got start={start}, end={end}")
        lo, hi = int(self._index(start)), int(np.searchsorted(self.time_s, end, side="left"))
        window = self.servers[lo : max(hi, lo + 1)]
        pool = max(self.pool_servers, 1)
        mean = self.mean_utilisation(start, end)
        return {
            "name": self.name,
            "pool_servers": self.pool_servers,
            "start_s": float(start),
            "end_s": float(end),
            "steps": int(window.size),
            "mean_utilisation": mean,
            "peak_utilisation": float(window.max() / pool) if self.pool_servers else 0.0,
            "trough_utilisation": float(window.min() / pool) if self.pool_servers else 0.0,
            "mean_servers_needed": mean * self.pool_servers,
            "mean_idle_servers": (1.0 - mean) * self.pool_servers,
            "hourly_utilisation": [round(float(v), 6) for v in self.hourly_utilisation(start, end)],
        }

    def to_frame(self) -> pl.DataFrame:
        """The steps as a frame: ``time_s`` (float64), ``servers_needed`` and ``idle_servers`` (int64)."""
        import polars as pl

        return pl.DataFrame(
            {
                "time_s": self.time_s,
                "servers_needed": self.servers,
                "idle_servers": self.pool_servers - self.servers,
            }
        )

    def merged(self) -> InferenceLoad:
        """The same load with fewer events: steps whose value equals the previous step's are dropped."""
        keep = np.concatenate(([True], self.servers[1:] != self.servers[:-1]))
        return InferenceLoad(self.name, self.time_s[keep], self.servers[keep], self.pool_servers)


def require(ok: bool, message: str) -> None:
    """ConfigError(``message``) unless ``ok``."""
    if not ok:
        raise ConfigError(message)


def check_common(pool_servers: int, until_s: float, step_s: float, where: str) -> None:
    """The arguments every source takes: a whole pool size, a positive span and step."""
    require(
        not isinstance(pool_servers, bool) and isinstance(pool_servers, (int, np.integer)) and pool_servers >= 0,
        f"{where}: pool_servers must be a whole number >= 0 (servers in the inference pool), got {pool_servers!r}",
    )
    require(
        math.isfinite(until_s) and until_s > 0,
        f"{where}: until_s must be a positive number of seconds (the span to cover), got {until_s!r}",
    )
    require(
        math.isfinite(step_s) and step_s > 0, f"{where}: step_s must be a positive number of seconds, got {step_s!r}"
    )
