"""A round-based reference simulator, as Gavel/Blox/Helios-style tools work: advance a fixed step, update
every running job, admit arrivals, start FIFO jobs that fit. Used only as the baseline of sim_speed.py."""

from __future__ import annotations

import numpy as np


def naive_fifo(
    submit: np.ndarray, duration: np.ndarray, gpus: np.ndarray, total_gpus: int, step_s: float = 60.0
) -> np.ndarray:
    """Finish times under strict FIFO, simulated in rounds of ``step_s`` seconds (GPU counts only)."""
    order = np.argsort(submit, kind="stable")
    n = len(order)
    remaining = duration.astype(float).copy()
    finish = np.full(n, np.nan)
    queue: list[int] = []
    running: list[int] = []
    free = total_gpus
    t = 0.0
    nxt = 0
    while nxt < n or queue or running:
        while nxt < n and submit[order[nxt]] <= t:
            queue.append(int(order[nxt]))
            nxt += 1
        while queue and gpus[queue[0]] <= free:
            j = queue.pop(0)
            free -= int(gpus[j])
            running.append(j)
        t += step_s
        still = []
        for j in running:
            remaining[j] -= step_s
            if remaining[j] <= 0:
                finish[j] = t + remaining[j]  # back-date to the true end inside the round
                free += int(gpus[j])
            else:
                still.append(j)
        running = still
    return finish
