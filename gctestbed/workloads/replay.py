"""A recorded run's compute, replayed: the model of a trace (gctestbed.trace) with no arithmetic.

The model has the recorded parameters (names, shapes, order), so DDP forms the recorded buckets
and every byte on the wire is the real method's on the real shapes. Its backward hands each
parameter's gradient to DDP at the time the recorded run's hook got that parameter's bucket,
counted from the step's first forward, so DDP releases each bucket when the recorded run did and
the exchange overlaps backward as it did there. Waiting is ``sleep`` (the host's CPU stays free
for communication, as a GPU's compute leaves it) or ``spin`` (small matrix products until the
time comes, so compute contends with communication for the CPU as a CPU run's did). A spin counts
the recorded thread CPU seconds where the trace has them (``clock=cpu``): the wall time they take
is then this replay's, stretched by what its communication threads take of the cores, as the
recorded run's was by its own; ``clock=wall`` holds the recorded wall times instead. Rank r
replays the recorded rank r mod p, and step s the recorded step s: a schedule that depends on
the step (DGC's warm-up, PowerSGD's start) meets the same compute it met when recorded.

A gradient is a fixed random tensor per parameter (seeded), so a method that looks at values
(top-k, DGC) chooses from a plausible spread; loss and accuracy mean nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..compress.recorded import borrowed
from ..timing import Waiter
from ..tracefile import load
from . import images

COMPUTES = ("sleep", "spin")
CODECS = ("real", "recorded")
OPTIMS = ("real", "recorded")
COMMS = ("allreduce", "ps")     # the exchanges a trace is recorded over and a replay runs over
CLOCKS = ("cpu", "wall")


@dataclass
class ReplayOptions:
    trace: str = ""            # the trace file (gctestbed trace record)
    compute: str = "sleep"     # sleep: compute leaves the CPU free (a GPU's); spin: it takes a core (a CPU's)
    scale: float = 1.0         # recorded times x scale (time dilation: K stretches compute as links slow by K)
    codec: str = "real"        # real: the method runs on the replay's gradients (a CPU trace on a CPU host);
    #                            recorded: the recorded payload sizes after the recorded encode and decode
    #                            times (compress/recorded.py: a GPU trace on a CPU host, or dilated)
    real: int = 0              # ranks 0 .. real-1 run the recorded model for real (a mixed run: one real
    #                            node's compute contends with communication against a replayed cluster)
    optim: str = "real"        # real: the optimizer steps the replay's parameters on this host (a CPU run's,
    #                            whose time is this host's, and / K when dilated); recorded: each step waits
    #                            the recorded optimizer time x scale instead (a GPU's optimizer, or dilated)
    clock: str = ""            # what a spin counts: cpu, the recorded thread CPU seconds (a CPU trace: its
    #                            compute's wall time then grows with this replay's contention for the cores,
    #                            as the recorded run's did); wall, the recorded wall times (the recorded run's
    #                            contention kept whatever this run's). Default: cpu where the replay spins and the
    #                            trace has CPU times for all it waits (recorded on a CPU node at one intra-op
    #                            thread, since schema 18), else wall. Sleep waits wall time only

    def __post_init__(self):
        if not self.trace:
            raise ValueError("replay needs trace=FILE (written by 'gctestbed trace record')")
        if self.compute not in COMPUTES:
            raise ValueError(f"compute must be sleep or spin, got {self.compute!r}")
        if self.codec not in CODECS:
            raise ValueError(f"codec must be real or recorded, got {self.codec!r}")
        if self.optim not in OPTIMS:
            raise ValueError(f"optim must be real or recorded, got {self.optim!r}")
        if self.real < 0:
            raise ValueError(f"real counts ranks that run the model, got {self.real}")
        if not self.scale > 0:
            raise ValueError(f"scale must be positive, got {self.scale}")
        if self.clock not in ("", *CLOCKS):
            raise ValueError(f"clock must be cpu or wall, got {self.clock!r}")
        if self.clock == "cpu" and self.compute != "spin":
            raise ValueError("clock=cpu needs compute=spin: a sleep takes no CPU time")


def cpu_clock(o: ReplayOptions, trace: dict) -> bool:
    """Whether the replay of ``trace`` with options ``o`` waits CPU seconds (see ReplayOptions.clock):
    one UserError where clock=cpu is asked of a trace without every CPU time the replay waits."""
    from ..spec import UserError
    if o.compute != "spin" or o.clock == "wall":
        return False
    steps = [s for r in trace["ranks"] for s in r["steps"]]
    keys = ["ready_cpu_s"] + (["encode_cpu_s", "decode_cpu_s"] if o.codec == "recorded" else [])
    missing = [k for k in keys if any(b.get(k) is None for s in steps for b in s["buckets"])]
    if o.optim == "recorded" and any(s.get("optim_cpu_s") is None for s in steps):
        missing.append("optim_cpu_s")
    if missing and o.clock == "cpu":
        raise UserError(f"clock=cpu: the trace lacks {', '.join(missing)} (a GPU's run, one with more than one "
                        "intra-op thread, or one stored before schema 18); replay it with clock=wall.")
    return not missing


def layouts_of(trace: dict, rank: int) -> dict[int, list]:
    """The recorded rank r mod p's bucket layouts: index -> [(parameter name, shape), ...]."""
    return {int(k): v for k, v in trace["layouts"][str(rank % len(trace["ranks"]))].items()}


