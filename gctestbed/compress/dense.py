"""Dense methods, all-reduced as they are: the uncompressed baseline and half precision."""

from __future__ import annotations

import torch

from .base import Compressor, Payload
from .registry import register


@register
class NoCompression(Compressor):
    """The baseline: the fp32 gradient, all-reduced exactly as DDP does without a hook."""

    name = "none"
    collective = "allreduce"
    summary = "no compression: plain fp32 ring all-reduce (DDP's default)"

    def compress(self, grad: torch.Tensor) -> Payload:
        return Payload([grad], grad.numel(), grad.dtype)

    def decompress(self, payload: Payload) -> torch.Tensor:
        return payload.tensors[0]


@register
class FP16(Compressor):
    """Half precision on the wire: half the bytes; the sum is taken in fp16 (as PyTorch's
    fp16_compress_hook does), which is safe because each rank's share is pre-divided by n."""

    name = "fp16"
    collective = "allreduce"
    summary = "cast to IEEE half precision for the all-reduce, back to fp32 after"
    paper = "Micikevicius et al., Mixed Precision Training, ICLR 2018"

    def compress(self, grad: torch.Tensor) -> Payload:
        return Payload([grad.to(torch.float16)], grad.numel(), grad.dtype)

    def decompress(self, payload: Payload) -> torch.Tensor:
        return payload.tensors[0].to(payload.dtype)
