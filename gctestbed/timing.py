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


class Waiter:
    """Waits until a moment on ``now``'s clock, as replayed work does (workloads/replay.py's compute,
    compress/recorded.py's codec): ``sleep`` leaves the CPU free (a GPU's work leaves the host's CPU
    to communication), ``spin`` keeps a core busy with small matrix products (a CPU's work contends
    with communication, as it did when recorded); the products release the GIL, so the
    communication threads run beside it. A moment already past is not waited for: the host is behind."""

    def __init__(self, spin: bool):
        self.spin = spin
        self._work = None

    def until(self, deadline: float) -> float:
        """Wait until ``deadline``; how far past it the call came (0.0 when it waited)."""
        left = deadline - now()
        if left <= 0:
            return -left
        if not self.spin:
            time.sleep(left)
            return 0.0
        import torch
        if self._work is None:
            self._work = torch.rand(64, 64)
        while now() < deadline:
            torch.mm(self._work, self._work)
        return 0.0

    def wait(self, seconds: float) -> None:
        self.until(now() + seconds)
