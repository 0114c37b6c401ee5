"""Error feedback, once, for any compressor: what was not sent is added to the next gradient.

Per parameter the wrapper keeps a residual e (compress.memory: it follows the parameter when DDP
rebuilds its buckets); per bucket it compresses p = g + e and keeps e = p - D(C(p)), where
D(C(p)) is what its own payload stands for. The invariant sent + residual == accumulated input
holds exactly (to float rounding), which the tests check. Methods with a fused native kernel
(``fused_feedback``) do the same arithmetic in one pass, updating the residual in place.
"""

from __future__ import annotations

import torch

from .base import DESCRIBES, Bucket, Compressor, Payload
from .memory import Memory


class ErrorFeedback(Compressor):
    """Wraps ``inner``; presents its name, collective and options."""

    def __init__(self, inner: Compressor):
        self.inner = inner
        self.options = inner.options
        self.residuals = Memory()
        for attr in (*DESCRIBES, "reads_batch", "has_kernels", "ops", "server_decodes", "server_encodes",
                     "server_refusal"):
            setattr(self, attr, getattr(inner, attr))

    def attach(self, model: torch.nn.Module) -> None:
        self.inner.attach(model)

    def observe(self, module: torch.nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor) -> None:
        self.inner.observe(module, loss_fn, x, y)

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        residual = self.residuals.bucket(bucket, grad)
        if self.inner.fused_feedback and self.inner.native(grad) is not None:
            return self.inner.encode_feedback(grad, residual, bucket)
        acc = grad + residual
        payload = self.inner.encode(acc, bucket)
        residual.copy_(acc - self.inner.decode_local(payload, bucket, grad.numel()))
        return payload

    def decode(self, tensors, meta, bucket, numel):
        return self.inner.decode(tensors, meta, bucket, numel)

    def decode_sum(self, gathered, meta, bucket, numel, out=None):
        return self.inner.decode_sum(gathered, meta, bucket, numel, out)

    def decode_local(self, payload, bucket, numel):
        return self.inner.decode_local(payload, bucket, numel)

    def decompress(self, payload, bucket, numel, out=None):
        return self.inner.decompress(payload, bucket, numel, out)
