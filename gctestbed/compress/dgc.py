"""Deep Gradient Compression: top-k by a sampled threshold, with the tricks that keep accuracy.

Per sparsified tensor: velocity u = momentum*u + g (momentum correction: momentum is accumulated
before sparsification, so the optimizer runs without it); accumulation v = v + u (local gradient
accumulation: what is not sent now is sent later); a threshold is
estimated from a random sample of |v| (``sample_ratio``, ~1 %) and refined when the selected
count misses the target (halved while far too few, exact top-k among the selected when far too
many, ties to the lower index), never sorting the whole tensor; indices are sent in ascending
order; the selected v are sent as int32 index + fp32 (or fp16)
value, or, with ``packing=runlength``, as the paper's encode packs them (§3.1): each value with
the 16-bit count of zeros before it, 6 bytes an element instead of 8, a run longer than 65,535
cut by a zero-valued entry (``to_runs``: this cut is gctestbed's, the paper does not say how it
marks long runs); both v and u are zeroed where sent (momentum factor masking). Each parameter's local
gradient is clipped to an L2 norm of ``clip_norm`` / sqrt(N) first (local gradient clipping;
0 turns it off). Density
warms up: 25 %, 6.25 %, 1.5625 %, 0.39 % over the first ``warmup_epochs`` epochs (75 %, 93.75 %,
98.4375 %, 99.6 % sparsity), then ``ratio``. Tensors with one dimension or fewer than
``min_numel`` elements go dense: velocity all-reduced as is.

Each trick can be turned off, so the paper's ablation is a sweep over options: ``accumulate=false``
sends the top of this step's input and drops the rest; ``momentum_correction=false`` compresses
the gradient itself and leaves momentum to the optimizer (which then may be Adam);
``masking=false`` keeps the velocity where values were sent; ``clip_norm=0`` and
``warmup_epochs=0`` turn clipping and warm-up off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import Bucket, Compressor, Payload, seeded
from .memory import Memory
from .registry import register
from .sparse import scatter_sum


@dataclass
class DGCOptions:
    ratio: float = 0.001           # final density (99.9 % sparsity)
    warmup_epochs: int = 4
    steps_per_epoch: int = 10      # what an epoch is for the warm-up schedule
    momentum: float = 0.9
    clip_norm: float = 0.0
    min_numel: int = 1024
    sample_ratio: float = 0.01
    fp16_values: bool = False
    seed: int = 0
    accumulate: bool = True             # local gradient accumulation; false: what is not sent is dropped
    momentum_correction: bool = True    # momentum before sparsification; false: the optimizer's momentum
    masking: bool = True                # momentum factor masking (only with momentum_correction)
    packing: str = "index"              # index: int32 index + value; runlength: 16-bit zero run + value (the paper's)

    def __post_init__(self):
        if not 0 < self.ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio}")
        if self.warmup_epochs < 0 or self.steps_per_epoch < 1:
            raise ValueError("warmup_epochs must be 0 or more and steps_per_epoch at least 1")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if not 0 < self.sample_ratio <= 1:
            raise ValueError(f"sample_ratio must be in (0, 1], got {self.sample_ratio}")
        if self.clip_norm < 0 or self.min_numel < 1:
            raise ValueError("clip_norm must be 0 or more and min_numel at least 1")
        if self.packing not in PACKINGS:
            raise ValueError(f"packing must be one of {', '.join(PACKINGS)}, got {self.packing!r}")


PACKINGS = ("index", "runlength")
RUN_MAX = 65535             # the longest run of zeros a 16-bit count holds


def to_runs(idx: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ascending positions and their values as (16-bit runs of zeros, values): each entry's run
    counts the zeros since the previous entry; a gap longer than RUN_MAX is cut by entries of
    value 0 with run RUN_MAX. The runs travel as int16 holding the unsigned count's bits."""
    idx = idx.to(torch.int64)
    gaps = idx - torch.cat([idx.new_full((1,), -1), idx[:-1]]) - 1
    fillers = gaps // (RUN_MAX + 1)
    last_run = gaps - fillers * (RUN_MAX + 1)
    owner = torch.repeat_interleave(torch.arange(idx.numel(), device=idx.device), fillers + 1)
    starts = torch.cumsum(fillers + 1, 0) - (fillers + 1)
    last = torch.arange(owner.numel(), device=idx.device) - starts[owner] == fillers[owner]
    runs = torch.where(last, last_run[owner], torch.full_like(owner, RUN_MAX))
    packed = torch.where(last, values[owner], torch.zeros((), dtype=values.dtype, device=values.device))
    return (runs - (runs > 32767).to(torch.int64) * 65536).to(torch.int16), packed


