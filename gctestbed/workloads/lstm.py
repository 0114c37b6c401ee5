"""An LSTM language model (Zaremba et al. style) on the standard library's source, byte by byte.

Embedding, stacked LSTM, a linear read-out to 256 bytes: recurrent weights are dense and large
next to the compute of a short sequence, the classic case where compression was first shown to
help (Strom 2015 trained speech LSTMs). Zaremba et al.'s large Penn Treebank model is
``lstm:hidden=1500,layers=2,vocab=10000`` (66 M parameters; bytes use the first 256 rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import text


@dataclass
class LSTMOptions:
    hidden: int = 512        # the size knob: about 8 x hidden^2 weights per layer
    layers: int = 2
    seq_len: int = 64
    corpus_mb: float = 2.0   # how much standard-library source to read
    vocab: int = 256         # embedding and read-out rows (bytes use the first 256)

    def __post_init__(self):
        if not text.VOCAB <= self.vocab <= 1 << 20:
            raise ValueError(f"vocab must be {text.VOCAB}..1048576, got {self.vocab}")
        if not 8 <= self.hidden <= 8192:
            raise ValueError(f"hidden must be 8..8192, got {self.hidden}")
        if not 1 <= self.layers <= 16:
            raise ValueError(f"layers must be 1..16, got {self.layers}")
        if not 2 <= self.seq_len <= 4096:
            raise ValueError(f"seq_len must be 2..4096, got {self.seq_len}")
        if not 0.05 <= self.corpus_mb <= 512:
            raise ValueError(f"corpus_mb must be 0.05..512, got {self.corpus_mb}")


class ByteLSTM(nn.Module):
    def __init__(self, o: LSTMOptions):
        super().__init__()
        self.embed = nn.Embedding(o.vocab, o.hidden)
        self.lstm = nn.LSTM(o.hidden, o.hidden, num_layers=o.layers, batch_first=True)
        self.head = nn.Linear(o.hidden, o.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(x))
        return self.head(out)


def build(o: LSTMOptions, seed: int, rank: int, batch_size: int):
    torch.manual_seed(seed)
    return text.build(ByteLSTM(o), o.seq_len, o.corpus_mb, seed, rank, batch_size)
