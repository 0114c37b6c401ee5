"""Messages between workers and parameter servers, over torch.distributed's point-to-point sends.

A message is two sends, as a kvstore message is a header and its data: a fixed envelope of four
int64 (step, layout, header bytes, body bytes), because a receiver must size its buffer before it
receives, then one byte buffer holding a small pickled header (each tensor's dtype and length,
whether the sender compressed, and, the first time a layout travels, its parameters' shapes and
names) and the tensors, each 8-byte aligned. Every byte of both is on the wire, so ``Message.nbytes``
is what the accounting counts.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

ENVELOPE_BYTES = 4 * 8
BYE = -1            # an envelope whose step is BYE: the sender has no more steps
ALIGN = 8


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Message:
    step: int
    layout: int
    tensors: list[torch.Tensor] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)     # travels pickled in the header

    def body(self) -> torch.Tensor:
        header = pickle.dumps({**self.info, "tensors": [(str(t.dtype).removeprefix("torch."), t.numel())
                                                        for t in self.tensors]})
        size = _aligned(len(header)) + sum(_aligned(t.numel() * t.element_size()) for t in self.tensors)
        buf = torch.zeros(size, dtype=torch.uint8)
        buf[:len(header)] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
        offset = _aligned(len(header))
        for t in self.tensors:
            raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
            buf[offset:offset + raw.numel()] = raw
            offset += _aligned(raw.numel())
        self._header_len = len(header)
        return buf

    @staticmethod
    def parse(step: int, layout: int, header_len: int, buf: torch.Tensor) -> "Message":
        info = pickle.loads(buf[:header_len].numpy().tobytes())
        tensors, offset = [], _aligned(header_len)
        for dtype, numel in info.pop("tensors"):
            kind = getattr(torch, dtype)
            nbytes = numel * torch.empty(0, dtype=kind).element_size()
            tensors.append(buf[offset:offset + nbytes].view(kind).clone())
            offset += _aligned(nbytes)
        return Message(step, layout, tensors, info)


def send(msg: Message, dst: int) -> tuple[list, int]:
    """Post ``msg`` to rank ``dst``; the pending works and the bytes it puts on the wire."""
    body = msg.body()
    envelope = torch.tensor([msg.step, msg.layout, msg._header_len, body.numel()], dtype=torch.int64)
    return [dist.isend(envelope, dst), dist.isend(body, dst)], ENVELOPE_BYTES + body.numel()


def bye(dst: int) -> list:
    return [dist.isend(torch.tensor([BYE, 0, 0, 0], dtype=torch.int64), dst)]


def receive(sources: list[int]) -> list[tuple[Message | None, int]]:
    """One message from each of ``sources``, received concurrently: (message, bytes), the message
    None where that source said bye."""
    envelopes = [torch.empty(4, dtype=torch.int64) for _ in sources]
    for work in [dist.irecv(e, src) for e, src in zip(envelopes, sources)]:
        work.wait()
    bodies, works = [], []
    for e, src in zip(envelopes, sources):
        step, _layout, _hlen, blen = e.tolist()
        body = torch.empty(blen if step != BYE else 0, dtype=torch.uint8)
        bodies.append(body)
        if step != BYE:
            works.append(dist.irecv(body, src))
    for work in works:
        work.wait()
    out = []
    for e, body in zip(envelopes, bodies):
        step, layout, hlen, blen = e.tolist()
        out.append((None, ENVELOPE_BYTES) if step == BYE else
                   (Message.parse(step, layout, hlen, body), ENVELOPE_BYTES + blen))
    return out
