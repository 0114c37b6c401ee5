"""When each ``--fault`` of a run starts and ends, counted from the first recorded training step.

The runner's supervision loop ticks the plan; the plan asks the cluster to apply or lift each
fault on time and records both moments, so the step records show what the fault did.
"""

from __future__ import annotations

import time
from typing import Callable

from ..spec import FaultSpec

Record = Callable[..., None]        # record(idx, kind, node, pct, started=|ended=)


class FaultPlan:
    def __init__(self, faults: list[FaultSpec], cluster, record: Record):
        self.faults, self.cluster, self.record = faults, cluster, record
        self.origin: float | None = None
        self.active: set[int] = set()
        self.over: set[int] = set()

    def tick(self, training_started: bool) -> None:
        """Apply or lift whatever is due now; nothing is due before training has started."""
        now = time.monotonic()
        if self.origin is None:
            if not training_started:
                return
            self.origin = now
        elapsed = now - self.origin
        for i, f in enumerate(self.faults):
            if i not in self.active and i not in self.over and elapsed >= f.at_s:
                self.cluster.fault(f.node, f.kind, True, f.pct)
                self.active.add(i)
                self.record(i, f.kind, f.node, f.pct, started=time.time())
            if i in self.active and f.for_s is not None and elapsed >= f.at_s + f.for_s:
                self.cluster.fault(f.node, f.kind, False, f.pct)
                self.active.discard(i)
                self.over.add(i)
                self.record(i, f.kind, f.node, f.pct, ended=time.time())

    def finish(self) -> None:
        """The run is over: faults still on end with it (the network goes with the run)."""
        for i in sorted(self.active):
            f = self.faults[i]
            self.record(i, f.kind, f.node, f.pct, ended=time.time())
        self.over |= self.active
        self.active.clear()

    def context(self) -> str:
        """For an error message: the faults on now, or already applied, if any."""
        on = [self.faults[i].describe() for i in sorted(self.active)]
        past = [self.faults[i].describe() for i in sorted(self.over)]
        if on:
            return f" (while fault {'; '.join(on)} was on)"
        if past:
            return f" (after fault {'; '.join(past)})"
        return ""
