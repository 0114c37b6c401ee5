"""What a run is: RunSpec and LinkSpec, and the parsing of what users type into them.

Everything a run needs travels in a RunSpec, fully resolved (units parsed, defaults filled) and
JSON-serialisable, so a worker never reads flags or global state and a stored run can be
reproduced. Units follow tc: ``kbit``/``mbit``/``gbit`` are bits per second, ``kbps``/``mbps``
are BYTES per second; anything that could be read two ways is refused with a message naming the
accepted forms. This module imports nothing of gctestbed so every other room may use it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

MAX_NODES = 64
SPEC_ENV = "GCTESTBED_SPEC"    # where a user's program finds its run's spec (userscript.install reads it)
DENSE_FLOOR = 1024      # buckets with fewer elements go dense, whatever the method: compressing them saves less than it costs


class UserError(Exception):
    """A mistake the user can fix (bad flag, missing privilege, missing kernel feature).

    Its message is one sentence that says what is wrong and how to fix it; the CLI prints it
    without a traceback and exits 2. Messages quote what the user typed, so control characters
    in it (a newline in a flag) are shown escaped: the sentence stays on one line.
    """

    def __init__(self, message: str = ""):
        super().__init__(_CONTROL.sub(lambda m: repr(m.group())[1:-1], str(message)))


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")    # what str.splitlines() would break on, and the rest of C0/C1


class SpecError(UserError, ValueError):
    """A value typed by the user that cannot be parsed or is out of range."""


# tc's rate units (iproute2 tc_util.c): the *bit forms are bits/s, the *bps forms BYTES/s.
_RATE_UNITS = {
    "bit": 1,
    "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
    "kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40,
    "bps": 8,
    "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9, "tbps": 8 * 10**12,
    "kibps": 8 * 2**10, "mibps": 8 * 2**20, "gibps": 8 * 2**30, "tibps": 8 * 2**40,
}
_TIME_UNITS = {
    "us": 1e-6, "usec": 1e-6, "usecs": 1e-6,
    "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3,
    "s": 1.0, "sec": 1.0, "secs": 1.0,
}
RATE_FORMS = "bit, kbit, mbit, gbit, tbit (bits per second) or bps, kbps, mbps, gbps (BYTES per second, as in tc)"
TIME_FORMS = "us, ms or s"
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e([+-]?[0-9]+))?\s*([a-zA-Z]*)\s*$")


def _split_quantity(text: str, what: str, forms: str, example: str) -> tuple[float, str]:
    raw = str(text).strip()
    if raw.startswith("-"):
        raise SpecError(f"{what} '{raw}' is negative: give a positive number with a unit ({forms}), e.g. {example}.")
    m = _QUANTITY.match(raw)
    if not m:
        raise SpecError(f"{what} '{raw}' is not a number with a unit: use one of {forms}, e.g. {example}.")
    number = float(m.group(1) + (f"e{m.group(2)}" if m.group(2) else ""))
    if not math.isfinite(number):
        raise SpecError(f"{what} '{raw}' is not a finite number: use one of {forms}, e.g. {example}.")
    return number, m.group(3).lower()


def parse_rate(text: str) -> int:
    """Parse a tc rate such as ``100mbit`` or ``12.5mbps`` into bits per second."""
    number, unit = _split_quantity(text, "bandwidth", RATE_FORMS, "100mbit")
    if unit not in _RATE_UNITS:
        hint = "a bare number" if not unit else f"unit '{unit}'"
        raise SpecError(
            f"bandwidth '{str(text).strip()}' has {hint}, which is ambiguous or unknown: "
            f"use one of {RATE_FORMS}, e.g. 100mbit."
        )
    bits = number * _RATE_UNITS[unit]
    if not math.isfinite(bits) or bits >= 8 * 2**64:
        raise SpecError(f"bandwidth '{str(text).strip()}' is too large: tc's rates stop below 2^64 bytes per second (e.g. 100mbit, 40gbit).")
    bps = round(bits)
    if bps <= 0:
        raise SpecError(f"bandwidth '{str(text).strip()}' must be greater than zero, e.g. 100mbit.")
    return bps


def parse_duration(text: str, what: str = "latency") -> float:
    """Parse a tc time such as ``5ms`` or ``250us`` into seconds; a bare ``0`` means none."""
    number, unit = _split_quantity(text, what, TIME_FORMS, "5ms")
    if not unit:
        if number == 0:
            return 0.0
        raise SpecError(f"{what} '{str(text).strip()}' has no unit: use one of {TIME_FORMS}, e.g. 5ms.")
    if unit not in _TIME_UNITS:
        raise SpecError(f"{what} '{str(text).strip()}' has unknown unit '{unit}': use one of {TIME_FORMS}, e.g. 5ms.")
    return number * _TIME_UNITS[unit]


def format_rate(bps: float) -> str:
    """Render bits per second the way tc would print it (``100mbit``)."""
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def format_duration(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if seconds >= 1:
        return f"{seconds:g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds * 1e6:g}us"


def parse_choice(text: str, what: str) -> tuple[str, dict[str, str]]:
    """Split ``name:key=value,key=value`` into the name and its raw option strings."""
    name, _, rest = str(text).strip().partition(":")
    if not name:
        raise SpecError(f"{what} '{text}' has no name: write NAME or NAME:key=value,...")
    options: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise SpecError(f"{what} option '{item}' in '{text}' is not key=value: write {name}:key=value,...")
        if key.strip() in options:
            raise SpecError(f"{what} option '{key.strip()}' is given twice in '{text}'.")
        options[key.strip()] = value.strip()
    return name, options


def resolve_options(owner: str, options_cls: type, raw: dict[str, str]) -> dict[str, Any]:
    """Turn raw option strings into the typed, defaulted fields of ``options_cls`` (a dataclass).

    The dataclass declares each option's type and default; its ``__post_init__`` may raise
    ValueError with a sentence for values out of range.
    """
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    valid = ", ".join(f"{n} (default {_default_of(f)!r})" for n, f in fields.items()) or "none"
    typed: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise SpecError(f"{owner} has no option '{key}'; valid options: {valid}.")
        typed[key] = _coerce(owner, key, value, fields[key].type)
    try:
        return dataclasses.asdict(options_cls(**typed))
    except ValueError as e:
        raise SpecError(f"{owner}: {e}") from None


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _coerce(owner: str, key: str, value: str, typ: Any) -> Any:
    name = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if name == "bool":
            low = value.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if name == "int":
            return int(value)
        if name == "float":
            number = float(value)
            if not math.isfinite(number):
                raise ValueError
            return number
        return value
    except ValueError:
        raise SpecError(f"{owner} option {key}={value!r} is not a valid {name}.") from None


def parse_percent(text: str, what: str = "loss") -> float:
    """Parse ``0.5%`` or ``0.5`` into a percentage in [0, 100)."""
    raw = str(text).strip()
    number = raw[:-1].strip() if raw.endswith("%") else raw
    try:
        pct = float(number)
    except ValueError:
        raise SpecError(f"{what} '{raw}' is not a percentage: write e.g. 0.5% or 0.5.") from None
    if not (math.isfinite(pct) and 0 <= pct < 100):
        raise SpecError(f"{what} '{raw}' must be at least 0% and below 100%.")
    return pct


@dataclass
class LinkSpec:
    """The link between any two nodes of a star, as typed on the command line.

    ``latency_s``, ``jitter_s`` and ``loss_pct`` are end to end, node to node (the round trip is
    twice the latency); the topology decides how they split across hops. ``bw_bps`` is the
    upload rate of every node and ``bw_down_bps`` its download rate (None: the same).
    """

    bw_bps: int
    latency_s: float = 0.0
    jitter_s: float = 0.0
    loss_pct: float = 0.0
    bw_down_bps: int | None = None

    def validate(self) -> None:
        for name in ("bw_bps", "bw_down_bps"):
            value = getattr(self, name)
            if value is None and name == "bw_down_bps":
                continue
            if not isinstance(value, int) or value <= 0:
                raise SpecError(f"link bandwidth must be a positive number of bits per second, got {value!r}.")
        for name in ("latency_s", "jitter_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise SpecError(f"link {name[:-2]} must be zero or a positive number of seconds, got {value!r}.")
        if not (isinstance(self.loss_pct, (int, float)) and 0 <= self.loss_pct < 100):
            raise SpecError(f"link loss must be at least 0% and below 100%, got {self.loss_pct!r}.")
        if self.jitter_s > self.latency_s:
            raise SpecError("--jitter cannot exceed --latency: delays never go below zero.")


@dataclass
class Direction:
    """One direction of one cable: what its egress shaper and delay stage do."""

    rate_bps: int
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss_pct: float = 0.0

    def dilated(self, k: float) -> "Direction":
        """This direction on a host K times slower (time dilation): its rate / K, its delay and
        jitter x K, its loss as it is. The one place rates and delays are dilated."""
        return Direction(max(1, round(self.rate_bps / k)), self.delay_s * k, self.jitter_s * k, self.loss_pct)


def series_loss_pct(losses_pct) -> float:
    """The loss, in percent, of losses in percent met one after another (hops of a path, a fault
    on a lossy link): each passes what the one before let through."""
    return 100 * (1 - math.prod(1 - p / 100 for p in losses_pct))


@dataclass
class Hop:
    """A cable between two ends A and B; ``ab`` shapes A to B, ``ba`` B to A."""

    ab: Direction
    ba: Direction


@dataclass
class NodeAttach:
    """A node's cable to its switch: A is the node (``ab`` is its upload), B the switch."""

    switch: str
    hop: Hop


