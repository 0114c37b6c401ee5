"""A small GPT-style decoder (nanoGPT's shape) on the standard library's source, byte by byte.

Token and position embeddings, pre-norm blocks of causal self-attention and an MLP, a read-out
tied to the token embedding. Attention and MLP weights are large matrices, like the
transformers people train today.

``gpt2`` is the same network in GPT-2 small's layout (Radford et al. 2019): 12 layers of width
768 with 12 heads, a 1,024-token context and GPT-2's 50,257-entry vocabulary, 124.4 M parameters
at scale 1. The corpus is read byte by byte, so only 256 rows of the embedding ever see a token:
its gradient is mostly zeros, as a real vocabulary's is in any one step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import text


@dataclass
class TransformerOptions:
    d_model: int = 256       # the size knob: about 12 x d_model^2 weights per layer
    layers: int = 4
    heads: int = 4
    seq_len: int = 128
    corpus_mb: float = 2.0
    vocab: int = 256         # embedding rows (bytes use the first 256)

    def __post_init__(self):
        if not text.VOCAB <= self.vocab <= 1 << 20:
            raise ValueError(f"vocab must be {text.VOCAB}..1048576, got {self.vocab}")
        if not 8 <= self.d_model <= 8192:
            raise ValueError(f"d_model must be 8..8192, got {self.d_model}")
        if not 1 <= self.layers <= 64:
            raise ValueError(f"layers must be 1..64, got {self.layers}")
        if not 1 <= self.heads <= 128 or self.d_model % self.heads:
            raise ValueError(f"heads must divide d_model ({self.d_model}), got {self.heads}")
        if not 2 <= self.seq_len <= 4096:
            raise ValueError(f"seq_len must be 2..4096, got {self.seq_len}")
        if not 0.05 <= self.corpus_mb <= 512:
            raise ValueError(f"corpus_mb must be 0.05..512, got {self.corpus_mb}")


class Block(nn.Module):
    def __init__(self, o: TransformerOptions):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(o.d_model), nn.LayerNorm(o.d_model)
        self.attn = nn.MultiheadAttention(o.d_model, o.heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(o.d_model, 4 * o.d_model), nn.GELU(), nn.Linear(4 * o.d_model, o.d_model))
        self.register_buffer("mask", torch.triu(torch.ones(o.seq_len, o.seq_len, dtype=torch.bool), 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:n, :n], need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ByteGPT(nn.Module):
    def __init__(self, o: TransformerOptions):
        super().__init__()
        self.token = nn.Embedding(o.vocab, o.d_model)
        self.position = nn.Embedding(o.seq_len, o.d_model)
        self.blocks = nn.Sequential(*[Block(o) for _ in range(o.layers)])
        self.norm = nn.LayerNorm(o.d_model)
        for table in (self.token, self.position):       # GPT-2's scale: the tied read-out starts near uniform
            nn.init.normal_(table.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.token(x) + self.position(torch.arange(x.shape[1], device=x.device))
        return self.norm(self.blocks(h)) @ self.token.weight.t()


def build(o: TransformerOptions, seed: int, rank: int, batch_size: int):
    torch.manual_seed(seed)
    return text.build(ByteGPT(o), o.seq_len, o.corpus_mb, seed, rank, batch_size)


@dataclass
class GPT2Options:
    scale: float = 1.0       # width multiplier: d_model = 768 x scale (a multiple of the 12 heads)
    seq_len: int = 1024      # the context; shorter on small machines
    vocab: int = 50257
    corpus_mb: float = 2.0

    def __post_init__(self):
        if not 0.01 <= self.scale <= 4:
            raise ValueError(f"scale must be 0.01..4, got {self.scale}")
        self.layout()           # the transformer's own checks

    def layout(self) -> TransformerOptions:
        heads = 12
        d_model = max(heads, round(768 * self.scale / heads) * heads)
        return TransformerOptions(d_model=d_model, layers=12, heads=heads, seq_len=self.seq_len,
                                  corpus_mb=self.corpus_mb, vocab=self.vocab)


def build_gpt2(o: GPT2Options, seed: int, rank: int, batch_size: int):
    return build(o.layout(), seed, rank, batch_size)
