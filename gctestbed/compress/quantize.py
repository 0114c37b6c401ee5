"""Quantisers: every element, in a few bits.

- ``twobit`` (MXNet): residual += g; >= tau -> code 11 (residual -= tau); <= -tau -> code 10
  (residual += tau); else 00. 16 codes per 32-bit word, first value in the most significant bits;
  decoded to +tau / -tau / 0.
- ``onebit`` (MXNet's 1-bit variant): bit 1 where residual > threshold, decoded to +scale, else
  -scale; the residual keeps the difference. 32 codes per word.
- ``qsgd``: per chunk of ``bucket_size`` elements, the L2 norm (fp32) and each element's sign and
  stochastically rounded level in 0..s: unbiased. Codes take 1 + ceil(log2(s+1)) bits, packed in
  the next width of 2, 4 or 8. The rounding noise is a counter-based hash of (key, element), the
  same on every device and thread count (native/ops.h, hash32). A chunk holding NaN or Inf is
  sent with level 0 and its non-finite norm, so it decodes to NaN: visible, not silently finite.
- ``terngrad``: each rank clips its gradient to ``clip`` standard deviations (the paper's gradient
  clipping, which keeps one outlier from setting the scale), the ranks agree on one scale (the
  largest |g| anywhere: scalar sharing), then each sends sign(g) * Bernoulli(|g| / scale) in 2
  bits: unbiased for the clipped gradient.

MXNet's own defaults (tau 0.5, scale 1) assume its gradient scale; ours are sized for gradients
of ~1e-3, and every option can be set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import bitpack
from .base import Bucket, Compressor, Payload, positive, seeded, stream_key
from .registry import register


@dataclass
class TwoBitOptions:
    threshold: float = 0.001
    residual: bool = True         # false: what falls under the threshold is discarded, not delayed (MXNet keeps
                                  # it; the accuracy claims' positive control drops it)

    def __post_init__(self):
        positive("threshold", self.threshold)


@register
class TwoBit(Compressor):
    name = "twobit"
    collective = "allgather"
    has_kernels = True
    summary = "MXNet 2-bit: +-tau or 0 per element, 16 codes per 32-bit word, residual keeps the rest"
    paper = "MXNet gradient compression (after Strom, Interspeech 2015)"
    Options = TwoBitOptions
    error_feedback = True
    fused_feedback = True

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        tau = self.options.threshold
        codes = torch.zeros(grad.numel(), dtype=torch.int64, device=grad.device)
        codes[grad >= tau] = 0b11
        codes[grad <= -tau] = 0b10
        return Payload(gather=[bitpack.pack(codes, 2)])

    def encode_feedback(self, grad, residual, bucket):
        return Payload(gather=[self.ops.twobit_encode(grad, residual, self.options.threshold)])

    def decode_sum(self, gathered, meta, bucket, numel, out=None):
        ops = self.native(gathered[0][0])
        return ops.twobit_decode([t[0] for t in gathered], numel, self.options.threshold, out) if ops else None

    def decode(self, tensors, meta, bucket, numel):
        if (summed := self.decode_sum([tensors], meta, bucket, numel)) is not None:
            return summed
        codes = bitpack.unpack(tensors[0], 2, numel)
        tau = self.options.threshold
        out = torch.zeros(numel, dtype=torch.float32, device=codes.device)
        out[codes == 0b11] = tau
        out[codes == 0b10] = -tau
        return out


@dataclass
class OneBitOptions:
    threshold: float = 0.0
    scale: float = 0.001          # the magnitude a bit stands for (MXNet: 1)

    def __post_init__(self):
        positive("scale", self.scale)


@register
class OneBit(Compressor):
    name = "onebit"
    collective = "allgather"
    has_kernels = True
    summary = "MXNet 1-bit: +scale where residual > threshold else -scale, 32 codes per word, with residual"
    paper = "MXNet 1-bit gradient compression (apache/incubator-mxnet#17952)"
    Options = OneBitOptions
    error_feedback = True
    fused_feedback = True

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        return Payload(gather=[bitpack.pack((grad > self.options.threshold).to(torch.int64), 1)])

    def encode_feedback(self, grad, residual, bucket):
        return Payload(gather=[self.ops.onebit_encode(grad, residual, self.options.threshold, self.options.scale)])

    def decode_sum(self, gathered, meta, bucket, numel, out=None):
        ops = self.native(gathered[0][0])
        return ops.onebit_decode([t[0] for t in gathered], numel, self.options.scale, out) if ops else None

    def decode(self, tensors, meta, bucket, numel):
        if (summed := self.decode_sum([tensors], meta, bucket, numel)) is not None:
            return summed
        bits = bitpack.unpack(tensors[0], 1, numel)
        return (bits.to(torch.float32) * 2 - 1) * self.options.scale


@dataclass
class QSGDOptions:
    levels: int = 7               # s: quantisation levels of |g| / norm
    bucket_size: int = 512        # elements sharing one norm
    seed: int = 0

    def __post_init__(self):
        if not 1 <= self.levels <= 127:
            raise ValueError(f"levels must be 1..127, got {self.levels}")
        if self.bucket_size < 1:
            raise ValueError(f"bucket_size must be at least 1, got {self.bucket_size}")


def _width(levels: int) -> int:
    need = 1 + math.ceil(math.log2(levels + 1))
    return next(w for w in bitpack.WIDTHS if w >= need)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x < 2**32 held in int64, without int64 overflow."""
    return (x * (c & 0xFFFF) + ((x * (c >> 16)) & 0xFFFF) * 65536) & 0xFFFFFFFF