@dataclass
class Trunk:
    """A cable between two switches."""

    a: str
    b: str
    hop: Hop


@dataclass
class TopologySpec:
    """Switches, the cable of every node (index = rank) and the trunks between switches."""

    name: str
    nodes: list[NodeAttach]
    trunks: list[Trunk] = field(default_factory=list)

    @property
    def switches(self) -> list[str]:
        names = [n.switch for n in self.nodes] + [s for t in self.trunks for s in (t.a, t.b)]
        return list(dict.fromkeys(names))

    def path(self, src: int, dst: int) -> list[Direction]:
        """The directions a packet from node ``src`` to node ``dst`` crosses, in order."""
        a, b = self.nodes[src], self.nodes[dst]
        route = [a.hop.ab]
        for trunk, forward in self._switch_route(a.switch, b.switch):
            route.append(trunk.hop.ab if forward else trunk.hop.ba)
        route.append(b.hop.ba)
        return route

    def _switch_route(self, start: str, goal: str) -> list[tuple["Trunk", bool]]:
        frontier: list[tuple[str, list]] = [(start, [])]
        seen = {start}
        while frontier:
            here, trail = frontier.pop(0)
            if here == goal:
                return trail
            for t in self.trunks:
                for near, far, forward in ((t.a, t.b, True), (t.b, t.a, False)):
                    if near == here and far not in seen:
                        seen.add(far)
                        frontier.append((far, trail + [(t, forward)]))
        raise SpecError(f"topology '{self.name}': switch {goal} cannot be reached from {start}; add a trunk.")

    def validate(self) -> None:
        if not 1 <= len(self.nodes) <= MAX_NODES:
            raise SpecError(f"topology '{self.name}' has {len(self.nodes)} nodes; it needs 1 to {MAX_NODES}.")
        for d in [n.hop.ab for n in self.nodes] + [n.hop.ba for n in self.nodes] + \
                 [t.hop.ab for t in self.trunks] + [t.hop.ba for t in self.trunks]:
            LinkSpec(bw_bps=d.rate_bps, latency_s=d.delay_s, jitter_s=d.jitter_s, loss_pct=d.loss_pct).validate()
        for i in range(1, len(self.nodes)):
            self._switch_route(self.nodes[0].switch, self.nodes[i].switch)

    def dilated(self, k: float) -> "TopologySpec":
        """The same switches and cables with every direction dilated by ``k`` (Direction.dilated)."""
        def hop(h: Hop) -> Hop:
            return Hop(ab=h.ab.dilated(k), ba=h.ba.dilated(k))
        return TopologySpec(name=self.name, nodes=[NodeAttach(n.switch, hop(n.hop)) for n in self.nodes],
                            trunks=[Trunk(t.a, t.b, hop(t.hop)) for t in self.trunks])

    @classmethod
    def star(cls, nodes: int, link: LinkSpec) -> "TopologySpec":
        """Every node on its own cable to one switch; node-to-node figures split evenly over the
        two cables a packet crosses (loss so that the two hops together lose ``loss_pct``)."""
        hop_loss = 100 * (1 - math.sqrt(1 - link.loss_pct / 100))
        up = Direction(link.bw_bps, link.latency_s / 2, link.jitter_s / 2, hop_loss)
        down = Direction(link.bw_down_bps or link.bw_bps, link.latency_s / 2, link.jitter_s / 2, hop_loss)
        return cls(name="star", nodes=[NodeAttach("s0", Hop(ab=up, ba=down)) for _ in range(nodes)])

    @classmethod
    def from_dict(cls, data: dict) -> "TopologySpec":
        def hop(h: dict) -> Hop:
            return Hop(ab=Direction(**h["ab"]), ba=Direction(**h["ba"]))
        return cls(name=data["name"], nodes=[NodeAttach(n["switch"], hop(n["hop"])) for n in data["nodes"]],
                   trunks=[Trunk(t["a"], t["b"], hop(t["hop"])) for t in data.get("trunks", [])])


