"""``--comm``: the schemes' options (each says when to change it), parsing, and what each refuses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..spec import COMMS, LOCAL_COMMS, SpecError, parse_choice, resolve_options

PULLS = ("dense", "compressed")
PLACES = ("mxnet", "balanced")


@dataclass
class AllReduceOptions:
    """The ring: every bucket's payload all-reduced or all-gathered among the workers."""


@dataclass
class PSOptions:
    servers: int = 1           # server nodes; more spread the workers' pushes over more server links
    pull: str = "dense"        # dense: the sum comes back uncompressed (MXNet's kvstore); compressed:
                               # re-encoded with the method (BytePS-style two-way compression)
    split: int = 1_000_000     # a parameter this large is cut over every server (MXNet's bigarray_bound);
                               # smaller ones go whole to one server. Lower it for small models
    place: str = "mxnet"       # mxnet: MXNet's kvstore (a small parameter to server (index * 9973) % servers,
                               # a big one cut into contiguous flat ranges); balanced: gctestbed's even
                               # placement (big ones cut by rows, small ones to the least loaded server): use it
                               # to model servers that are evenly loaded (many small partitions spread over them)

    def __post_init__(self):
        if not 1 <= self.servers <= 32:
            raise ValueError(f"servers must be from 1 to 32, got {self.servers}")
        if self.pull not in PULLS:
            raise ValueError(f"pull must be dense or compressed, got {self.pull!r}")
        if self.place not in PLACES:
            raise ValueError(f"place must be mxnet or balanced, got {self.place!r}")
        if self.split < 1:
            raise ValueError(f"split must be at least 1 element, got {self.split}")


@dataclass
class LocalSGDOptions:
    period: int = 4            # steps between model averages (H): longer saves bytes, costs accuracy
    warmup: int = 0            # steps of ordinary gradient all-reduce first (post-local SGD warms up so)

    def __post_init__(self):
        if self.period < 1 or self.warmup < 0:
            raise ValueError(f"period must be 1 or more and warmup 0 or more, got {self.period} and {self.warmup}")


@dataclass
class DiLoCoOptions:
    inner: int = 8             # inner steps between outer steps (H; the paper's 500 suits runs of 10^4+ steps)
    outer_lr: float = 0.7      # the outer Nesterov step on the averaged parameter change (the paper's 0.7)
    outer_momentum: float = 0.9  # its momentum (the paper's 0.9)

    def __post_init__(self):
        if self.inner < 1 or not self.outer_lr > 0 or not 0 <= self.outer_momentum < 1:
            raise ValueError("inner must be 1 or more, outer_lr above 0 and outer_momentum in [0, 1), got "
                             f"{self.inner}, {self.outer_lr} and {self.outer_momentum}")


OPTIONS: dict[str, type] = dict(zip(COMMS, (AllReduceOptions, PSOptions, LocalSGDOptions, DiLoCoOptions)))


def resolve(text: str) -> tuple[str, dict[str, Any]]:
    """``ps:servers=2`` -> ("ps", every option with its value or default)."""
    name, raw = parse_choice(text, "--comm")
    if name not in OPTIONS:
        raise SpecError(f"unknown --comm scheme '{name}'; available: {', '.join(OPTIONS)} "
                        "(e.g. ps:servers=2,pull=dense or localsgd:period=4).")
    return name, resolve_options(f"--comm '{name}'", OPTIONS[name], raw)


def check(name: str, options: dict[str, Any], compressor, backend: str, own_loop: bool) -> None:
    """A sentence when scheme ``name`` cannot carry ``compressor`` (an instance) here."""
    if name == "allreduce":
        return
    if not own_loop:
        raise SpecError(f"--comm {name} runs inside gctestbed's own training loop: use it with a built-in or "
                        "pkg.module:function workload, not '-- CMD'.")
    if backend != "gloo":
        raise SpecError(f"--comm {name} talks over Gloo here: use --backend gloo.")
    method = compressor.name
    if name in LOCAL_COMMS:
        if method != "none":
            raise SpecError(f"--comm {name} averages the model densely instead of compressing gradients: "
                            f"use --compressor none with it (got {method}).")
        return
    if not compressor.server_decodes:
        raise SpecError(f"a parameter server cannot sum {method}'s payloads ({compressor.server_refusal}): "
                        "use it with --comm allreduce.")
    if options["pull"] == "compressed" and not compressor.server_encodes:
        raise SpecError(f"{method}'s encoder keeps per-worker state (momentum, accumulation or statistics), "
                        "which a server re-encoding the sum does not have: use ps:pull=dense with it.")