def uniform24(key: int, n: int, device=None) -> torch.Tensor:
    """n draws in [0, 1) with 24 random bits from the counter-based hash of (key, i), i < n: the
    same numbers the native kernels draw (native/ops.h, hash32 and uniform24)."""
    x = _mul32(torch.arange(n, dtype=torch.int64, device=device) & 0xFFFFFFFF, 0x9E3779B1) ^ key
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    x = x ^ (x >> 16)
    return (x >> 8).to(torch.float32) * 2.0**-24


def qsgd_levels(chunks: torch.Tensor, norms: torch.Tensor, levels: int, noise: torch.Tensor) -> torch.Tensor:
    """Codes (level << 1 | sign) of ``chunks`` (rows of bucket_size) given their norms and noise."""
    scaled = chunks.abs() / norms.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(1) * levels
    lower = scaled.floor()
    level = (lower + (noise.view_as(scaled) < scaled - lower).to(torch.float32)).clamp(max=levels)
    level = torch.where(torch.isfinite(scaled), level, 0).to(torch.int64)
    return level << 1 | (chunks < 0).to(torch.int64)


@register
class QSGD(Compressor):
    name = "qsgd"
    collective = "allgather"
    has_kernels = True
    summary = "QSGD: per-chunk L2 norm + sign + stochastically rounded level (unbiased), bit-packed"
    paper = "Alistarh et al., QSGD: Communication-Efficient SGD via Gradient Quantization and Encoding, NeurIPS 2017"
    Options = QSGDOptions

    def _key(self, bucket: Bucket) -> int:
        return stream_key(self.options.seed, bucket.rank, bucket.step, bucket.ids)

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        s, d = self.options.levels, self.options.bucket_size
        if (ops := self.native(grad)) is not None:
            return Payload(gather=list(ops.qsgd_encode(grad, s, d, _width(s), self._key(bucket))))
        n = grad.numel()
        chunks = torch.zeros(math.ceil(n / d) * d, dtype=torch.float32, device=grad.device)
        chunks[:n] = grad
        chunks = chunks.view(-1, d)
        norms = chunks.norm(dim=1)
        noise = uniform24(self._key(bucket), chunks.numel(), grad.device)
        codes = qsgd_levels(chunks, norms, s, noise).reshape(-1)[:n]
        return Payload(gather=[bitpack.pack(codes, _width(s)), norms])

    def decode_sum(self, gathered, meta, bucket, numel, out=None):
        s, d = self.options.levels, self.options.bucket_size
        ops = self.native(gathered[0][0])
        if ops is None:
            return None
        return ops.qsgd_decode([t[0] for t in gathered], [t[1] for t in gathered], numel, s, d, _width(s), out)

    def decode(self, tensors, meta, bucket, numel):
        if (summed := self.decode_sum([tensors], meta, bucket, numel)) is not None:
            return summed
        s, d = self.options.levels, self.options.bucket_size
        codes = bitpack.unpack(tensors[0], _width(s), numel)
        norms = tensors[1].repeat_interleave(d)[:numel]
        sign = 1 - 2 * (codes & 1).to(torch.float32)
        return sign * (codes >> 1).to(torch.float32) * norms / s


@dataclass
class TernGradOptions:
    clip: float = 2.5             # clip |g| to clip * std before ternarising (0: no clipping)
    seed: int = 0

    def __post_init__(self):
        if self.clip < 0:
            raise ValueError(f"clip must be 0 or more, got {self.clip}")


@register
class TernGrad(Compressor):
    name = "terngrad"
    server_decodes = False
    server_refusal = "its workers first agree on a shared scale, a round a server does not run"
    collective = "allgather"
    summary = "TernGrad: shared scale (max |g| over ranks), then sign*Bernoulli(|g|/scale) in 2 bits: unbiased"
    paper = "Wen et al., TernGrad: Ternary Gradients to Reduce Communication in Distributed Deep Learning, NeurIPS 2017"
    Options = TernGradOptions
    rounds = 2

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        if self.options.clip > 0 and grad.numel() > 1:
            bound = self.options.clip * float(grad.std())
            grad = grad.clamp(-bound, bound)
        return Payload(gather=[grad.abs().max().reshape(1)], meta={"grad": grad, "round": "scale"})

    def decompress(self, payload: Payload, bucket: Bucket, numel: int, out=None):
        if payload.meta["round"] == "scale":
            scale = max(float(t[0]) for t in payload.gathered)
            grad = payload.meta["grad"]
            if scale == 0:
                return torch.zeros(numel, dtype=torch.float32, device=grad.device)
            noise = torch.rand(grad.shape, generator=seeded(self.options.seed, bucket.rank, bucket.step,
                                                            bucket.ids)).to(grad.device)
            keep = noise < grad.abs() / scale
            codes = torch.where(keep, torch.where(grad < 0, 0b10, 0b01), 0).to(torch.int64)
            return Payload(gather=[bitpack.pack(codes, 2)], meta={"round": "ternary", "scale": scale})
        return super().decompress(payload, bucket, numel, out)

    def decode(self, tensors, meta, bucket, numel):
        codes = bitpack.unpack(tensors[0], 2, numel)
        return ((codes == 0b01).to(torch.float32) - (codes == 0b10).to(torch.float32)) * meta["scale"]
