"""The one clock of gctestbed: a monotonic high-resolution timer and a lap counter on it."""

from __future__ import annotations

import time

now = time.perf_counter


class Laps:
    """Successive intervals: ``lap()`` returns the seconds since the previous lap (or start)."""

    def __init__(self) -> None:
        self.last = now()

    def lap(self) -> float:
        t = now()
        elapsed, self.last = t - self.last, t
        return elapsed
