"""Error feedback, once, for any compressor: what was not sent is added to the next gradient.

Per bucket the wrapper keeps a residual e; it compresses p = g + e and keeps e = p - D(C(p)),
where D(C(p)) is what its own payload stands for. The invariant sent + residual == accumulated
input holds exactly (to float rounding), which the tests check. A residual whose size no longer
matches its bucket (DDP rebuilds buckets after the first step) starts again from zero.
"""

from __future__ import annotations

import torch

from .base import Bucket, Compressor, Payload


class ErrorFeedback(Compressor):
    """Wraps ``inner``; presents its name, collective and options."""

    def __init__(self, inner: Compressor):
        self.inner = inner
        self.options = inner.options
        self.residuals: dict[int, torch.Tensor] = {}
        for attr in ("name", "collective", "summary", "paper", "Options", "momentum_inside", "microbatches", "rounds"):
            setattr(self, attr, getattr(inner, attr))

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        residual = self.residuals.get(bucket.key)
        acc = grad.clone() if residual is None or residual.numel() != grad.numel() else grad + residual
        payload = self.inner.encode(acc, bucket)
        self.residuals[bucket.key] = acc - self.inner.decode_local(payload, bucket, grad.numel())
        return payload

    def decode(self, tensors, meta, bucket, numel):
        return self.inner.decode(tensors, meta, bucket, numel)

    def decode_local(self, payload, bucket, numel):
        return self.inner.decode_local(payload, bucket, numel)

    def decompress(self, payload, bucket, numel):
        return self.inner.decompress(payload, bucket, numel)
