"""Messages between workers and parameter servers, over torch.distributed's point-to-point sends.

A message is two sends, as a kvstore message is a header and its data: a fixed envelope of four
int64 (step, layout, header bytes, body bytes), because a receiver must size its buffer before it
receives, then one byte buffer holding a small pickled header (each tensor's dtype and length,
whether the sender compressed, and, the first time a layout travels, its parameters' shapes and
names) and the tensors, each 8-byte aligned. Every byte of both is on the wire, so ``Message.nbytes``
is what the accounting counts.
"""

from __future__ import annotations

import functools
import pickle
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..compress import collectives
from ..compress.base import Payload

ENVELOPE_BYTES = 4 * 8
BYE = -1            # an envelope whose step is BYE: the sender has no more steps


@dataclass
class Message:
    step: int
    layout: int
    tensors: list[torch.Tensor] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)     # travels pickled in the header

    def body(self) -> tuple[torch.Tensor, int]:
        """The byte buffer that follows the envelope (collectives.pack's layout: the header, then
        the tensors), and the header's length."""
        header = pickle.dumps({**self.info, "tensors": [(str(t.dtype).removeprefix("torch."), t.numel())
                                                        for t in self.tensors]})
        raw = torch.frombuffer(bytearray(header), dtype=torch.uint8)
        return collectives.pack([raw, *(t.detach().cpu() for t in self.tensors)]), len(header)

    @staticmethod
    def carrying(step: int, layout: int, payload: Payload, info: dict[str, Any] | None = None) -> "Message":
        """A message carrying a method's payload: its summed tensors, then its gathered ones."""
        return Message(step, layout, payload.reduce + payload.gather, {**(info or {}), "reduce": len(payload.reduce)})

    @staticmethod
    def parse(step: int, layout: int, header_len: int, buf: torch.Tensor) -> "Message":
        info = pickle.loads(buf[:header_len].numpy().tobytes())
        described = info.pop("tensors")
        parts = collectives.cut(buf, [header_len, *(n for _, n in described)],
                                [torch.uint8, *(getattr(torch, d) for d, _ in described)])
        return Message(step, layout, [t.clone() for t in parts[1:]], info)


def payload(msgs: list[Message]) -> Payload:
    """The payload ``Message.carrying`` messages from several senders make together, as the ring's
    collectives would have left it: the summed tensors added up, the gathered ones kept per sender."""
    r = msgs[0].info["reduce"]
    out = Payload(reduce=[functools.reduce(torch.add, [m.tensors[i] for m in msgs]) for i in range(r)],
                  gather=msgs[0].tensors[r:])
    out.gathered = [m.tensors[r:] for m in msgs] if out.gather else None
    return out


def send(msg: Message, dsts: list[int]) -> tuple[list, int]:
    """Post ``msg`` to every rank of ``dsts`` (packed once); the pending works and the bytes it
    puts on the wire."""
    body, header_len = msg.body()
    envelope = torch.tensor([msg.step, msg.layout, header_len, body.numel()], dtype=torch.int64)
    works = [w for dst in dsts for w in (dist.isend(envelope, dst), dist.isend(body, dst))]
    return works, len(dsts) * (ENVELOPE_BYTES + body.numel())


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
