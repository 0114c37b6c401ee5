"""The Compressor interface, the Payload it produces, and the Bucket it is given.

A compressor turns a flat gradient into a payload and back. A payload has two parts: tensors
that may be summed across ranks (``reduce``: fp16 values, PowerSGD's factors, dense leftovers)
and tensors every rank must see from every other rank (``gather``: indices and values of top-k,
packed signs, 2-bit codes). Its tensors are exactly what is sent, so its byte count is the wire
size by construction. Decompressing may yield another payload: a further round (PowerSGD sends
P, then Q; TernGrad first agrees on a shared scale).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from .. import kernels

COLLECTIVES = ("allreduce", "allgather")


@dataclass
class Payload:
    """What one rank sends in one round for one bucket, plus what decoding needs (``meta``).

    After the collectives, ``reduce`` holds the sums over ranks and ``gathered[r]`` the
    ``gather`` tensors of rank ``r``.
    """

    reduce: list[torch.Tensor] = field(default_factory=list)
    gather: list[torch.Tensor] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    gathered: list[list[torch.Tensor]] | None = None
    sent: int | None = None      # elements carried, for methods that choose them (sparsifiers, variance)

    @property
    def nbytes(self) -> int:
        """Exact bytes of this rank's payload (before the collective's own overhead)."""
        return sum(t.numel() * t.element_size() for t in self.reduce + self.gather)


@dataclass
class Bucket:
    """What a compressor may know about the flat gradient it gets: DDP's index of the bucket
    (``key``), the shapes of the parameters laid out in it and their names in the model (``ids``:
    what memories and random streams are keyed by, the same on every rank and unchanged when DDP
    rebuilds its buckets), the training step, and the ranks. A bucket made without ``ids`` (tests,
    benchmarks) stands for parameters of its own, (key, 0), (key, 1), ..."""

    key: int
    shapes: list[torch.Size]
    step: int = 0
    rank: int = 0
    world: int = 1
    params: list[torch.nn.Parameter] = field(default_factory=list)
    ids: tuple = ()

    def __post_init__(self):
        if not self.ids:
            self.ids = tuple((self.key, i) for i in range(len(self.shapes)))

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of ``flat`` shaped like the bucket's parameters."""
        out, offset = [], 0
        for shape in self.shapes:
            n = shape.numel()
            out.append(flat[offset:offset + n].view(shape))
            offset += n
        return out


def stable_hash(parts: tuple) -> int:
    """A 64-bit hash of ``parts`` (numbers, strings, tuples of them) that is the same in every
    process: Python's own hash of a string changes from one process to the next."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


def seeded(*parts: Any) -> torch.Generator:
    """A CPU generator seeded from ``parts`` (seed, rank, step, parameters, ...): reproducible, and
    the same on every rank when the parts are."""
    return torch.Generator().manual_seed(stable_hash(parts) & 0x7FFFFFFFFFFFFFFF)


def stream_key(*parts: Any) -> int:
    """A 32-bit key for the counter-based random stream of the native kernels (and their torch
    reference), derived from ``parts`` like ``seeded``."""
    return stable_hash(parts) & 0xFFFFFFFF


def positive(name: str, value: float) -> None:
    """For options' ``__post_init__``: refuse a value that must be above zero."""
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value}")


@dataclass
class NoOptions:
    """This method has no options."""


# What a wrapper standing in for a method (error feedback, a replay's recorded codec) takes from it:
# its name and labels, and what the run's setup reads of it (its optimizer's check, the loop's passes)
DESCRIBES = ("name", "collective", "summary", "paper", "Options", "momentum_inside", "clips_locally", "microbatches",
             "rounds")