def from_runs(runs: torch.Tensor) -> torch.Tensor:
    """The int32 positions ``to_runs`` packed: each after its run of zeros and the entry before it."""
    counts = runs.to(torch.int64) & 0xFFFF
    return (torch.cumsum(counts + 1, 0) - 1).to(torch.int32)


def sample_sizes(n: int, density: float, sample_ratio: float) -> tuple[int, int, int]:
    """(k, sample size, k within the sample) for selecting about density * n of n elements."""
    k = max(1, math.ceil(density * n))
    sample_n = min(n, max(k, math.ceil(sample_ratio * n), 64))
    return k, sample_n, max(1, math.ceil(density * sample_n))


def keep_largest(mag: torch.Tensor, idx: torch.Tensor, k: int) -> torch.Tensor:
    """Of the ascending indices ``idx``, the k with the largest ``mag``; ties go to the lower index."""
    mags = mag[idx]
    kth = torch.topk(mags, k).values[-1]
    above = mags > kth
    tie = mags == kth
    return idx[above | (tie & (tie.cumsum(0) <= k - above.sum()))]


def sampled_threshold_select(v: torch.Tensor, density: float, sample_ratio: float,
                             generator: torch.Generator, ops=None) -> torch.Tensor:
    """Ascending indices of about density * n largest |v|, from a threshold estimated on a sample.

    The threshold is the sample's k-th largest |v| (NaN ranks highest, as in torch.topk); it is
    halved while far too few pass, and an over-full selection is trimmed to the exact k largest.
    """
    n = v.numel()
    k, sample_n, k_sample = sample_sizes(n, density, sample_ratio)
    sample = torch.randint(n, (sample_n,), generator=generator).to(v.device)
    if ops is not None:
        return ops.dgc_select(v, sample, k_sample, k)
    mag = v.abs()
    threshold = torch.topk(mag[sample], k_sample).values[-1]
    idx = torch.nonzero(mag >= threshold).reshape(-1)
    for _ in range(4):                                      # far too few: lower the threshold
        if idx.numel() >= 0.8 * k or not threshold > 0:
            break
        threshold = threshold / 2
        idx = torch.nonzero(mag >= threshold).reshape(-1)
    if idx.numel() > 1.3 * k:                               # far too many: exact top-k among them
        idx = keep_largest(mag, idx, k)
    return idx


def _dense(idx: torch.Tensor, values: torch.Tensor, numel: int) -> torch.Tensor:
    out = torch.zeros(numel, dtype=torch.float32, device=values.device)
    out[idx.long()] = values.to(torch.float32)        # positions are distinct; a run's cutting entries are 0
    return out


