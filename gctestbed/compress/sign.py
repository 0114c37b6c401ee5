"""Sign methods: one bit per element, packed 32 to a word.

- ``signsgd``: each rank sends sign(g); the update is the majority vote sign(sum of signs),
  times ``scale`` (signSGD's step is lr * scale).
- ``efsignsgd``: p = g + e; sends sign(p) and one fp32 scale ||p||_1 / d; e = p - scale*sign(p).
- ``signum``: sign of momentum m = beta*m + (1-beta)*g, majority-voted; momentum lives in the
  method, so the optimizer runs without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import bitpack
from .base import Bucket, Compressor, Payload, positive
from .memory import Memory
from .registry import register


def _signs(x: torch.Tensor, ops) -> torch.Tensor:
    """Bit 1 where x >= 0 (NaN packs as 0: -1)."""
    return ops.sign_pack(x) if ops is not None else bitpack.pack((x >= 0).to(torch.int64), 1)


def _pm1(packed: torch.Tensor, numel: int) -> torch.Tensor:
    return bitpack.unpack(packed, 1, numel).to(torch.float32) * 2 - 1


@dataclass
class VoteOptions:
    scale: float = 0.001

    def __post_init__(self):
        positive("scale", self.scale)


class _MajorityVote(Compressor):
    collective = "allgather"
    has_kernels = True

    def decode(self, tensors, meta, bucket, numel):
        return _pm1(tensors[0], numel)

    def decompress(self, payload: Payload, bucket: Bucket, numel: int, out=None):
        if (ops := self.native(payload.gathered[0][0])) is not None:
            return ops.sign_vote([t[0] for t in payload.gathered], numel, self.options.scale, out)
        votes = sum(self.decode(t, payload.meta, bucket, numel) for t in payload.gathered)
        return torch.sign(votes) * self.options.scale


@register
class SignSGD(_MajorityVote):
    name = "signsgd"
    summary = "signSGD with majority vote: 1 bit per element, update = scale * sign(sum of signs)"
    paper = "Bernstein et al., signSGD with Majority Vote is Communication Efficient and Fault Tolerant, ICLR 2019"
    Options = VoteOptions

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        return Payload(gather=[_signs(grad, self.native(grad))])


@dataclass
class SignumOptions:
    beta: float = 0.9
    scale: float = 0.001

    def __post_init__(self):
        if not 0 <= self.beta < 1:
            raise ValueError(f"beta must be in [0, 1), got {self.beta}")
        positive("scale", self.scale)


@register
class Signum(_MajorityVote):
    name = "signum"
    server_encodes = False
    summary = "Signum: sign of the local momentum, majority vote; momentum lives in the method"
    paper = "Bernstein et al., signSGD: Compressed Optimisation for Non-Convex Problems, ICML 2018"
    Options = SignumOptions
    momentum_inside = True

    def __init__(self, **options):
        super().__init__(**options)
        self.momentum = Memory()

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        m = self.momentum.bucket(bucket, grad)
        beta = self.options.beta
        m.copy_(beta * m + (1 - beta) * grad)
        return Payload(gather=[_signs(m, self.native(m))])


@register
class EFSignSGD(Compressor):
    name = "efsignsgd"
    collective = "allgather"
    has_kernels = True
    summary = "EF-signSGD: sign bits plus one scale ||p||_1/d per bucket, with error feedback"
    paper = "Karimireddy et al., Error Feedback Fixes SignSGD and other Gradient Compression Schemes, ICML 2019"
    error_feedback = True

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        return Payload(gather=[_signs(grad, self.native(grad)), (grad.abs().sum() / grad.numel()).reshape(1)])

    def decode(self, tensors, meta, bucket, numel):
        if (ops := self.native(tensors[0])) is not None:
            return ops.sign_unpack(tensors[0], numel, float(tensors[1][0]))
        return _pm1(tensors[0], numel) * tensors[1][0]
