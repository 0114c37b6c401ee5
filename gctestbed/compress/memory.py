"""The one helper for state a method keeps between steps: error-feedback residuals, DGC's velocity
and accumulation, Signum's momentum, variance's r and v, PowerSGD's errors and Q.

State belongs to parameters, not to bucket indices. DDP rebuilds its buckets after the first step
(in the order gradients become ready), so bucket 0 of step 1 may hold other parameters than
bucket 0 of step 0, at the same size; state kept per bucket index would then be applied to the
wrong parameters. A Memory hands out one flat tensor per set of parameters (a bucket's ``ids``,
their names in the model), keeps using it while every parameter's state still lives in it, and
otherwise assembles the bucket's tensor from each parameter's current state, starting a parameter
afresh only when it has no state yet or its size changed.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

import torch

Fresh = Callable[[Hashable, int], torch.Tensor]     # (parameter id, elements) -> its initial state


def _layout(ids: tuple, sizes: Sequence[int]):
    """(parameter, offset, size) of each parameter laid end to end."""
    offset = 0
    for pid, n in zip(ids, sizes):
        yield pid, offset, n
        offset += n


def _zeros(device) -> Fresh:
    return lambda pid, n: torch.zeros(n, dtype=torch.float32, device=device)


class Memory:
    """One kind of state (a residual, say) for every parameter, handed out per bucket as a flat
    float32 tensor whose parts lie in the bucket's parameter order. Callers update it in place."""

    def __init__(self) -> None:
        self._flats: dict[tuple, torch.Tensor] = {}
        self._home: dict[Hashable, tuple[tuple, int, int]] = {}    # parameter -> (flat's key, offset, size)

    def flat(self, ids: Sequence[Hashable], sizes: Sequence[int], device, fresh: Fresh | None = None) -> torch.Tensor:
        """The state of parameters ``ids`` (of ``sizes`` elements each), concatenated; new
        parameters start from ``fresh`` (zeros by default)."""
        key = tuple(ids)
        held = self._flats.get(key)
        if held is not None and all(self._home[pid] == (key, at, n) for pid, at, n in _layout(key, sizes)):
            return held
        fresh = fresh or _zeros(device)
        parts = []
        for pid, _, n in _layout(key, sizes):
            home = self._home.get(pid)
            if home is not None and home[2] == n:
                parts.append(self._flats[home[0]][home[1]:home[1] + n])
            else:
                parts.append(fresh(pid, n).reshape(-1).to(device=device, dtype=torch.float32))
        flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float32, device=device)
        left = {self._home[pid][0] for pid in key if pid in self._home}
        for pid, at, n in _layout(key, sizes):
            self._home[pid] = (key, at, n)
        self._flats[key] = flat
        for old in left - {key}:                       # drop flats no parameter lives in any more
            if not any(home[0] == old for home in self._home.values()):
                del self._flats[old]
        return flat

    def bucket(self, bucket, like: torch.Tensor, fresh: Fresh | None = None) -> torch.Tensor:
        """The state of a bucket's parameters, shaped like its flat gradient ``like``."""
        return self.flat(bucket.ids, [s.numel() for s in bucket.shapes], like.device, fresh)

    def of(self, pid: Hashable) -> torch.Tensor | None:
        """One parameter's state (a view), or None if it has none."""
        home = self._home.get(pid)
        return None if home is None else self._flats[home[0]][home[1]:home[1] + home[2]]

    def held(self) -> int:
        """Parameters with state."""
        return len(self._home)

    def parts(self) -> dict[Hashable, torch.Tensor]:
        """Every parameter's state (views), by parameter."""
        return {pid: self.of(pid) for pid in self._home}

    def zero_(self) -> None:
        """Every state back to zero (benchmarks start each timed call from the same state)."""
        for flat in self._flats.values():
            flat.zero_()
