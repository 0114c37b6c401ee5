"""Real bit-packing: k-bit codes, 32/k to a 32-bit word, the first code in the most significant bits.

This is MXNet's 2-bit layout (16 values per word, first value highest) generalised to 1, 2, 4
and 8 bits. The last word is padded with zero codes; its length is known from the element count.
"""

from __future__ import annotations

import torch

WIDTHS = (1, 2, 4, 8)


def words(numel: int, bits: int) -> int:
    per = 32 // bits
    return (numel + per - 1) // per


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes (integers in [0, 2**bits)) -> int32 words."""
    if bits not in WIDTHS:
        raise ValueError(f"bits must be one of {WIDTHS}")
    per = 32 // bits
    n = codes.numel()
    padded = torch.zeros(words(n, bits) * per, dtype=torch.int64, device=codes.device)
    padded[:n] = codes.reshape(-1).to(torch.int64)
    shifts = torch.arange(32 - bits, -1, -bits, dtype=torch.int64, device=codes.device)
    packed = (padded.view(-1, per) << shifts).sum(dim=1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)   # two's complement into int32
    return packed.to(torch.int32)


def unpack(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """int32 words -> the first ``numel`` codes (as int64)."""
    word = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(32 - bits, -1, -bits, dtype=torch.int64, device=packed.device)
    codes = (word.view(-1, 1) >> shifts) & ((1 << bits) - 1)
    return codes.reshape(-1)[:numel]
