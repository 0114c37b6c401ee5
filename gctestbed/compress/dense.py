"""Dense methods, all-reduced as they are: the uncompressed baseline, half and bfloat16 precision."""

from __future__ import annotations

import torch

from .base import Bucket, Compressor, Payload
from .registry import register


class _Cast(Compressor):
    """Send every element in ``dtype``; the sum is taken in that dtype (each rank's share is
    already divided by n, so it cannot overflow where the mean does not)."""

    collective = "allreduce"
    dtype: torch.dtype = torch.float32

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        return Payload(reduce=[grad if grad.dtype == self.dtype else grad.to(self.dtype)])

    def decode(self, tensors, meta, bucket, numel):
        return tensors[0] if tensors[0].dtype == torch.float32 else tensors[0].to(torch.float32)


@register
class NoCompression(_Cast):
    name = "none"
    summary = "no compression: plain fp32 ring all-reduce (DDP's default)"
    dtype = torch.float32


@register
class FP16(_Cast):
    name = "fp16"
    summary = "cast to IEEE half precision for the all-reduce, back to fp32 after"
    paper = "Micikevicius et al., Mixed Precision Training, ICLR 2018"
    dtype = torch.float16


@register
class BF16(_Cast):
    name = "bf16"
    summary = "cast to bfloat16 (fp32's range, 8 bits of mantissa) for the all-reduce"
    paper = "Kalamkar et al., A Study of BFLOAT16 for Deep Learning Training, 2019"
    dtype = torch.bfloat16
