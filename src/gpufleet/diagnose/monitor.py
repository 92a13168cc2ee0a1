"""An always-on, low-overhead section timer for training loops (MegaScale's CUDA-event monitor, in small).

``with mon.section("forward"): ...`` times a code section; ``mon.step()`` closes an iteration. On GPU the
boundaries are CUDA events resolved lazily, once they have completed, so the hot path never synchronises; on
CPU they are ``perf_counter_ns`` readings. Every ``every`` steps the ranks' rows are gathered to rank 0, which
appends them to a wide timings file (CSV or Parquet): ``rank, step, <one column per section>, total``, in
seconds. That file is what the straggler detector reads.
"""

from __future__ import annotations

import csv
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import polars as pl

from gpufleet.errors import ConfigError

#: the column that holds a whole step's time (from one ``step()`` to the next)
TOTAL = "total"
#: the profiler annotation around a flush (the cross-rank gather and the write)
FLUSH = "gpufleet::monitor_flush"


def _torch() -> Any:
    """torch if the program has imported it, else None: a CPU monitor never pays for importing torch itself."""
    return sys.modules.get("torch")


def _fmt(x: float | None) -> str:
    """Seconds with nanosecond resolution; empty for a section a rank did not run in that step."""
    return "" if x is None else f"{x:.9f}"


class _CpuSection:
    """A reusable context manager adding its wall time (ns) to the monitor's current-step totals."""

    __slots__ = ("_mon", "_name", "_t0")

    def __init__(self, mon: StepMonitor, name: str) -> None:
        self._mon, self._name, self._t0 = mon, name, 0

    def __enter__(self) -> None:
        self._t0 = t = time.perf_counter_ns()
        if self._mon._t_step is None:
            self._mon._t_step = t

    def __exit__(self, *exc: object) -> None:
        acc = self._mon._acc
        acc[self._name] = acc.get(self._name, 0) + time.perf_counter_ns() - self._t0


class _CudaSection:
    """A reusable context manager recording a CUDA event pair on the current stream; no synchronisation."""

    __slots__ = ("_mon", "_name", "_start")

    def __init__(self, mon: StepMonitor, name: str) -> None:
        self._mon, self._name, self._start = mon, name, None

    def __enter__(self) -> None:
        mon = self._mon
        self._start = ev = mon._event()
        ev.record()
        if mon._boundary is None:  # the first start of a step doubles as its boundary
            mon._boundary = ev

    def __exit__(self, *exc: object) -> None:
        ev = self._mon._event()
        ev.record()
        self._mon._pairs.append((self._name, self._start, ev))