def schedule(trace: dict, rank: int, cpu: bool = False) -> tuple[list[tuple[str, list[int]]], list[dict[str, float]],
                                                                 dict[str, int]]:
    """For rank ``rank`` mod the recorded ranks: the recorded parameters in the model's order; per
    recorded step, each parameter's ready time (its bucket's, from the step's first forward; with
    ``cpu``, the CPU seconds backward's thread had spent by then); and
    each parameter's place in the buckets DDP rebuilt after step 0 (their index order, each in its
    own order), which is the order their gradients arrived in step 0 and so breaks ties: handed
    over in that order in step 0, they make DDP rebuild the recorded buckets."""
    mine = rank % len(trace["ranks"])
    steps = trace["ranks"][mine]["steps"]
    layouts = layouts_of(trace, rank)
    ready = []
    for s in steps:
        at: dict[str, float] = {}
        for b in s["buckets"]:
            if b.get("ready_s") is None:
                raise ValueError(f"the trace's step {s['step']} has a bucket with no ready time (a run stored before schema 13)")
            for name, _ in layouts[b["layout"]]:
                at[name] = b["ready_cpu_s" if cpu else "ready_s"]
        ready.append(at)
    params = [(name, shape) for name, shape in trace["parameters"]]
    rebuilt = [name for b in sorted(steps[1]["buckets"] if len(steps) > 1 else [], key=lambda b: b["bucket"])
               for name, _ in layouts[b["layout"]]]
    place = {name: i for i, name in enumerate(rebuilt)}
    for name, _ in reversed(params):                 # not rebuilt (one step): DDP's own order, the model's reversed
        place.setdefault(name, len(place))
    return params, ready, place


class _Release(torch.autograd.Function):
    """Identity on the chain forward; backward waits for the parameter's ready time, then hands
    DDP its gradient."""

    @staticmethod
    def forward(ctx, chain, param, state, name):
        ctx.state, ctx.name = state, name
        return chain.clone()

    @staticmethod
    def backward(ctx, grad):
        r, name = ctx.state, ctx.name
        ready = r.ready[r.step].get(name, 0.0)
        # aim the moment the gradient lands (DDP's hook follows it) at the recorded one: hand it over
        # earlier by what landing took this host last step (accumulating it into its bucket)
        late = r.wait.until(r.step_start + r.scale * ready - r.lag.get(ready, 0.0))
        r.behind = max(r.behind, late)
        r.released.setdefault(ready, r.wait.clock())
        return grad, r.grads[name], None, None


@dataclass
class _State:
    """What the replay keeps beside the parameters (apart from them, so no parameter name collides)."""

    ready: list[dict[str, float]]
    place: dict[str, int]
    grads: dict[str, torch.Tensor]
    scale: float
    wait: Waiter                            # its clock is the one every moment below is on
    step: int = -1
    step_start: float = 0.0
    behind: float = 0.0                     # this step: the latest hand-over's lateness past its recorded moment
    # a bucket's parameters share its ready time: per ready time, when backward handed over the first
    # of them this step; per parameter, how long after that it had landed (accumulated), last step
    released: dict[float, float] = field(default_factory=dict)
    landed: dict[str, float] = field(default_factory=dict)
    lag: dict[float, float] = field(default_factory=dict)


class ReplayModel(torch.nn.Module):
    def __init__(self, params: list[tuple[str, list[int]]], ready: list[dict[str, float]], place: dict[str, int],
                 compute: str, scale: float, seed: int, cpu: bool = False):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self._names = [name for name, _ in params]
        for name, shape in params:
            owner, leaf = _owner(self, name.removeprefix("module."))
            owner.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape)))
        self._state = _State(ready, place, {name: torch.randn(shape, generator=gen) * 1e-3 for name, shape in params},
                             scale, Waiter(compute == "spin", cpu))
        for name in self._names:
            self.get_parameter(name.removeprefix("module.")).register_post_accumulate_grad_hook(
                lambda param, name=name: self._landed(name))

    def _landed(self, name: str) -> None:
        r = self._state
        ready = r.ready[r.step].get(name, 0.0)
        if r.step > 0 and ready in r.released:    # step 0: one bucket of everything, no measure of a later one
            r.landed[name] = r.wait.clock() - r.released[ready]

    def step_stats(self) -> dict[str, float]:
        """For the step's row: how far behind the recorded times the host handed gradients over
        (0.0: every one on time). A host that falls behind measures itself, not the recording."""
        return {"behind_s": self._state.behind}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self._state
        r.step += 1
        if r.step >= len(r.ready):
            raise RuntimeError(f"the trace holds {len(r.ready)} steps; this run asked for more")
        r.step_start, r.released, r.lag, r.behind = r.wait.clock(), {}, {}, 0.0
        for name, took in r.landed.items():
            ready = r.ready[r.step].get(name, 0.0)
            r.lag[ready] = max(r.lag.get(ready, 0.0), took)
        handed = sorted(self._names, key=lambda n: (r.ready[r.step].get(n, 0.0), r.place[n]))
        chain = x
        for name in reversed(handed):          # the first handed over last in the chain: backward meets it first
            chain = _Release.apply(chain, self.get_parameter(name.removeprefix("module.")), r, name)
        return chain


