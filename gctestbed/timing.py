"""The one clock of gctestbed: a monotonic high-resolution timer, a lap counter on it, and the
moments and spans that on a GPU are the GPU's own time rather than when the CPU queued the work."""

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


class Moment:
    """A point in a step: the CPU clock's reading and, given a GPU ``device``, a CUDA event recorded
    on the calling thread's current stream of that device. The event completes when the GPU reaches
    it, so a span between two events is the GPU's time for the work queued between them (what an
    encode kernel took), not the microseconds the CPU spent queueing it. On a GPU that other
    processes share, or with other work queued on the same stream in between (backward's kernels,
    with several buckets), the span holds that work too."""

    __slots__ = ("cpu", "event")

    def __init__(self, device=None):
        self.cpu = now()
        self.event = None
        if device is not None:
            import torch
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record(torch.cuda.current_stream(device))


class Span:
    """From one Moment to another: the GPU's seconds where both carry events, else the CPU's."""

    __slots__ = ("start", "end")

    def __init__(self, start: Moment, end: Moment):
        self.start, self.end = start, end

    def seconds(self) -> float:
        """Waits for the GPU to reach the end event where it has not (a caller that closes its step
        without synchronising, such as a user's own program)."""
        if self.start.event is not None and self.end.event is not None:
            self.end.event.synchronize()
            return self.start.event.elapsed_time(self.end.event) / 1e3
        return self.end.cpu - self.start.cpu


def seconds(value) -> float:
    """A duration given as seconds, a Span, or a list of either, in seconds (a list: its sum)."""
    if isinstance(value, Span):
        return value.seconds()
    if isinstance(value, (list, tuple)):
        return float(sum(seconds(v) for v in value))
    return value