class Compressor:
    """One method. Subclasses set the class attributes and implement ``encode`` and ``decode``.

    ``encode`` receives the bucket's flat gradient already divided by the world size (so the sum
    of what the ranks contribute is the mean gradient). ``decode`` turns one rank's gather part
    (or the summed reduce part) back into a dense tensor; ``decompress`` combines them after the
    collectives and may be overridden for multi-round methods. ``error_feedback`` methods are
    wrapped in compress.feedback.ErrorFeedback by the registry.
    """

    name: ClassVar[str]
    collective: ClassVar[str]
    summary: ClassVar[str]
    paper: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    error_feedback: ClassVar[bool] = False
    momentum_inside: ClassVar[bool] = False   # the method applies momentum itself: optimizer must not
    microbatches: ClassVar[int] = 1           # backward passes per step the method needs (variance)
    reads_batch: ClassVar[bool] = False       # observe() gets each step's batch before its backward (variance)
    clips_locally: ClassVar[bool] = False     # clips each node's gradient itself (DGC): the run's own clipping is off
    rounds: ClassVar[int] = 1                 # exchanges per bucket (PowerSGD: P then Q; TernGrad: scale then codes)
    has_kernels: ClassVar[bool] = False       # some hot path has a native kernel (native/): load them
    fused_feedback: ClassVar[bool] = False    # encode_feedback updates a residual in the same pass (native)
    # parameter servers (gctestbed.comm): a server sums payloads with ``decompress`` from their tensors
    # and the bucket alone, and (pull=compressed) encodes the sum again with no state of its own
    server_decodes: ClassVar[bool] = True
    server_refusal: ClassVar[str] = ""        # why not, where it cannot
    server_encodes: ClassVar[bool] = True
    ops: Any = None                           # torch.ops.gctestbed when native kernels are chosen and built

    def __init__(self, **options: Any):
        self.options = self.Options(**options)

    def attach(self, model: torch.nn.Module) -> None:
        """Called once with the DDP model before training, for a method that needs more than its
        buckets (variance: per-micro-batch statistics of every parameter). Most need nothing."""

    def observe(self, module: torch.nn.Module, loss_fn: Any, x: torch.Tensor, y: torch.Tensor) -> None:
        """Called each step, before its backward, with the step's local batch, for a method that
        reads more than gradients (variance: every sample's own gradient). Most need nothing."""

    def needs_own_loop(self) -> bool:
        """The method needs statistics only gctestbed's own training loop gathers (several backward
        passes a step, or the batch itself): not a user's '-- CMD' program, not a replay."""
        return self.microbatches > 1 or self.reads_batch

    def native(self, tensor: torch.Tensor) -> Any:
        """The native kernels if they were chosen and run on ``tensor``'s device, else None."""
        return self.ops if kernels.supports(self.ops, tensor) else None

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        raise NotImplementedError

    def decode(self, tensors: list[torch.Tensor], meta: dict, bucket: Bucket, numel: int) -> torch.Tensor:
        """Dense tensor of ``numel`` elements that one rank's ``gather`` part (or, for reduce
        methods, the ``reduce`` part) stands for."""
        raise NotImplementedError

    def encode_feedback(self, grad: torch.Tensor, residual: torch.Tensor, bucket: Bucket) -> Payload:
        """With native kernels, for ``fused_feedback`` methods: encode grad + residual and leave in
        ``residual`` (in place) what the payload does not carry, reading each element once."""
        raise NotImplementedError

    def decode_sum(self, gathered: list[list[torch.Tensor]], meta: dict, bucket: Bucket, numel: int,
                   out: torch.Tensor | None = None) -> "torch.Tensor | None":
        """With native kernels: the sum of the decoded payloads of every rank, in one pass, written
        into ``out`` when given; None where the method has no such kernel (the reference loop then
        decodes one by one)."""
        return None

    def decode_local(self, payload: Payload, bucket: Bucket, numel: int) -> torch.Tensor:
        """What this rank's own payload stands for, before any collective (error feedback)."""
        return self.decode(payload.reduce or payload.gather, payload.meta, bucket, numel)

    def decompress(self, payload: Payload, bucket: Bucket, numel: int,
                   out: torch.Tensor | None = None) -> "torch.Tensor | Payload":
        """The aggregate after the collectives: decoded sum, or the next round's payload. ``out``
        (the bucket's own buffer) may receive the sum, sparing an allocation and a copy; the
        caller must not assume it did."""
        if payload.gathered is None:
            return self.decode(payload.reduce, payload.meta, bucket, numel)
        summed = self.decode_sum(payload.gathered, payload.meta, bucket, numel, out)
        if summed is not None:
            return summed
        out = self.decode(payload.gathered[0], payload.meta, bucket, numel).clone()
        for tensors in payload.gathered[1:]:
            out += self.decode(tensors, payload.meta, bucket, numel)
        return out
