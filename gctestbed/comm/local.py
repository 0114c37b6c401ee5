"""Communicating less often: local SGD and DiLoCo. Gradients stay on each worker (after local
SGD's warm-up); every so often the workers average the model, densely, over the ring.

- ``localsgd``: PyTorch's post-local SGD. During ``warmup`` steps gradients are all-reduced as
  usual; after it the hook hands each bucket back untouched and the parameters are averaged
  after every ``period`` local steps (torch's model-averaging utility).
- ``diloco`` (Douillard et al., 2023): ``inner`` steps of the run's optimizer on each worker, then
  the change since the last outer step is averaged and an outer SGD step with Nesterov momentum
  (``outer_lr``, ``outer_momentum``) moves the shared parameters; every worker starts the next
  round from them.

Both average once more after the last step when it fell between averages, so a run ends with
identical replicas. Bytes cross the network only on averaging steps (and local SGD's warm-up).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging import utils

from ..compress import collectives, hook
from ..compress.base import Bucket
from ..spec import RunSpec
from ..timing import now


def keep_local(after: int):
    """``HookState.exchange`` that exchanges buckets as the ring does before step ``after`` and
    hands them back untouched from it on."""
    def exchange(state: hook.HookState, future, buffer: torch.Tensor, ctx: Bucket) -> None:
        if ctx.step < after:
            hook.ring_exchange(state, future, buffer, ctx)
        else:
            hook.check_finite(buffer, ctx)
            future.set_result(buffer)
    return exchange


IDLE = {"sync_s": 0.0, "expected_tx_bytes": 0, "reduce_calls": 0}     # a step that did not average


class _Periodic:
    """What local SGD and DiLoCo share: after each optimizer step, average when ``due``
    (and after the last step), and say what it cost in the step's own fields (added to the hook's)."""

    def __init__(self, spec: RunSpec, params: list[torch.nn.Parameter]):
        self.params, self.last, self.options = params, spec.steps - 1, spec.comm_options
        self.bytes = collectives.wire_bytes(sum(p.numel() * p.element_size() for p in params), 0, spec.nodes)

    def due(self, step: int) -> bool:
        raise NotImplementedError

    def average(self) -> None:
        raise NotImplementedError

    def after_step(self, step: int) -> dict:
        if not self.due(step) and step != self.last:
            return dict(IDLE)
        t = now()
        self.average()
        return {"sync_s": now() - t, "expected_tx_bytes": self.bytes, "reduce_calls": 1}   # one flat all-reduce


class LocalSGD(_Periodic):
    """Average after every ``period`` local steps, with torch's utils.average_parameters as its
    PeriodicModelAverager does, on every parameter (the averager skips those whose gradient was
    already cleared)."""

    def exchange(self):
        return keep_local(self.options["warmup"])

    def due(self, step: int) -> bool:
        local = step + 1 - self.options["warmup"]
        return local > 0 and local % self.options["period"] == 0

    def after_step(self, step: int) -> dict:
        if step < self.options["warmup"]:          # the warm-up all-reduced the gradients already
            return dict(IDLE)
        return super().after_step(step)

    def average(self) -> None:
        utils.average_parameters(iter(self.params), dist.group.WORLD)


class DiLoCo(_Periodic):
    """Every ``inner`` steps: the change since the last outer step, averaged over the workers, is
    the outer gradient of an SGD step with Nesterov momentum on the shared parameters."""

    def __init__(self, spec: RunSpec, params: list[torch.nn.Parameter]):
        super().__init__(spec, params)
        o = self.options
        self.shared = [p.detach().clone().requires_grad_(True) for p in params]
        self.outer = torch.optim.SGD(self.shared, lr=o["outer_lr"], momentum=o["outer_momentum"], nesterov=True)

    def exchange(self):
        return keep_local(0)

    def due(self, step: int) -> bool:
        return (step + 1) % self.options["inner"] == 0

    def average(self) -> None:
        with torch.no_grad():
            deltas = [s - p for s, p in zip(self.shared, self.params)]
            utils.average_parameters(iter(deltas), dist.group.WORLD)
            for s, d in zip(self.shared, deltas):
                s.grad = d
        self.outer.step()
        with torch.no_grad():
            for s, p in zip(self.shared, self.params):
                p.copy_(s)


def averaging(spec: RunSpec, params: list[torch.nn.Parameter]) -> _Periodic | None:
    """The run's averaging after the optimizer step (local SGD or DiLoCo), or None."""
    kind = {"localsgd": LocalSGD, "diloco": DiLoCo}.get(spec.comm)
    return kind(spec, params) if kind else None
