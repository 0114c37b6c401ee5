"""Variance-based compression (Tsuzuku, Imachi & Akiba 2018), and its hybrid with Strom's threshold.

Each element keeps an accumulated gradient r and an accumulated variance v (of the minibatch mean
gradient). An element is sent once its value is unambiguous, alpha * v < r^2 — equivalent to the
paper's (alpha/|B|) Var_B[grad_z f] < (grad f_B)^2 with the variance of the mean, Var_z/|B|,
accumulated — and is otherwise delayed, its variance memory decaying by zeta per step. A sent
value is encoded in 4 bits — 1 sign bit and a 3-bit exponent e with |value| ~ scale * 2^-e, scale
the bucket's largest sent magnitude — plus its int32 index; r keeps the quantisation error.
``hybrid`` sends an element only when both criteria hold: it is unambiguous *and* its |r| reaches
Strom's tau. The source's own ratios require it (hybrid 1942x against 913x for variance alone and
230x for Strom's threshold alone): a union of the two sets would send at least as much as either
alone, so its ratio could not exceed the smaller of theirs.

The per-element variance is, as the paper defines it, that of the per-sample gradients within the
local batch (``estimate=sample``, the default): compress.samples computes every sample's gradient
with torch.func before the step's backward, and the variance of the mean gradient is
(sum_z g_z^2 - B g^2) / (B (B-1)). ``estimate=microbatch`` keeps the coarser estimate this project
used before: the local batch split into ``microbatches`` parts, one backward each, a hook on every
parameter accumulating the squares of the per-micro-batch gradients (SampleStats), and the same
formula with m parts in place of B samples. Both are one formula over "parts" of the batch; only
how many parts, and so how well the variance is known, differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import bitpack, samples
from .base import Bucket, Compressor, Payload, positive
from .memory import Memory
from .registry import register


class BatchSquares:
    """Squares of this step's parts (and, per sample, their mean), handed out per bucket: per
    sample from compress.samples; per micro-batch gathered by SampleStats' hooks."""

    def __init__(self):
        self.squares: dict[torch.nn.Parameter, torch.Tensor] = {}
        self.means: dict[torch.nn.Parameter, torch.Tensor] = {}

    def take(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        """The squares of ``params``, flattened in their order, and forget them."""
        return torch.cat([self.squares.pop(p).reshape(-1) for p in params])

    def take_means(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        return torch.cat([self.means.pop(p).reshape(-1) for p in params])


class SampleStats(BatchSquares):
    """Per-parameter sums of squared per-micro-batch gradients, gathered by tensor hooks."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.handles = [p.register_hook(self._hook(p)) for p in model.parameters() if p.requires_grad]

    def _hook(self, param: torch.nn.Parameter):
        def accumulate(grad: torch.Tensor) -> None:
            sq = self.squares.get(param)
            if sq is None:
                self.squares[param] = grad.detach().square()
            else:
                sq.add_(grad.detach().square())
        return accumulate


ESTIMATES = ("sample", "microbatch")


@dataclass
class VarianceOptions:
    alpha: float = 1.0            # confidence: larger delays more
    zeta: float = 0.999           # decay of the variance memory of delayed elements
    estimate: str = "sample"      # the variance of what: each sample's gradient (the paper's), or each micro-batch's
    microbatches: int = 4         # estimate=microbatch: parts of the local batch (change to see how a coarser
                                  # variance moves the ratio)

    def __post_init__(self):
        positive("alpha", self.alpha)
        if not 0 < self.zeta <= 1:
            raise ValueError(f"zeta must be in (0, 1], got {self.zeta}")
        if self.estimate not in ESTIMATES:
            raise ValueError(f"estimate must be one of {', '.join(ESTIMATES)}, got {self.estimate}")
        if self.microbatches < 2:
            raise ValueError(f"microbatches must be at least 2 (a variance needs two samples), got {self.microbatches}")


@dataclass
class HybridOptions(VarianceOptions):
    tau: float = 0.001            # Strom's threshold: an unambiguous element is sent once |r| >= tau too

    def __post_init__(self):
        super().__post_init__()
        positive("tau", self.tau)


# exponent e = round(log2(scale / |x|)) clamped to 0..7, as the count of bounds 2^(k+1/2) it reaches:
# the same comparisons in torch and in the native kernel, so both give the same codes.
_BOUNDS = torch.tensor([2.0 ** (k + 0.5) for k in range(7)], dtype=torch.float32)


def encode4(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """4-bit codes (sign << 3 | exponent) and the scale they are relative to."""
    scale = values.abs().max() if values.numel() else values.new_zeros(())
    ratio = scale / values.abs().clamp_min(torch.finfo(torch.float32).tiny)
    exponent = torch.bucketize(ratio, _BOUNDS.to(ratio.device), right=True)
    codes = (values < 0).to(torch.int64) << 3 | exponent
    return codes, scale.reshape(1).to(torch.float32)


def decode4(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    sign = 1 - 2 * ((codes >> 3) & 1).to(torch.float32)
    return sign * scale[0] * torch.pow(2.0, -(codes & 7).to(torch.float32))


@register
class Variance(Compressor):
    name = "variance"
    server_decodes = False
    server_refusal = ("its encoder reads each whole parameter's per-sample or per-micro-batch statistics, and servers "
                      "may cut a parameter")
    collective = "allgather"
    has_kernels = True
    summary = "variance-based: send elements whose accumulated value is unambiguous, 4-bit + index"
    paper = "Tsuzuku, Imachi & Akiba, Variance-based Gradient Compression for Efficient Distributed Deep Learning, ICLR-W 2018"
    Options = VarianceOptions

    def __init__(self, **options):
        super().__init__(**options)
        per_sample = self.options.estimate == "sample"
        self.microbatches = 1 if per_sample else self.options.microbatches
        self.reads_batch = per_sample
        self.parts = self.options.microbatches     # what the variance is estimated over: samples or micro-batches
        self.sample_stats: BatchSquares | None = None     # made by attach
        self.r = Memory()          # accumulated gradient, per parameter
        self.v = Memory()          # accumulated variance

    def attach(self, model: torch.nn.Module) -> None:
        """Per-sample squares come from observe; per-micro-batch ones from hooks on the
        parameters (the training loop runs ``microbatches`` backward passes a step)."""
        self.sample_stats = BatchSquares() if self.reads_batch else SampleStats(model)

    def observe(self, module: torch.nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor) -> None:
        """This step's per-sample squares, before its backward releases the first bucket."""
        if x.shape[0] < 2:
            raise ValueError("variance's per-sample estimate needs at least 2 samples in each node's batch")
        if self.sample_stats is None:
            self.sample_stats = BatchSquares()
        self.sample_stats.squares, self.sample_stats.means = samples.statistics(module, loss_fn, x, y)
        self.parts = x.shape[0]

    def _squares(self, grad: torch.Tensor, bucket: Bucket) -> torch.Tensor:
        """The bucket's squares, in the units the variance formula reads (sum_j (g_j / m)^2). Per
        sample, shifted so that the formula, which centres on the step's gradient, gives the
        variance around the per-sample gradients' own mean: m²s' - m·raw² = m²s - m·mean²."""
        if self.sample_stats is None:
            raise RuntimeError("variance needs per-sample or per-micro-batch statistics: attach(model) gathers them")
        squares = self.sample_stats.take(bucket.params)
        if self.reads_batch:        # per sample: centre on the samples' own mean (missing means are an error)
            raw, mean = grad * bucket.world, self.sample_stats.take_means(bucket.params)
            squares = squares + (raw * raw - mean * mean) / self.parts
        return squares

    def _step_variance(self, grad: torch.Tensor, bucket: Bucket) -> torch.Tensor:
        """Variance of this step's mean gradient, in the units of ``grad`` (already / world)."""
        m = self.parts
        squares = self._squares(grad, bucket)                    # sum_j (g_j / m)^2, local units
        raw = grad * bucket.world                                # sum_j g_j / m = the local mean gradient
        var_mb = (m * m * squares - m * raw * raw).clamp_min(0) / (m - 1)
        return var_mb / m / bucket.world ** 2

    def _send(self, r: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.options.alpha * v < r * r

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        r, v = self.r.bucket(bucket, grad), self.v.bucket(bucket, grad)
        if (ops := self.native(grad)) is not None:
            o = self.options
            idx, codes, scale = ops.variance_encode(grad, self._squares(grad, bucket), r, v, o.alpha, o.zeta,
                                                    getattr(o, "tau", 0.0), self.parts, bucket.world,
                                                    isinstance(o, HybridOptions))
            return Payload(gather=[idx, codes, scale], sent=idx.numel())
        var = self._step_variance(grad, bucket)
        r.add_(grad)
        v.add_(var)
        idx = torch.nonzero(self._send(r, v) & (r != 0)).reshape(-1)
        codes, scale = encode4(r[idx])
        r[idx] -= decode4(codes, scale)           # the quantisation error stays for later
        v[idx] = 0
        keep = torch.ones_like(v, dtype=torch.bool)
        keep[idx] = False
        v[keep] *= self.options.zeta
        return Payload(gather=[idx.to(torch.int32), bitpack.pack(codes, 4), scale], sent=idx.numel())

    def decode_sum(self, gathered, meta, bucket, numel, out=None):
        ops = self.native(gathered[0][0])
        return ops.variance_decode(*([t[i] for t in gathered] for i in range(3)), numel, out) if ops else None

    def decode(self, tensors, meta, bucket, numel):
        idx = tensors[0].long()
        out = torch.zeros(numel, dtype=torch.float32, device=idx.device)
        out[idx] = decode4(bitpack.unpack(tensors[1], 4, idx.numel()), tensors[2])
        return out


@register
class Hybrid(Variance):
    name = "hybrid"
    summary = "variance criterion and Strom's threshold (|r| >= tau) together, 4-bit + index"
    Options = HybridOptions

    def _send(self, r: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return super()._send(r, v) & (r.abs() >= self.options.tau)