FAULT_KINDS = ("link-down", "loss")
FAULT_FORMS = "link-down:node=N,at=TIME,for=TIME or loss:node=N,pct=P,at=TIME[,for=TIME]"


@dataclass
class FaultSpec:
    """Something that goes wrong with one node's link mid-run, to see what training does.

    ``link-down`` takes both ends of the node's cable down (as a pulled cable would) for
    ``for_s``; ``loss`` drops ``pct`` percent of the packets in each direction of that cable from
    ``at_s`` on, for ``for_s`` (None: to the end of the run). ``at_s`` counts from the first
    recorded training step, so start-up time does not shift it.
    """

    kind: str
    node: int
    at_s: float
    for_s: float | None = None
    pct: float = 0.0

    def validate(self, nodes: int) -> None:
        if self.kind not in FAULT_KINDS:
            raise SpecError(f"--fault kind must be one of {', '.join(FAULT_KINDS)}, got {self.kind!r}.")
        if not isinstance(self.node, int) or not 0 <= self.node < nodes:
            raise SpecError(f"--fault node={self.node!r} is not a node of this run (0 to {nodes - 1}).")
        if not (isinstance(self.at_s, (int, float)) and math.isfinite(self.at_s) and self.at_s >= 0):
            raise SpecError(f"--fault at= must be zero or a positive time, got {self.at_s!r}.")
        if self.for_s is not None and not (isinstance(self.for_s, (int, float)) and math.isfinite(self.for_s)
                                           and self.for_s > 0):
            raise SpecError(f"--fault for= must be a positive time, got {self.for_s!r}.")
        if self.kind == "link-down" and self.for_s is None:
            raise SpecError("--fault link-down needs for=TIME: how long the link stays down.")
        if self.kind == "loss" and not (isinstance(self.pct, (int, float)) and 0 < self.pct < 100):
            raise SpecError(f"--fault loss needs pct= above 0 and below 100, got {self.pct!r}.")

    def describe(self) -> str:
        what = f"loss {self.pct:g}%" if self.kind == "loss" else "link-down"
        until = f" for {format_duration(self.for_s)}" if self.for_s is not None else ""
        return f"{what} on node {self.node} at {format_duration(self.at_s) if self.at_s else '0s'}{until}"


