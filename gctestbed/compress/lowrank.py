"""PowerSGD: a rank-r approximation P Q^T of each gradient matrix, found by one power iteration.

Round 1 all-reduces P = M Q for every matrix (and, alongside, every tensor not worth
compressing, whole); P is orthogonalised; round 2 all-reduces Q = M^T P; the update is P Q^T.
Q is kept between steps (warm start), and what the approximation misses is fed back into the next
step's gradient (error feedback). Options follow PyTorch's PowerSGD hook:

- ``rank``: r. Higher is closer to the gradient and costs (n + m) * r floats per n x m matrix.
- ``start_iter``: plain all-reduce before this step; early gradients change fast and a low-rank
  start slows convergence.
- ``min_compression_rate``: a matrix is compressed only when n*m / ((n+m)*r) reaches this;
  otherwise it is sent whole (small matrices would cost more in latency than they save).
- ``orthogonalization_epsilon``: added to column norms in Gram-Schmidt, for fp16-safe division.
- ``warm_start``: reuse Q from the previous step (a better starting point for the iteration).

PyTorch's own hook does not expose its payloads, and gctestbed must count every byte and time
each phase, so the method is written here on the shared adapter rather than reused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Bucket, Compressor, Payload, seeded
from .memory import Memory
from .registry import register


@dataclass
class PowerSGDOptions:
    rank: int = 2
    start_iter: int = 10
    min_compression_rate: float = 2.0
    orthogonalization_epsilon: float = 0.0
    warm_start: bool = True
    seed: int = 0

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"rank must be at least 1, got {self.rank}")
        if self.start_iter < 0:
            raise ValueError(f"start_iter must be 0 or more, got {self.start_iter}")
        if self.min_compression_rate < 1:
            raise ValueError(f"min_compression_rate must be at least 1, got {self.min_compression_rate}")


def orthogonalize(p: torch.Tensor, eps: float) -> None:
    """Gram-Schmidt on the columns of ``p``, in place (deterministic: equal input, equal output)."""
    for i in range(p.shape[1]):
        col = p[:, i]
        col /= col.norm() + eps
        if i + 1 < p.shape[1]:
            rest = p[:, i + 1:]
            rest -= torch.outer(col, col @ rest)


@register
class PowerSGD(Compressor):
    name = "powersgd"
    server_decodes = False
    server_refusal = "its second round needs the first round's sum on every worker"
    collective = "allreduce"
    summary = "PowerSGD: rank-r P Q^T by one power iteration, two all-reduces, warm start, error feedback"
    paper = "Vogels, Karimireddy & Jaggi, PowerSGD: Practical Low-Rank Gradient Compression, NeurIPS 2019"
    Options = PowerSGDOptions
    rounds = 2

    def __init__(self, **options):
        super().__init__(**options)
        self.errors = Memory()       # what the approximation missed, per parameter
        self.qs = Memory()           # each compressed matrix's Q (m x r, row-major), per parameter

    def _plan(self, bucket: Bucket) -> list[int]:
        """Indices of the bucket's tensors that are compressed."""
        r, rate = self.options.rank, self.options.min_compression_rate
        chosen = []
        for i, shape in enumerate(bucket.shapes):
            if len(shape) >= 2:
                n, m = shape[0], shape.numel() // shape[0]
                if n * m >= rate * (n + m) * r:
                    chosen.append(i)
        return chosen

    def _qs(self, bucket: Bucket, chosen: list[int], mats: dict, device) -> list[torch.Tensor]:
        """Q of each compressed matrix: its parameter's from the last step (warm start), else a
        Gaussian drawn from the parameter's own seed (every rank draws the same)."""
        r, o = self.options.rank, self.options
        ids, widths = [bucket.ids[i] for i in chosen], [mats[i].shape[1] for i in chosen]
        if o.warm_start:
            flat = self.qs.flat(ids, [m * r for m in widths], device,
                                lambda pid, n: torch.randn(n // r, r, generator=seeded(o.seed, pid)))
        else:
            flat = torch.cat([torch.randn(m, r, generator=seeded(o.seed, pid, bucket.step)).reshape(-1)
                              for pid, m in zip(ids, widths)]).to(device)
        qs, offset = [], 0
        for m in widths:
            qs.append(flat[offset:offset + m * r].view(m, r))
            offset += m * r
        return qs

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        chosen = self._plan(bucket)
        if bucket.step < self.options.start_iter or not chosen:      # nothing to approximate: send it whole
            return Payload(reduce=[grad], meta={"round": "plain"})
        m_all = grad + self.errors.bucket(bucket, grad)
        views = bucket.split(m_all)
        mats = {i: views[i].reshape(views[i].shape[0], -1) for i in chosen}
        qs = self._qs(bucket, chosen, mats, grad.device)
        ps = [mats[i] @ q for i, q in zip(chosen, qs)]
        rest = [views[i].reshape(-1) for i in range(len(views)) if i not in mats]
        reduce = [torch.cat([p.reshape(-1) for p in ps])] + ([torch.cat(rest)] if rest else [])
        return Payload(reduce=reduce, meta={"round": "p", "m": m_all, "mats": mats, "chosen": chosen, "ps": ps,
                                            "qs": qs})

    def decompress(self, payload: Payload, bucket: Bucket, numel: int, out=None):
        meta = payload.meta
        if meta["round"] == "plain":
            return payload.reduce[0]
        if meta["round"] == "p":
            mats, chosen = meta["mats"], meta["chosen"]
            offset = 0
            for p in meta["ps"]:
                p.copy_(payload.reduce[0][offset:offset + p.numel()].view_as(p))
                offset += p.numel()
                orthogonalize(p, self.options.orthogonalization_epsilon)
            local_qs = [mats[i].t() @ p for i, p in zip(chosen, meta["ps"])]
            rest = payload.reduce[1] if len(payload.reduce) > 1 else None
            return Payload(reduce=[torch.cat([q.reshape(-1) for q in local_qs])],
                           meta={**meta, "round": "q", "local_qs": local_qs, "rest": rest})
        # round q: P Q^T for compressed matrices, the summed rest for the others
        out = torch.empty(numel, dtype=torch.float32, device=meta["m"].device)
        error = self.errors.bucket(bucket, out)
        error.zero_()                             # tensors sent whole leave no error
        views, error_views = bucket.split(out), bucket.split(error)
        offset_q, offset_rest = 0, 0
        for i, view in enumerate(views):
            if i in meta["mats"]:
                k = meta["chosen"].index(i)
                p, local_q = meta["ps"][k], meta["local_qs"][k]
                q = payload.reduce[0][offset_q:offset_q + local_q.numel()].view_as(local_q)
                offset_q += local_q.numel()
                view.copy_((p @ q.t()).view_as(view))
                # this rank sent the projection P P^T M of its matrix; the rest waits for later steps
                error_views[i].copy_((meta["mats"][i] - p @ local_q.t()).view_as(view))
                meta["qs"][k].copy_(q)            # warm start: the next step begins from this Q
            else:
                n = view.numel()
                view.copy_(meta["rest"][offset_rest:offset_rest + n].view_as(view))
                offset_rest += n
        return out
