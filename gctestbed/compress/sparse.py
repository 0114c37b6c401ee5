"""Sparsifiers: send a few elements as (index, value) and keep the rest for later.

- ``topk``: the k largest magnitudes, exactly (torch.topk), int32 indices (ascending) and fp32 values.
- ``randomk``: k elements drawn from a seed every rank shares (seed, step, the bucket's parameters), so the
  indices are never sent and the values are all-reduced; ``unbiased`` scales them by n/k.
- ``threshold`` (Strom 2015): every element whose accumulated value reaches +-tau, sent as one
  32-bit word (bit 31 the sign, bits 0-30 the index), its value implicitly +-tau.

topk, threshold and (biased) randomk use error feedback: the residual keeps what was not sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import Bucket, Compressor, Payload, positive, seeded
from .registry import register


def _k(numel: int, ratio: float) -> int:
    return max(1, min(numel, math.ceil(ratio * numel)))


def scatter_sum(ops, gathered: list[list[torch.Tensor]], numel: int, out=None) -> "torch.Tensor | None":
    """With native kernels, the sum of every rank's (int32 index, value) payload as a dense tensor."""
    return ops.scatter_add([t[0] for t in gathered], [t[1] for t in gathered], numel, out) if ops is not None else None


def _ratio(value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"ratio must be in (0, 1], got {value}")


@dataclass
class TopKOptions:
    ratio: float = 0.01          # fraction of elements sent per bucket

    def __post_init__(self):
        _ratio(self.ratio)


@register
class TopK(Compressor):
    name = "topk"
    collective = "allgather"
    has_kernels = True
    summary = "exact top-k by magnitude, int32 index + fp32 value per element, with error feedback"
    paper = "Aji & Heafield, Sparse Communication for Distributed Gradient Descent, EMNLP 2017"
    Options = TopKOptions
    error_feedback = True

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        idx = torch.topk(grad.abs(), _k(grad.numel(), self.options.ratio), sorted=False).indices
        idx = idx.sort().values        # ascending, as every sparse payload: decoders sum them block by block
        return Payload(gather=[idx.to(torch.int32), grad[idx]], sent=idx.numel())

    def decode_sum(self, gathered, meta, bucket, numel, out=None):
        return scatter_sum(self.native(gathered[0][0]), gathered, numel, out)

    def decode(self, tensors, meta, bucket, numel):
        out = torch.zeros(numel, dtype=torch.float32, device=tensors[1].device)
        out[tensors[0].long()] = tensors[1].to(torch.float32)
        return out


@dataclass
class RandomKOptions:
    ratio: float = 0.01
    seed: int = 0
    unbiased: bool = False       # scale by n/k (unbiased, no error feedback) instead of error feedback

    def __post_init__(self):
        _ratio(self.ratio)


@register
class RandomK(Compressor):
    name = "randomk"
    server_decodes = False
    server_refusal = "its indices come from a random stream that travels with no payload"
    collective = "allreduce"
    summary = "k random elements, the same on every rank (shared seed): values all-reduced, indices never sent"
    paper = "Stich, Cordonnier & Jaggi, Sparsified SGD with Memory, NeurIPS 2018"
    Options = RandomKOptions

    def __init__(self, **options):
        super().__init__(**options)
        self.error_feedback = not self.options.unbiased

    def _indices(self, numel: int, bucket: Bucket, device) -> torch.Tensor:
        return torch.randperm(numel, generator=seeded(self.options.seed, bucket.step, bucket.ids))[:_k(numel, self.options.ratio)].to(device)

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        idx = self._indices(grad.numel(), bucket, grad.device)
        values = grad[idx] * (grad.numel() / idx.numel() if self.options.unbiased else 1.0)
        return Payload(reduce=[values], meta={"idx": idx}, sent=idx.numel())

    def decode(self, tensors, meta, bucket, numel):
        out = torch.zeros(numel, dtype=torch.float32, device=tensors[0].device)
        out[meta["idx"]] = tensors[0]
        return out


@dataclass
class ThresholdOptions:
    tau: float = 0.001           # send an element once its accumulated value reaches +-tau

    def __post_init__(self):
        positive("tau", self.tau)


@register
class Threshold(Compressor):
    name = "threshold"
    collective = "allgather"
    has_kernels = True
    summary = "Strom's threshold: elements reaching +-tau sent as sign+index in one 32-bit word, value +-tau"
    paper = "Strom, Scalable Distributed DNN Training Using Commodity GPU Cloud Computing, Interspeech 2015"
    Options = ThresholdOptions
    error_feedback = True
    fused_feedback = True

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        if grad.numel() >= 2**31:
            raise ValueError("threshold indexes elements with 31 bits: buckets must hold fewer than 2**31")
        idx = torch.nonzero(grad.abs() >= self.options.tau).reshape(-1)
        words = idx | (grad[idx] < 0).to(torch.int64) << 31
        words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
        return Payload(gather=[words], sent=words.numel())

    def encode_feedback(self, grad, residual, bucket):
        words = self.ops.threshold_encode(grad, residual, self.options.tau)
        return Payload(gather=[words], sent=words.numel())

    def decode_sum(self, gathered, meta, bucket, numel, out=None):
        ops = self.native(gathered[0][0])
        return ops.threshold_decode([t[0] for t in gathered], numel, self.options.tau, out) if ops else None

    def decode(self, tensors, meta, bucket, numel):
        words = tensors[0].to(torch.int64) & 0xFFFFFFFF
        out = torch.zeros(numel, dtype=torch.float32, device=words.device)
        tau = self.options.tau
        out[words & 0x7FFFFFFF] = torch.where(words >> 31 == 1, -tau, tau).to(torch.float32)
        return out
