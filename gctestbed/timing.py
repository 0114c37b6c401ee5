"""The one clock of gctestbed: a monotonic high-resolution timer, a lap counter on it, and the
moments and spans that on a GPU are the GPU's own time rather than when the CPU queued the work,
and on a CPU also the thread's own CPU seconds (what a phase's work took, apart from the time the
thread waited for a core)."""

from __future__ import annotations

import threading
import time

now = time.perf_counter


def thread_cpu() -> float | None:
    """The calling thread's CPU seconds so far, where they are all of its work's: torch's intra-op
    pool at one thread (a node's default, OMP_NUM_THREADS=1), so the arithmetic a thread starts runs
    on it. None with more threads, whose work this thread's clock does not see."""
    import torch
    return time.thread_time() if torch.get_num_threads() == 1 else None


class Laps:
    """Successive intervals: ``lap()`` returns the seconds since the previous lap (or start)."""

    def __init__(self) -> None:
        self.last = now()

    def lap(self) -> float:
        t = now()
        elapsed, self.last = t - self.last, t
        return elapsed


class Waiter:
    """Waits until a moment on its clock, as replayed work does (workloads/replay.py's compute,
    compress/recorded.py's codec): ``sleep`` leaves the CPU free (a GPU's work leaves the host's CPU
    to communication), ``spin`` keeps a core busy with small matrix products (a CPU's work contends
    with communication, as it did when recorded); the products release the GIL, so the
    communication threads run beside it. A moment already past is not waited for: the host is behind.

    The clock is ``now``'s wall clock, or with ``cpu`` (spin only) the calling thread's CPU seconds:
    a recorded CPU time is then spun as CPU time, and the wall time it takes comes from how the
    replay's threads share the cores, as the recorded run's wall time came from how its did. A
    wall-clock spin holds the recorded wall time instead, whatever the contention here."""

    def __init__(self, spin: bool, cpu: bool = False):
        if cpu and not spin:
            raise ValueError("a CPU-time wait must spin: sleeping takes no CPU time")
        self.spin, self.cpu = spin, cpu
        self.clock = time.thread_time if cpu else now
        self._work = None

    def until(self, deadline: float) -> float:
        """Wait until ``deadline`` on this waiter's clock; how far past it the call came (0.0 when it
        waited). A CPU clock is the calling thread's: read it on the thread that waits."""
        left = deadline - self.clock()
        if left <= 0:
            return -left
        if not self.spin:
            time.sleep(left)
            return 0.0
        import torch
        if self._work is None:
            self._work = torch.rand(64, 64)
        while self.clock() < deadline:
            torch.mm(self._work, self._work)
        return 0.0

    def wait(self, seconds: float) -> None:
        self.until(self.clock() + seconds)


class Moment:
    """A point in a step: the CPU clock's reading and, given a GPU ``device``, a CUDA event recorded
    on the calling thread's current stream of that device. The event completes when the GPU reaches
    it, so a span between two events is the GPU's time for the work queued between them (what an
    encode kernel took), not the microseconds the CPU spent queueing it. On a GPU that other
    processes share, or with other work queued on the same stream in between (backward's kernels,
    with several buckets), the span holds that work too."""

    __slots__ = ("cpu", "event", "thread", "tid")

    def __init__(self, device=None):
        self.cpu = now()
        self.event = None
        # the thread's CPU seconds (None on a GPU, whose work is not the thread's)
        self.thread, self.tid = (thread_cpu() if device is None else None), threading.get_ident()
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

    def cpu_seconds(self) -> float | None:
        """The thread's CPU seconds from start to end: None on a GPU, where the two Moments were taken
        on different threads, or where the thread's clock does not see its work (thread_cpu)."""
        if self.start.thread is None or self.end.thread is None or self.start.tid != self.end.tid:
            return None
        return self.end.thread - self.start.thread


def seconds(value) -> float:
    """A duration given as seconds, a Span, or a list of either, in seconds (a list: its sum)."""
    if isinstance(value, Span):
        return value.seconds()
    if isinstance(value, (list, tuple)):
        return float(sum(seconds(v) for v in value))
    return value


def cpu_seconds(value) -> float | None:
    """The thread CPU seconds of a Span or a list of them (their sum); None where any lacks them, or
    for a plain number of seconds (which carries no CPU time)."""
    if isinstance(value, Span):
        return value.cpu_seconds()
    if isinstance(value, (list, tuple)):
        parts = [cpu_seconds(v) for v in value]
        return None if not parts or any(p is None for p in parts) else float(sum(parts))
    return None
