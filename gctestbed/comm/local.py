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


def _param_bytes(params: list[torch.Tensor], world: int) -> int:
    return collectives.wire_bytes(sum(p.numel() * p.element_size() for p in params), 0, world)


class LocalSGD:
    def __init__(self, spec: RunSpec, params: list[torch.nn.Parameter]):
        o = spec.comm_options
        self.params, self.last, self.world = params, spec.steps - 1, spec.nodes
        self.period, self.warmup = o["period"], o["warmup"]

    def exchange(self):
        return keep_local(self.warmup)

    def after_step(self, step: int) -> dict:
        """Average after every ``period`` local steps (and after the last); what it cost. Torch's
        utils.average_parameters, as its PeriodicModelAverager does, on every parameter (the
        averager skips those whose gradient was already cleared)."""
        local = step + 1 - self.warmup
        if local <= 0 or (local % self.period and step != self.last):
            return {"sync_s": 0.0, "sync_tx_bytes": 0}
        t = now()
        utils.average_parameters(iter(self.params), dist.group.WORLD)
        return {"sync_s": now() - t, "sync_tx_bytes": _param_bytes(self.params, self.world)}


class DiLoCo:
    def __init__(self, spec: RunSpec, params: list[torch.nn.Parameter]):
        o = spec.comm_options
        self.params, self.inner, self.last, self.world = params, o["inner"], spec.steps - 1, spec.nodes
        self.shared = [p.detach().clone().requires_grad_(True) for p in params]
        self.outer = torch.optim.SGD(self.shared, lr=o["outer_lr"], momentum=o["outer_momentum"], nesterov=True)

    def exchange(self):
        return keep_local(0)

    def after_step(self, step: int) -> dict:
        if (step + 1) % self.inner and step != self.last:
            return {"sync_s": 0.0, "sync_tx_bytes": 0}
        t = now()
        with torch.no_grad():
            delta = torch.cat([(s - p).reshape(-1) for s, p in zip(self.shared, self.params)])  # the outer gradient
            dist.all_reduce(delta)
            delta /= self.world
            offset = 0
            for s in self.shared:
                s.grad = delta[offset:offset + s.numel()].view_as(s).clone()
                offset += s.numel()
        self.outer.step()
        with torch.no_grad():
            for s, p in zip(self.shared, self.params):
                p.copy_(s)
        return {"sync_s": now() - t, "sync_tx_bytes": _param_bytes(self.params, self.world)}