def parse_fault(text: str) -> FaultSpec:
    """``link-down:node=1,at=10s,for=2s`` or ``loss:node=0,pct=5,at=5s`` into a FaultSpec."""
    kind, raw = parse_choice(text, "--fault")
    if kind not in FAULT_KINDS:
        raise SpecError(f"--fault '{text}' is not a fault: write {FAULT_FORMS}.")
    allowed = {"node", "at", "for"} | ({"pct"} if kind == "loss" else set())
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise SpecError(f"--fault {kind} has no option {unknown[0]!r}: write {FAULT_FORMS}.")
    for key in ("node", "at"):
        if key not in raw:
            raise SpecError(f"--fault '{text}' needs {key}=: write {FAULT_FORMS}.")
    try:
        node = int(raw["node"])
    except ValueError:
        raise SpecError(f"--fault node={raw['node']!r} must be a whole number.") from None
    fault = FaultSpec(kind=kind, node=node, at_s=parse_duration(raw["at"], "--fault at="),
                      for_s=parse_duration(raw["for"], "--fault for=") if "for" in raw else None,
                      pct=parse_percent(raw["pct"], "--fault pct=") if "pct" in raw else 0.0)
    fault.validate(MAX_NODES)
    return fault


KERNEL_MODES = ("native", "torch")
# overlap: communication runs in DDP's hook during backward (production); serial: after backward,
# compress -> communicate -> decompress, each phase timed on its own
TIMING_MODES = ("overlap", "serial")
LAUNCHERS = ("netns", "docker")
OPTIMIZERS = ("sgd", "adam", "adamw")
# how the workers meet (gctestbed.comm): the ring's collectives, parameter servers, or local steps
# with periodic averaging (local SGD, DiLoCo)
COMMS = ("allreduce", "ps", "localsgd", "diloco")
LOCAL_COMMS = ("localsgd", "diloco")       # the schemes that step locally and average the model now and then


