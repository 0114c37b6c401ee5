"""How payloads meet: summed with all-reduce, or seen by all with a variable-length all-gather.

torch.distributed's all_gather wants equal sizes on every rank, on Gloo as on NCCL, so a gather
first exchanges the per-tensor element counts (a few int64s), then gathers every rank's tensors
packed into one byte buffer padded to the largest rank's, and cuts them apart again. A rank with
nothing to send still takes part (its buffer is only padding), so empty payloads never hang.

``wire_bytes`` predicts what one rank transmits for a payload with Gloo's ring algorithms:
2(p-1)/p of the reduce part, and (p-1) times the padded gather buffer and the counts.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

GATHER_CALLS = 2   # all_gather calls per gather: the counts, then the data
ALIGN = 8          # every tensor starts 8-byte aligned in the gather buffer, so views of any dtype work


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def packed_size(counts, tensors: list[torch.Tensor]) -> int:
    """Bytes ``pack`` needs for tensors of these dtypes (``tensors``) with ``counts`` elements."""
    return sum(aligned(int(n) * t.element_size()) for n, t in zip(counts, tensors))


def pack(tensors: list[torch.Tensor], width: int | None = None) -> torch.Tensor:
    """Every tensor's bytes in one byte buffer, each 8-byte aligned, zero-padded to ``width``."""
    size = packed_size([t.numel() for t in tensors], tensors)
    device = tensors[0].device if tensors else torch.device("cpu")
    buf = torch.zeros(max(size, width or 0), dtype=torch.uint8, device=device)
    offset = 0
    for t in tensors:
        raw = t.contiguous().reshape(-1).view(torch.uint8)
        buf[offset:offset + raw.numel()] = raw
        offset += aligned(raw.numel())
    return buf


def cut(buf: torch.Tensor, counts, dtypes: list[torch.dtype]) -> list[torch.Tensor]:
    """``pack``'s tensors back: views of ``buf`` with ``counts`` elements of ``dtypes``."""
    parts, offset = [], 0
    for n, dtype in zip(counts, dtypes):
        nbytes = int(n) * torch.empty(0, dtype=dtype).element_size()
        parts.append(buf[offset:offset + nbytes].view(dtype))
        offset += aligned(nbytes)
    return parts


def allreduce(tensors: list[torch.Tensor], group=None) -> torch.futures.Future:
    """Sum ``tensors`` in place across ranks; a future that completes when all are summed."""
    if not tensors:
        done = torch.futures.Future()
        done.set_result(None)
        return done
    return torch.futures.collect_all([dist.all_reduce(t, group=group, async_op=True).get_future() for t in tensors])


def gather(tensors: list[torch.Tensor], group=None) -> tuple[list[list[torch.Tensor]], int]:
    """Every rank's ``tensors`` (same count and dtypes everywhere, any lengths), in rank order;
    also the padded buffer size each rank sent."""
    world = dist.get_world_size(group)
    device = tensors[0].device if tensors else torch.device("cpu")
    counts = torch.tensor([t.numel() for t in tensors], dtype=torch.int64, device=device)
    all_counts = [torch.empty_like(counts) for _ in range(world)]
    dist.all_gather(all_counts, counts, group=group)
    width = max(ALIGN, max(packed_size(c, tensors) for c in all_counts))
    mine = pack(tensors, width)
    buffers = [torch.empty(width, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(buffers, mine, group=group)
    out = [cut(buf, c.tolist(), [t.dtype for t in tensors]) for buf, c in zip(buffers, all_counts)]
    return out, width + counts.numel() * 8


def wire_bytes(reduce_bytes: int, gather_sent: int, world: int) -> int:
    """Bytes one rank transmits for a payload with ring all-reduce and ring all-gather."""
    if world <= 1:
        return 0
    return round(2 * (world - 1) / world * reduce_bytes) + (world - 1) * gather_sent