@register
class DGC(Compressor):
    name = "dgc"
    server_encodes = False
    collective = "allgather"
    has_kernels = True
    summary = "DGC: sampled-threshold top-k, momentum correction, clipping, factor masking, warm-up"
    paper = "Lin et al., Deep Gradient Compression, ICLR 2018"
    Options = DGCOptions
    momentum_inside = True

    def __init__(self, **options):
        super().__init__(**options)
        self.momentum_inside = self.options.momentum_correction
        self.clips_locally = self.options.clip_norm > 0      # local clipping replaces clipping after aggregation (§3.2)
        self.velocity = Memory()
        self.accumulated = Memory()

    def density(self, step: int) -> float:
        epoch = step // self.options.steps_per_epoch
        if epoch < self.options.warmup_epochs:
            return max(self.options.ratio, 0.25 ** (epoch + 1))
        return self.options.ratio

    def _sparse(self, bucket: Bucket) -> list[bool]:
        return [len(s) > 1 and s.numel() >= self.options.min_numel for s in bucket.shapes]

    def clip(self, grad: torch.Tensor, bucket: Bucket) -> torch.Tensor:
        """Local gradient clipping: each parameter's own gradient on this node (``grad`` is divided
        by the world size) scaled down to an L2 norm of at most clip_norm * N^-1/2, before it is
        accumulated; N^-1/2 is the paper's share of the global threshold for one of N nodes. The
        paper clips the node's whole gradient (the sum of its L2 norms); a hook sees one bucket at
        a time while backward runs, so the rule here is per parameter (the authors' released memory
        class also applies its clipping hook, unset in their configs, to each parameter's gradient)."""
        limit = self.options.clip_norm / math.sqrt(bucket.world)
        out = grad.clone()
        views = [v.reshape(-1) for v in bucket.split(out)]
        norms = torch.stack([v.norm() for v in views]) * bucket.world    # one tensor: no device sync per parameter
        for view, scale in zip(views, (limit / norms).clamp(max=1.0)):
            view.mul_(scale)
        return out

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        o = self.options
        if o.clip_norm > 0:
            grad = self.clip(grad, bucket)
        correct, accumulate = o.momentum_correction, o.accumulate
        u, v = self.velocity.bucket(bucket, grad), self.accumulated.bucket(bucket, grad)
        ops = self.native(grad)
        fused = ops is not None and correct and accumulate      # u = m*u + g; v += u, one pass per tensor
        if correct and not fused:
            u.mul_(o.momentum).add_(grad)
        fed = u if correct else grad                            # what is accumulated (or sent) this step
        density = self.density(bucket.step)
        indices, values, dense = [], [], []
        offset = 0
        for pid, sparse, uv, vv, fv, gv in zip(bucket.ids, self._sparse(bucket), bucket.split(u), bucket.split(v),
                                               bucket.split(fed), bucket.split(grad)):
            uf, vf, ff = uv.reshape(-1), vv.reshape(-1), fv.reshape(-1)
            if fused and sparse:
                ops.dgc_accumulate(uf, vf, gv.reshape(-1), o.momentum)
            elif fused:
                uf.mul_(o.momentum).add_(gv.reshape(-1))
            if sparse:
                if accumulate and not fused:
                    vf.add_(ff)
                source = vf if accumulate else ff
                # each tensor's own sample, drawn from a stream of its parameter's (same on every rank's)
                gen = seeded(o.seed, bucket.rank, bucket.step, pid)
                idx = sampled_threshold_select(source, density, o.sample_ratio, gen, ops)
                indices.append(idx + offset)
                values.append(source[idx].clone())
                if accumulate:
                    vf[idx] = 0                   # sent: cleared from the accumulation ...
                if correct and o.masking:
                    uf[idx] = 0                   # ... and from the momentum (factor masking)
            else:
                dense.append(ff.clone())
            offset += uf.numel()
        payload = Payload(reduce=[torch.cat(dense)] if dense else [], meta={"density": density})
        if indices:                               # a bucket of dense tensors only gathers nothing
            idx, vals = torch.cat(indices).to(torch.int32), torch.cat(values)
            vals = vals.to(torch.float16) if o.fp16_values else vals
            if o.packing == "runlength":
                idx, vals = to_runs(idx, vals)
            payload.gather, payload.sent = [idx, vals], idx.numel()
        return payload

    def _positions(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """A payload as (int32 positions, values), whichever packing it travelled in."""
        return [from_runs(tensors[0]), tensors[1]] if self.options.packing == "runlength" else tensors

    def decode(self, tensors, meta, bucket, numel):
        return _dense(*self._positions(tensors), numel)

    def _add_dense(self, out: torch.Tensor, dense: torch.Tensor, bucket: Bucket) -> None:
        offset = 0
        for sparse, view in zip(self._sparse(bucket), bucket.split(out)):
            if not sparse:
                view.view(-1).add_(dense[offset:offset + view.numel()])
                offset += view.numel()

    def _sum(self, payloads: list[list[torch.Tensor]], device, numel: int, out=None) -> torch.Tensor:
        """The sparse payloads' sum, dense (zeros where there are none)."""
        if not payloads or not payloads[0]:
            return torch.zeros(numel, dtype=torch.float32, device=device)
        payloads = [self._positions(p) for p in payloads]
        summed = scatter_sum(self.native(payloads[0][1]), payloads, numel, out)
        if summed is None:
            summed = _dense(*payloads[0], numel)
            for idx, vals in payloads[1:]:
                summed += _dense(idx, vals, numel)
        return summed

    def decode_local(self, payload, bucket, numel):
        out = self._sum([payload.gather], (payload.reduce or payload.gather)[0].device, numel)
        if payload.reduce:
            self._add_dense(out, payload.reduce[0], bucket)
        return out

    def decompress(self, payload: Payload, bucket: Bucket, numel: int, out=None):
        out = self._sum(payload.gathered or [], (payload.reduce or payload.gather)[0].device, numel, out)
        if payload.reduce:
            self._add_dense(out, payload.reduce[0], bucket)
        return out
