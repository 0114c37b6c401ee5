"""Where a claim was made, where it is measured here, and whether the two match.

A source's claim holds under its own conditions: MXNet's 2-bit speedups on its parameter server
with GPU nodes, the utility study's on 10-100 Gbit/s links with GPU compute. A figure measured
elsewhere is evidence about this machine, not about the claim. Each claim states its source's
conditions (``Conditions``); each experiment's conditions here are read from its own grid and
device (``here``); each part names the conditions it depends on (a speedup depends on the device,
the links, the class of model and the cluster size, an accuracy on the optimizer, the method's
parameters and the class of model). A part whose conditions do not match is not judged: it is
``out of scope here``, with every reason.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from ..spec import parse_choice, parse_rate

ANY = "any"
SPEED = ("comm", "device", "bw", "latency", "model", "nodes")
ACCURACY = ("optimizer", "method", "model")
BYTES = ("method", "model")
# each built-in workload's class of model, the unit a source's claim about "convolutional networks" or
# "LSTMs" speaks of (a class, not a size: sizes are the scale's, shown beside every verdict)
MODEL_CLASSES = {"mlp": "MLP", "cnn": "CNN", "alexnet": "CNN", "vgg16": "CNN", "resnet18": "CNN", "resnet50": "CNN",
                 "lstm": "RNN", "transformer": "transformer", "gpt2": "transformer"}


@dataclass(frozen=True)
class Conditions:
    """The conditions a claim was made under (``any``/None: the source does not limit it).

    ``method``: None when the methods run here are the source's own rows (their parameters as the
    source gives them); otherwise the sentence that says how they depart from it."""

    comm: str = ANY                 # allreduce | ps | any: how the workers met
    device: str = ANY               # gpu | cpu | any: what computed the gradients
    bw_bps: tuple[float | None, float | None] = (None, None)   # the link rates spoken of
    latency_s: tuple[float | None, float | None] = (None, None)
    optimizer: str = ANY
    model: str = ""                 # in words: the sources' models and sizes
    models: tuple[str, ...] = ()    # their classes (MODEL_CLASSES' values); empty: the source does not limit them
    nodes: str = ""                 # in words: the cluster sizes
    cluster: tuple[int | None, int | None] = (None, None)   # those sizes, in nodes (a speed depends on them)
    method: str | None = None       # how the methods here depart from the source's rows, if they do
    caveat: str = ""                # departures judged not to decide the verdict: shown beside it, never gating

    def describe(self) -> str:
        out = [f"comm {self.comm}" if self.comm != ANY else "", f"{self.device.upper()} nodes" if self.device != ANY else "",
               _span("links", self.bw_bps, _rate), _span("latency", self.latency_s, _duration),
               f"optimizer {self.optimizer}" if self.optimizer != ANY else "",
               f"{_classes(self.models)}: {self.model}" if self.models else self.model, self.nodes]
        return "; ".join(p for p in out if p)


@dataclass(frozen=True)
class Here:
    """What an experiment runs under at one scale: read from its grid, never typed twice."""

    comms: tuple[str, ...]
    device: str
    bws: tuple[float, ...]
    latencies: tuple[float, ...]
    optimizers: tuple[str, ...]
    workloads: tuple[str, ...]
    nodes: tuple[str, ...]
    replayed: bool = False          # every workload a replay: compute (and device) the traces', the network real
    unread: tuple[str, ...] = ()    # why a replay's traces cannot be read here (its device and model unknown)

    @property
    def models(self) -> tuple[str, ...]:
        """The classes of the experiment's models (a replay's: the recorded model's); a workload of no
        known class (a user's own) is its own name."""
        classes = []
        for w in self.workloads:
            recorded = replayed(w)
            name = w.split(":")[0]
            classes += recorded[0] if recorded else [MODEL_CLASSES.get(name, name)]
        return tuple(dict.fromkeys(classes))

    def describe(self) -> str:
        nodes = (f"{self.device.upper()} nodes" + (" replayed from traces (their compute, the network here)"
                                                    if self.replayed else "")
                 if not self.unread else f"nodes replaying traces that cannot be read here ({'; '.join(self.unread)})")
        return (f"comm {', '.join(self.comms)}; {nodes}; links "
                f"{', '.join(_rate(b) for b in self.bws)}; latency {', '.join(_duration(x) for x in self.latencies)}; "
                f"optimizer {', '.join(self.optimizers)}; {', '.join(self.nodes)} nodes; {_classes(self.models)}: "
                f"{'; '.join(self.workloads)}")


def here(axes: dict[str, list[str]], device: str) -> Here:
    """The conditions of a grid's axes (filled at one scale) on ``device`` (cpu, cuda, or mixed:
    a store whose runs of the experiment were made on both)."""
    from ..spec import parse_duration
    traces = [replayed(w) for w in axes["workload"]]
    ran = {"cpu", "cuda"} if device == "mixed" else {"cuda" if device == "cuda" else "cpu"}
    # a replay computed on the device its traces were recorded on, whatever ran it here, where it waits every
    # recorded time (pure); one that runs some of its work here computed on both
    kinds = {d for w, t in zip(axes["workload"], traces) for d in (t[1] + (() if pure(w) else tuple(ran)) if t else ran)}
    return Here(comms=tuple(v.split(":")[0] for v in axes.get("comm", ["allreduce"])),
                device="cpu+gpu" if len(kinds) > 1 else {"cuda": "gpu"}.get(kinds.pop(), "cpu"),
                replayed=bool(traces) and all(traces),
                bws=tuple(sorted(parse_rate(b) for b in axes["bw"])),
                latencies=tuple(sorted(parse_duration(x) for x in axes["latency"])),
                optimizers=tuple(v.split(":")[0] for v in axes.get("optimizer", ["sgd"])),
                workloads=tuple(axes["workload"]), nodes=tuple(axes["nodes"]),
                unread=tuple(why for w in axes["workload"] if (why := unread(w))))


def replayed(workload: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """A replay's recorded model classes and devices (cpu, cuda), read from its trace (a directory:
    every trace in it, one per method); None for a workload that is not a replay, or whose traces
    cannot be read here (its runs then fail with the reason)."""
    if not workload.startswith("replay:"):
        return None
    options = parse_choice(workload, "--workload")[1]
    if "trace" not in options:
        return None
    recorded = _recorded(options["trace"])
    return None if isinstance(recorded, str) else recorded[:2]


def pure(workload: str) -> bool:
    """Whether a replay waits every recorded time and runs none of the job's work on this host:
    compute slept, the codec's and the optimizer's times recorded, no rank training for real."""
    return waits_recorded(parse_choice(workload, "--workload")[1])


def waits_recorded(options: dict) -> bool:
    """``pure`` on a replay's options, as typed or as a stored run keeps them (Row.replayed_as),
    each at ReplayOptions' default where left out."""
    o = {k: str(options.get(k, default)) for k, default in
         (("compute", "sleep"), ("codec", "real"), ("optim", "real"), ("real", 0))}
    return (o["compute"], o["codec"], o["optim"], o["real"]) == ("sleep", "recorded", "recorded", "0")


def replay_methods(workload: str) -> tuple[str, ...] | None:
    """The methods a replay's traces were recorded with (a directory: one per trace), or None for a
    workload that is not a replay: what a sweep of it can compare against."""
    if not workload.startswith("replay:"):
        return None
    options = parse_choice(workload, "--workload")[1]
    recorded = _recorded(options["trace"]) if "trace" in options else ""
    return () if isinstance(recorded, str) else recorded[2]


def _recorded(trace: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | str:
    """A trace's (or a directory's traces') model classes, devices and methods, or why they cannot be
    read here; read again when the files change."""
    from .. import tracefile
    path = tracefile.path_of(trace)
    return _recorded_at(path, tracefile.stamp(path))


@functools.lru_cache(maxsize=16)
def _recorded_at(path: str, stamp) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | str:
    from .. import tracefile
    from ..spec import UserError
    if stamp is None:
        return f"there is no {path}, or it cannot be read"
    if os.path.isdir(path):
        try:
            traces = [t for _, t in tracefile.in_dir(path)]
        except UserError as e:
            return str(e)
        if not traces:
            return f"{path} holds no trace this gctestbed reads"
    else:
        try:
            traces = [tracefile.load(path)]
        except (UserError, OSError) as e:
            return str(e)
    classes, devices, methods = [], [], []
    for t in traces:
        job, recorded = t.get("job"), t.get("recorded")
        if not isinstance(job, dict) or "workload" not in job or not isinstance(recorded, dict):
            return f"{path} holds a trace without its job's workload or where it was recorded"
        classes.append(MODEL_CLASSES.get(job["workload"], job["workload"]))
        devices.append(recorded.get("device", "cpu"))
        methods.append(job.get("compressor"))
    return tuple(dict.fromkeys(classes)), tuple(dict.fromkeys(devices)), tuple(m for m in dict.fromkeys(methods) if m)


def unread(workload: str) -> str:
    """Why a replay's traces cannot be read here ("" when they can, or it is no replay of a trace)."""
    if not workload.startswith("replay:"):
        return ""
    options = parse_choice(workload, "--workload")[1]
    got = _recorded(options["trace"]) if "trace" in options else ()
    return got if isinstance(got, str) else ""


def mismatches(source: Conditions, h: Here, needs: tuple[str, ...]) -> list[str]:
    """Why a part that depends on ``needs`` cannot be judged here: one sentence per condition that
    differs from the source's; empty when every one matches."""
    out = []
    if "comm" in needs and source.comm != ANY and source.comm not in h.comms:
        out.append(f"the source measured workers meeting over {_COMMS.get(source.comm, source.comm)}; here they "
                   f"meet over {', '.join(_COMMS.get(c, c) for c in h.comms)}")
    if h.unread and ("device" in needs or "model" in needs):
        out.append(f"a replay's traces cannot be read here ({'; '.join(h.unread)}), so the device they were "
                   f"recorded on and their model are not known")
        needs = tuple(n for n in needs if n not in ("device", "model"))
    if "device" in needs and source.device != ANY and h.device == "cpu+gpu":
        out.append(f"the source's nodes computed on {source.device.upper()}s; the runs here mix CPU and GPU nodes, "
                   f"and a figure over both is neither's")
    elif "device" in needs and source.device != ANY and source.device != h.device:
        out.append(f"the source's nodes computed on {source.device.upper()}s; here on {h.device.upper()}s, whose "
                   f"different compute time changes the share of a step communication takes")
    if "bw" in needs and not all(_inside(b, source.bw_bps) for b in h.bws):
        out.append(f"the source spoke of {_span('links', source.bw_bps, _rate)}; here the links run at "
                   f"{', '.join(_rate(b) for b in h.bws)}")
    if "latency" in needs and not all(_inside(x, source.latency_s) for x in h.latencies):
        out.append(f"the source spoke of {_span('latency', source.latency_s, _duration)}; here "
                   f"{', '.join(_duration(x) for x in h.latencies)}")
    if "optimizer" in needs and source.optimizer != ANY and source.optimizer not in h.optimizers:
        out.append(f"the source trained with {source.optimizer}; here with {', '.join(h.optimizers)}")
    if "model" in needs and source.models and not set(h.models) <= set(source.models):
        out.append(f"the source's claim is about {_classes(source.models)} ({source.model}); here "
                   f"{_classes(h.models)}")
    if "nodes" in needs and not all(_inside(int(n), source.cluster) for n in h.nodes):
        out.append(f"the source ran {_span('clusters', source.cluster, str)} nodes; here {', '.join(h.nodes)} nodes")
    if "method" in needs and source.method:
        out.append(source.method)
    return out


_COMMS = {"ps": "a parameter server (compressed pushes, dense pulls)", "allreduce": "an all-reduce / all-gather ring"}


def _classes(models: tuple[str, ...]) -> str:
    return " and ".join(f"{m}s" for m in models)


def _inside(x: float, span: tuple[float | None, float | None]) -> bool:
    lo, hi = span
    return (lo is None or x >= lo) and (hi is None or x <= hi)


def _span(what: str, span: tuple[float | None, float | None], fmt) -> str:
    lo, hi = span
    if lo is None and hi is None:
        return ""
    if lo is not None and hi is not None:
        return f"{what} of {fmt(lo)} to {fmt(hi)}"
    return f"{what} of at least {fmt(lo)}" if lo is not None else f"{what} of at most {fmt(hi)}"


def _rate(bps: float) -> str:
    return f"{bps / 1e9:g} Gbit/s" if bps >= 1e9 else f"{bps / 1e6:g} Mbit/s"


def _duration(s: float) -> str:
    return f"{s * 1e3:g} ms"
