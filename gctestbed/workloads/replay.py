"""A recorded run's compute, replayed: the model of a trace (gctestbed.trace) with no arithmetic.

The model has the recorded parameters (names, shapes, order), so DDP forms the recorded buckets
and every byte on the wire is the real method's on the real shapes. Its backward hands each
parameter's gradient to DDP at the time the recorded run's hook got that parameter's bucket,
counted from the step's first forward, so DDP releases each bucket when the recorded run did and
the exchange overlaps backward as it did there. Waiting is ``sleep`` (the host's CPU stays free
for communication, as a GPU's compute leaves it) or ``spin`` (small matrix products until the
time comes, so compute contends with communication for the CPU as a CPU run's did). Rank r
replays the recorded rank r mod p, and step s the recorded step s: a schedule that depends on
the step (DGC's warm-up, PowerSGD's start) meets the same compute it met when recorded.

A gradient is a fixed random tensor per parameter (seeded), so a method that looks at values
(top-k, DGC) chooses from a plausible spread; loss and accuracy mean nothing here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..tracefile import load

COMPUTES = ("sleep", "spin")


@dataclass
class ReplayOptions:
    trace: str = ""            # the trace file (gctestbed trace record)
    compute: str = "sleep"     # sleep: compute leaves the CPU free (a GPU's); spin: it takes a core (a CPU's)
    scale: float = 1.0         # recorded times x scale (time dilation: K stretches compute as links slow by K)

    def __post_init__(self):
        if not self.trace:
            raise ValueError("replay needs trace=FILE (written by 'gctestbed trace record')")
        if self.compute not in COMPUTES:
            raise ValueError(f"compute must be sleep or spin, got {self.compute!r}")
        if not self.scale > 0:
            raise ValueError(f"scale must be positive, got {self.scale}")


def schedule(trace: dict, rank: int) -> tuple[list[tuple[str, list[int]]], list[dict[str, float]]]:
    """The recorded parameters in the model's order, and per recorded step of rank ``rank`` mod
    the recorded ranks: each parameter's ready time (its bucket's, from the step's first forward)."""
    ranks = trace["ranks"]
    steps = ranks[rank % len(ranks)]["steps"]
    layouts = {int(k): v for k, v in trace["layouts"].items()}
    ready = []
    for s in steps:
        at: dict[str, float] = {}
        for b in s["buckets"]:
            if b.get("ready_s") is None:
                raise ValueError(f"the trace's step {s['step']} has a bucket with no ready time "
                                 "(recorded before schema 13): record the run again")
            for name, _ in layouts[b["layout"]]:
                at[name] = b["ready_s"]
        ready.append(at)
    return [(name, shape) for name, shape in trace["parameters"]], ready


class _Wait:
    def __init__(self, spin: bool):
        self.spin = spin
        self.work = torch.rand(64, 64) if spin else None
        self.late_s = 0.0                       # how far behind the recorded times the host fell

    def until(self, deadline: float) -> None:
        left = deadline - time.perf_counter()
        if left < 0:
            self.late_s = max(self.late_s, -left)
            return
        if not self.spin:
            time.sleep(left)
            return
        while time.perf_counter() < deadline:
            torch.mm(self.work, self.work)        # releases the GIL: the communication thread runs beside it


class _Release(torch.autograd.Function):
    """Identity on the chain forward; backward waits for the parameter's ready time, then hands
    DDP its gradient."""

    @staticmethod
    def forward(ctx, chain, param, model, name):
        ctx.model, ctx.name = model, name
        return chain.clone()

    @staticmethod
    def backward(ctx, grad):
        model, name = ctx.model, ctx.name
        # aim the moment the gradient lands (DDP's hook follows it) at the recorded one: release it
        # earlier by what landing took this host last step (accumulating it into its bucket)
        ready = model.ready[model.step].get(name, 0.0)
        model.wait.until(model.step_start + model.scale * ready - model.lag.get(ready, 0.0))
        model.released.setdefault(ready, time.perf_counter())
        return grad, model.grads[name], None, None


class ReplayModel(torch.nn.Module):
    def __init__(self, params: list[tuple[str, list[int]]], ready: list[dict[str, float]], compute: str,
                 scale: float, seed: int):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.names = []
        for name, shape in params:
            owner = self
            *path, leaf = name.removeprefix("module.").split(".")
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            owner.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape)))
            self.names.append(name)
        self.grads = {name: torch.randn(shape, generator=gen) * 1e-3 for name, shape in params}
        self.ready, self.scale, self.wait = ready, scale, _Wait(compute == "spin")
        self.step, self.step_start = -1, 0.0
        # a bucket's parameters share its ready time: per ready time, when backward handed over the
        # first of them this step, and how long until the last had landed (accumulated), last step
        self.released: dict[float, float] = {}
        self.lag: dict[float, float] = {}
        self.landed: dict[str, float] = {}         # per parameter: landing - its bucket's first release, last step
        for name in self.names:
            self.get_parameter(name.removeprefix("module.")).register_post_accumulate_grad_hook(
                lambda param, name=name: self._landed(name))

    def _landed(self, name: str) -> None:
        ready = self.ready[self.step].get(name, 0.0)
        if ready in self.released:
            self.landed[name] = time.perf_counter() - self.released[ready]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.step += 1
        if self.step >= len(self.ready):
            raise RuntimeError(f"the trace holds {len(self.ready)} steps; this run asked for more")
        self.step_start = time.perf_counter()
        self.lag, self.released = {}, {}
        for name, took in self.landed.items():
            ready = self.ready[self.step].get(name, 0.0)
            self.lag[ready] = max(self.lag.get(ready, 0.0), took)
        order = sorted(self.names, key=lambda n: self.ready[self.step].get(n, 0.0), reverse=True)
        chain = x
        for name in order:                   # the last released first in the chain: backward meets it last
            chain = _Release.apply(chain, self.get_parameter(name.removeprefix("module.")), self, name)
        return chain


def build(o: ReplayOptions, seed: int, rank: int, batch_size: int):
    trace = load(o.trace)
    params, ready = schedule(trace, rank)
    model = ReplayModel(params, ready, o.compute, o.scale, seed)

    def batches():
        while True:
            yield torch.zeros(1), torch.zeros(1)

    def evaluate(model: torch.nn.Module) -> dict[str, float | None]:
        return {"loss": None, "accuracy": None}

    return model, batches(), lambda out, target: out.sum(), evaluate
