"""Error feedback, once, for any compressor: what was not sent is added to the next gradient.

Per bucket the wrapper keeps a residual e; it compresses p = g + e and keeps e = p - D(C(p)),
where D(C(p)) is what its own payload stands for. The invariant sent + residual == accumulated
input holds exactly (to float rounding), which the tests check. A residual whose size no longer
matches its bucket (DDP rebuilds buckets after the first step) starts again from zero. Methods
with a fused native kernel (``fused_feedback``) do the same arithmetic in one pass, updating the
residual in place.
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
        for attr in ("name", "collective", "summary", "paper", "Options", "momentum_inside", "microbatches", "rounds",
                     "has_kernels", "ops"):
            setattr(self, attr, getattr(inner, attr))

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        residual = self.residuals.get(bucket.key)
        if residual is not None and residual.numel() != grad.numel():
            residual = None
        if self.inner.fused_feedback and self.inner.native(grad) is not None:
            if residual is None:
                residual = torch.zeros(grad.numel(), dtype=torch.float32, device=grad.device)
            self.residuals[bucket.key] = residual
            return self.inner.encode_feedback(grad, residual, bucket)
        acc = grad.clone() if residual is None else grad + residual
        payload = self.inner.encode(acc, bucket)
        self.residuals[bucket.key] = acc - self.inner.decode_local(payload, bucket, grad.numel())
        return payload

    def decode(self, tensors, meta, bucket, numel):
        return self.inner.decode(tensors, meta, bucket, numel)

    def decode_sum(self, gathered, meta, bucket, numel, out=None):
        return self.inner.decode_sum(gathered, meta, bucket, numel, out)

    def decode_local(self, payload, bucket, numel):
        return self.inner.decode_local(payload, bucket, numel)

    def decompress(self, payload, bucket, numel, out=None):
        return self.inner.decompress(payload, bucket, numel, out)