@dataclass(frozen=True)
class RunSpec:
    """Everything one run needs, resolved; workers receive it as JSON and nothing else. Frozen:
    flags.build_spec makes it from what was typed, session.resolve fills what only the run can
    (its id, the kernels that really run) in a copy, and nothing changes it after that."""

    nodes: int
    link: LinkSpec
    compressor: str = "none"
    compressor_options: dict[str, Any] = field(default_factory=dict)
    workload: str = "mlp"
    workload_options: dict[str, Any] = field(default_factory=dict)
    steps: int = 20
    batch_size: int = 32
    lr: float = 0.05
    seed: int = 0
    optimizer: str = "sgd"                   # sgd | adam | adamw (gctestbed.optimizers)
    optimizer_options: dict[str, Any] = field(default_factory=dict)
    eval_every: int = 0                      # evaluate on held-out data every this many steps (0: at the end only)
    comm: str = "allreduce"                  # allreduce | ps | localsgd | diloco (gctestbed.comm)
    comm_options: dict[str, Any] = field(default_factory=dict)
    backend: str = "gloo"
    device: str = "cpu"
    bucket_cap_mb: float = 25.0
    timeout_s: float = 300.0
    results_dir: str = "results"
    topology: TopologySpec | None = None     # None: a star of ``nodes`` on ``link``
    latency_impl: str = "auto"               # auto | netem | delayline
    calibrate: bool = True
    accept_miss: bool = False
    kernels: str = "native"                  # native (C++/CUDA, where built) | torch (pure-torch reference)
    mode: str = "overlap"                    # see TIMING_MODES
    launcher: str = "netns"                  # netns | docker
    command: list[str] = field(default_factory=list)   # pass-through: the user's own program instead of our worker
    faults: list[FaultSpec] = field(default_factory=list)
    cpus_per_node: float = 0.0               # each node held to this many CPUs (cgroups); 0: no cap, nodes share the host
    # time dilation (--dilate K): links shaped at rate / K with delays x K (shaped()), a replay's compute x K,
    # and every time the run reports / K (results.summary); link and topology keep the emulated figures
    dilate: float = 1.0
    run_id: str = ""

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of field ``name``: the one place click, sweep and node read it from."""
        f = {f.name: f for f in dataclasses.fields(cls)}[name]
        return f.default_factory() if f.default is dataclasses.MISSING else f.default

    def replace(self, **changes: Any) -> "RunSpec":
        """A copy with ``changes``, validated."""
        spec = dataclasses.replace(self, **changes)
        spec.validate()
        return spec

    @property
    def servers(self) -> int:
        """Parameter-server nodes (``--comm ps:servers=K``, its options resolved by gctestbed.comm);
        0 for every other scheme."""
        return int(self.comm_options["servers"]) if self.comm == "ps" else 0

    @property
    def world(self) -> int:
        """Processes in the run: ``nodes`` workers (ranks 0..N-1), then the servers."""
        return self.nodes + self.servers

    def role(self, rank: int) -> str:
        """How logs and errors name rank ``rank``: ``node R`` or ``server K``."""
        return f"server {rank - self.nodes}" if rank >= self.nodes else f"node {rank}"

    def network(self) -> TopologySpec:
        """The topology this run emulates: the given one, or a star of every node (workers and
        servers alike) on ``link``, in the figures typed (emulated units)."""
        return self.topology or TopologySpec.star(self.world, self.link)

    def shaped(self) -> TopologySpec:
        """The topology as this host shapes it: ``network()`` dilated by ``dilate`` (rates / K,
        delays x K). Everything that builds, re-shapes or calibrates links takes this one."""
        return self.network() if self.dilate == 1 else self.network().dilated(self.dilate)

    def validate(self) -> None:
        if not isinstance(self.nodes, int) or not 1 <= self.nodes <= MAX_NODES:
            raise SpecError(f"--nodes must be a whole number from 1 to {MAX_NODES}, got {self.nodes!r}.")
        self.link.validate()
        for name in ("steps", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SpecError(f"--{name.replace('_', '-')} must be a whole number of at least 1, got {value!r}.")
        for name in ("lr", "bucket_cap_mb", "timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise SpecError(f"{name} must be a positive number, got {value!r}.")
        if self.optimizer not in OPTIMIZERS:
            raise SpecError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}.")
        if not isinstance(self.eval_every, int) or self.eval_every < 0:
            raise SpecError(f"--eval-every must be a whole number of steps (0: at the end only), got {self.eval_every!r}.")
        if self.backend not in ("gloo", "nccl"):
            raise SpecError(f"--backend must be gloo or nccl, got {self.backend!r}.")
        if self.device not in ("cpu", "cuda"):
            raise SpecError(f"--device must be cpu or cuda, got {self.device!r}.")
        if self.kernels not in KERNEL_MODES:
            raise SpecError(f"--kernels must be one of {', '.join(KERNEL_MODES)}, got {self.kernels!r}.")
        if self.launcher not in LAUNCHERS:
            raise SpecError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}.")
        if self.mode not in TIMING_MODES:
            raise SpecError(f"--mode must be one of {', '.join(TIMING_MODES)}, got {self.mode!r}.")
        if not isinstance(self.command, list) or not all(isinstance(a, str) for a in self.command):
            raise SpecError(f"the pass-through command must be a list of arguments, got {self.command!r}.")
        if self.latency_impl not in ("auto", "netem", "delayline"):
            raise SpecError(f"--latency-impl must be auto, netem or delayline, got {self.latency_impl!r}.")
        if self.comm not in COMMS:
            raise SpecError(f"--comm must be one of {', '.join(COMMS)}, got {self.comm!r}.")
        if self.world > MAX_NODES:
            raise SpecError(f"{self.nodes} workers and {self.servers} servers are {self.world} nodes; at most {MAX_NODES}.")
        if self.topology is not None:
            self.topology.validate()
            if len(self.topology.nodes) != self.world:
                extra = f" plus {self.servers} servers" if self.servers else ""
                raise SpecError(f"topology '{self.topology.name}' has {len(self.topology.nodes)} nodes but --nodes is "
                                f"{self.nodes}{extra}.")
        if self.backend == "nccl" and self.device != "cuda":
            raise SpecError("--backend nccl needs --device cuda; use gloo for CPU tensors.")
        if not isinstance(self.faults, list) or not all(isinstance(f, FaultSpec) for f in self.faults):
            raise SpecError(f"faults must be a list of FaultSpec, got {self.faults!r}.")
        for f in self.faults:
            f.validate(self.world)
        if not (isinstance(self.cpus_per_node, (int, float)) and math.isfinite(self.cpus_per_node)
                and (self.cpus_per_node == 0 or 0.01 <= self.cpus_per_node <= 1024)):
            raise SpecError(f"--cpus-per-node must be a number of CPUs from 0.01 to 1024 (0: no cap), "
                            f"got {self.cpus_per_node!r}.")
        if not (isinstance(self.dilate, (int, float)) and math.isfinite(self.dilate) and 1 <= self.dilate <= 1000):
            raise SpecError(f"--dilate must be a number from 1 (no dilation) to 1000, got {self.dilate!r}.")
        if self.dilate != 1:
            if self.workload != "replay":
                raise SpecError(f"--dilate {self.dilate:g} stretches a replay's recorded compute: a real model's compute "
                                "cannot be dilated, so use it with --workload replay:trace=FILE.")
            if self.workload_options.get("real"):
                raise SpecError(f"--dilate {self.dilate:g} cannot stretch a mixed run's real ranks (real=N): "
                                "run mixed runs undilated.")
            if self.workload_options.get("codec", "real") == "real" and self.compressor != "none":
                raise SpecError(f"under --dilate the method's own encoding runs at this host's speed and would be "
                                f"reported {self.dilate:g} times faster than it ran: replay {self.compressor} with "
                                "codec=recorded (a trace recorded with it).")
            if self.workload_options.get("scale") != self.dilate:
                raise SpecError(f"--dilate {self.dilate:g} replays the trace's compute {self.dilate:g} times slower: "
                                f"leave the replay's scale out, or set scale={self.dilate:g}.")
            if self.faults:
                raise SpecError("--fault times are not dilated yet: run faults without --dilate.")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        try:
            data = json.loads(text)
            data["link"] = LinkSpec(**data["link"])
            data.setdefault("kernels", "torch")          # stored before native kernels existed
            if data.get("topology") is not None:
                data["topology"] = TopologySpec.from_dict(data["topology"])
            data["faults"] = [FaultSpec(**f) for f in data.get("faults", [])]
            spec = cls(**data)
        except (ValueError, TypeError, KeyError) as e:
            raise SpecError(f"run spec JSON is not valid: {e}.") from None
        spec.validate()
        return spec
