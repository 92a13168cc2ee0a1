"""What every simulated job shares, whatever feature moves it: its states and its checkpoint rollback."""

from __future__ import annotations

import math

# job states
PENDING, WAITING, RUNNING, DONE, UNSCHEDULABLE = 0, 1, 2, 3, 4


def checkpoint_kept(before: float, done: float, interval_s: float) -> float:
    """Progress a job keeps when it is stopped with ``done`` work made, having resumed at ``before``.

    It rolls back to its last checkpoint (one every ``interval_s`` of progress), never behind the point it
    resumed from; ``interval_s`` 0 means it checkpoints at the moment it stops and keeps everything.
    """
    if interval_s <= 0:
        return done
    kept = math.floor(done / interval_s) * interval_s
    return kept if kept > before else before