class StepMonitor:
    """Time named sections of every training step on every rank; rank 0 writes the gathered rows every N steps.

    Use one monitor per process; every rank must call ``step()`` the same number of times and ``close()`` at the
    end, because flushing gathers across ranks when ``torch.distributed`` is initialised.
    """

    def __init__(
        self, every: int = 50, out: str | Path | None = None, device: str = "auto", start_step: int = 0
    ) -> None:
        if every < 1:
            raise ConfigError(f"StepMonitor(every={every}): every must be >= 1 step")
        if out is not None and Path(out).suffix not in (".csv", ".parquet"):
            raise ConfigError(f"StepMonitor(out={out!s}): the timings file must end in .csv or .parquet")
        torch = _torch()
        if device == "auto":  # a program timing GPU work has imported torch already
            device = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
        if device == "cuda" and (torch is None or not torch.cuda.is_available()):
            raise ConfigError("StepMonitor(device='cuda'): needs torch and a visible CUDA device; use device='cpu'")
        if device not in ("cpu", "cuda"):
            raise ConfigError(f"StepMonitor(device={device!r}): choose auto, cpu or cuda")
        self.every, self.out, self.device = every, Path(out) if out is not None else None, device
        self._step = start_step
        self._sections: dict[str, Any] = {}
        self._rows: list[tuple[int, dict[str, float], float]] = []  # resolved, not yet flushed
        self._columns: list[str] = []  # section columns in order of first appearance, for the file
        self._group: Any = None
        self._written: pl.DataFrame | None = None  # what rank 0 has written to a Parquet file so far
        self._header: list[str] | None = None  # the CSV header rank 0 has written
        # CPU state
        self._acc: dict[str, int] = {}
        self._t_step: int | None = None
        # CUDA state: events of the open step, then steps waiting for their events to complete
        self._pairs: list[tuple[str, Any, Any]] = []
        self._boundary: Any = None
        self._pending: deque[tuple[int, list[tuple[str, Any, Any]], Any, Any]] = deque()
        self._pool: list[Any] = []

    # ---- hot path -------------------------------------------------------------------------------------------
    def section(self, name: str) -> _CpuSection | _CudaSection:
        """The context manager timing section ``name`` (cached: one object per name, reused every step)."""
        sec = self._sections.get(name)
        if sec is None:
            sec = self._sections[name] = (_CudaSection if self.device == "cuda" else _CpuSection)(self, name)
        return sec

    def step(self) -> None:
        """Close the current iteration; every ``every`` steps gather the rows and let rank 0 write them."""
        if self.device == "cuda":
            end = self._event()
            end.record()
            if self._boundary is not None:
                self._pending.append((self._step, self._pairs, self._boundary, end))
            self._pairs, self._boundary = [], end
            self._resolve(block=False)
        else:
            now = time.perf_counter_ns()
            if self._t_step is not None:
                acc = self._acc
                self._rows.append((self._step, {k: v * 1e-9 for k, v in acc.items()}, (now - self._t_step) * 1e-9))
                acc.clear()
            self._t_step = now
        self._step += 1
        if self._step % self.every == 0:
            self.flush()

    # ---- CUDA events ----------------------------------------------------------------------------------------
    def _event(self) -> Any:
        """A timing CUDA event, reused from the pool of resolved steps when one is free."""
        return self._pool.pop() if self._pool else _torch().cuda.Event(enable_timing=True)

    def _resolve(self, block: bool) -> None:
        """Turn completed steps' events into rows; with ``block`` wait for the ones still running."""
        while self._pending:
            step, pairs, start, end = self._pending[0]
            if not end.query():
                if not block:
                    return
                end.synchronize()
            secs: dict[str, float] = {}
            for name, a, b in pairs:
                if not b.query():
                    b.synchronize()  # only when a section ran on another stream that is still busy
                secs[name] = secs.get(name, 0.0) + a.elapsed_time(b) * 1e-3
            self._rows.append((step, secs, start.elapsed_time(end) * 1e-3))
            self._pending.popleft()
            free = {id(ev): ev for _, a, b in pairs for ev in (a, b)}
            free[id(start)] = start
            free.pop(id(end), None)  # ``end`` is the next step's boundary
            self._pool.extend(free.values())

    # ---- gathering and writing --------------------------------------------------------------------------------
    def _dist(self) -> Any:
        """torch.distributed when it is initialised with more than one rank, else None."""
        torch = _torch()
        if torch is None or not torch.distributed.is_available() or not torch.distributed.is_initialized():
            return None
        return torch.distributed if torch.distributed.get_world_size() > 1 else None

    def _rank(self) -> int:
        torch = _torch()
        if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank()
        return 0

    def flush(self) -> None:
        """Gather every rank's resolved rows to rank 0 and write them (a collective when distributed).

        In a profiler trace the gather shows as ``gpufleet::monitor_flush`` (its ops, ``.item()`` calls included,
        are the monitor's, not the model's).
        """
        torch = _torch()
        if torch is None:
            self._flush()
            return
        with torch.profiler.record_function(FLUSH):
            self._flush()

    def _flush(self) -> None:
        if self.device == "cuda":
            self._resolve(block=True)
        rows, self._rows = self._rows, []
        rank, dist = self._rank(), self._dist()
        if dist is not None:
            if self._group is None:  # gather over gloo so an NCCL job's streams are never touched
                self._group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
            gathered: list[Any] = [None] * dist.get_world_size() if rank == 0 else []
            dist.gather_object((rank, rows), gathered if rank == 0 else None, dst=0, group=self._group)
        else:
            gathered = [(rank, rows)]
        if rank == 0 and self.out is not None:
            self._write(gathered)

    def _write(self, gathered: list[tuple[int, list[tuple[int, dict[str, float], float]]]]) -> None:
        """Append the gathered rows to the timings file in the wide format (CSV: plain appends, no polars)."""
        for _, rows in gathered:
            for _, secs, _ in rows:
                self._columns.extend(k for k in secs if k not in self._columns)
        cols = ["rank", "step", *self._columns, TOTAL]
        recs = sorted(
            ((s, r, [secs.get(c) for c in self._columns], tot) for r, rows in gathered for s, secs, tot in rows),
            key=lambda x: (x[0], x[1]),
        )
        if not recs:
            return
        assert self.out is not None
        self.out.parent.mkdir(parents=True, exist_ok=True)
        if self.out.suffix == ".parquet":
            schema = {c: pl.Int64 if c in ("rank", "step") else pl.Float64 for c in cols}
            df = pl.DataFrame([[r, s, *v, t] for s, r, v, t in recs], schema=schema, orient="row")
            old = self._written
            self._written = df if old is None else pl.concat([old, df], how="diagonal_relaxed").select(cols)
            self._written.write_parquet(self.out)
            return
        if self._header != cols:  # a new file, or a section that appeared late: rewrite with the wider header
            old = self._read_csv() if self.out.exists() else []
            with self.out.open("w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(cols)
                w.writerows([row.get(c, "") for c in cols] for row in old)
            self._header = cols
        with self.out.open("a", newline="") as fh:
            csv.writer(fh).writerows([r, s, *(_fmt(x) for x in v), _fmt(t)] for s, r, v, t in recs)

    def _read_csv(self) -> list[dict[str, str]]:
        assert self.out is not None
        with self.out.open(newline="") as fh:
            return list(csv.DictReader(fh))

    def close(self) -> None:
        """Flush what is left (a collective: every rank must call it)."""
        self.flush()

    def __enter__(self) -> StepMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