def add_buffers(model: torch.nn.Module, buffers: list[tuple[str, torch.Tensor]]) -> None:
    """Give a replayed model the recorded model's buffers (batch norm's statistics), zeros of their
    shapes and dtypes: DDP broadcasts rank 0's buffers before every forward, bytes on the wire a
    replay must send too, and in a mixed run every rank must hold what rank 0 sends."""
    for name, buf in buffers:
        owner, leaf = _owner(model, name)
        owner.register_buffer(leaf, torch.zeros_like(buf))


def _owner(model: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    """The submodule a dotted name ``a.b.leaf`` belongs to (made empty where missing), and ``leaf``:
    so a replayed model's parameters and buffers carry the recorded names."""
    *path, leaf = name.split(".")
    for part in path:
        if not hasattr(model, part):
            model.add_module(part, torch.nn.Module())
        model = getattr(model, part)
    return model, leaf


def build(o: ReplayOptions, seed: int, rank: int, batch_size: int):
    from ..profiler_import import replayable_here
    from ..spec import UserError
    trace = load(o.trace)
    if (why := replayable_here(trace)) is not None:     # this node's torch, which need not be the controller's
        raise UserError(why)
    cpu = cpu_clock(o, trace)
    params, ready, place = schedule(trace, rank, cpu)
    model = ReplayModel(params, ready, place, o.compute, o.scale, seed, cpu)
    add_buffers(model, [(name, torch.zeros(shape, dtype=getattr(torch, dtype)))
                        for name, shape, dtype in trace.get("buffers", [])])

    def batches():
        while True:
            yield torch.zeros(1), torch.zeros(1)

    def evaluate(model: torch.nn.Module) -> dict[str, float | None]:
        return {"loss": None, "accuracy": None}

    return (model, batches(), lambda out, target: out.sum(), evaluate, recorded_codec(trace, rank, o, cpu),
            model.step_stats, recorded_optimizer(trace, rank, o, cpu), sends_buffers(trace))


def sends_buffers(trace: dict) -> bool:
    """Whether the recorded run's DDP sent rank 0's buffers before every forward (a trace of a
    replay says so itself; older traces, by their job's workload options)."""
    if "broadcast_buffers" in trace:
        return trace["broadcast_buffers"]
    return images.broadcasts(trace["job"].get("workload_options") or {})


class RecordedOptimizer:
    """Stands in for a replayed rank's optimizer (optim=recorded): each step waits what the
    recorded rank's optimizer took that step, x scale, and updates nothing (a replay's parameters
    and loss mean nothing). zero_grad is the real optimizer's, so gradients are cleared as DDP
    expects."""

    def __init__(self, inner, times: list[float], scale: float, spin: bool, cpu: bool = False):
        self.inner, self.times, self.scale, self.wait, self.steps = inner, times, scale, Waiter(spin, cpu), 0

    def step(self) -> None:
        self.wait.wait(self.scale * self.times[self.steps])
        self.steps += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)


def recorded_optimizer(trace: dict, rank: int, o: ReplayOptions, cpu: bool = False):
    """What stands in for the optimizer of rank ``rank`` (the recorded rank r mod p's times, CPU
    seconds with ``cpu``), or None when the optimizer runs for real."""
    if o.optim != "recorded":
        return None
    times = [s.get("optim_cpu_s" if cpu else "optim_s") for s in trace["ranks"][rank % len(trace["ranks"])]["steps"]]
    if any(t is None for t in times):
        raise ValueError("optim=recorded: the trace has steps without an optimizer time")
    return lambda inner: RecordedOptimizer(inner, times, o.scale, o.compute == "spin", cpu)


def recorded_codec(trace: dict, rank: int, o: ReplayOptions, cpu: bool = False) -> dict | None:
    """compress.recorded.RecordedCodec's arguments for rank ``rank`` (the recorded rank r mod p's
    buckets by step and DDP's bucket index, its payloads borrowed from other steps for the copies
    beyond the recorded ranks), or None when the method runs for real."""
    if o.codec != "recorded":
        return None
    p = len(trace["ranks"])
    return {"buckets": borrowed(trace["ranks"][rank % p]["steps"], rank // p), "scale": o.scale,
            "spin": o.compute == "spin", "cpu": cpu, "recorded_world": p,
            "shapes": {k: [shape for _, shape in v] for k, v in layouts_of(trace, rank).items()}}
