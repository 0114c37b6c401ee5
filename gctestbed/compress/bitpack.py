"""Real bit-packing in MXNet's layout: k-bit codes, 8/k to a byte, the first code in the byte's
most significant bits, bytes in memory order.

MXNet's ``quantize_2bit`` writes element i's code into byte i/4 with the masks 0xc0, 0x30, 0x0c,
0x03 (i % 4 = 0..3), and ``quantize_1bit`` into byte i/8 with 0x80 >> (i % 8); this is that
layout for 1, 2, 4 and 8 bits. A payload is a whole number of 4-byte words (32/k codes each, as
MXNet sizes its compressed arrays in floats), the last padded with zero codes, and is held as an
int32 tensor whose bytes, in memory order, are the payload: the same bytes on every machine.
"""

from __future__ import annotations

import torch

WIDTHS = (1, 2, 4, 8)


def words(numel: int, bits: int) -> int:
    per = 32 // bits
    return (numel + per - 1) // per


def _shifts(bits: int, device) -> torch.Tensor:
    """Where each of a byte's codes sits, first code highest: 8-k, 8-2k, ..., 0."""
    return torch.arange(8 - bits, -1, -bits, dtype=torch.int32, device=device)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes (integers in [0, 2**bits)) -> the payload, as int32 words."""
    if bits not in WIDTHS:
        raise ValueError(f"bits must be one of {WIDTHS}")
    per_byte = 8 // bits
    n = codes.numel()
    padded = torch.zeros(words(n, bits) * 4 * per_byte, dtype=torch.int32, device=codes.device)
    padded[:n] = codes.reshape(-1).to(torch.int32)
    packed = (padded.view(-1, per_byte) << _shifts(bits, codes.device)).sum(dim=1, dtype=torch.int32)
    return packed.to(torch.uint8).view(torch.int32)


def unpack(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """The payload's first ``numel`` codes (as int64)."""
    data = packed.contiguous().view(torch.uint8).to(torch.int64)
    codes = (data.view(-1, 1) >> _shifts(bits, packed.device).to(torch.int64)) & ((1 << bits) - 1)
    return codes.reshape(-1)[:numel]
