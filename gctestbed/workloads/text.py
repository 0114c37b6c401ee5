"""Real text that every machine has: the Python standard library's own source files, as bytes.

The language-model workloads read it as a byte-level corpus (vocabulary 256): the files sorted by
path and concatenated up to a size cap, the last tenth held out for evaluation. Every rank draws
its own random windows from the training part (data parallelism); evaluation uses fixed windows.
"""

from __future__ import annotations

import os
import sysconfig
from functools import lru_cache
from typing import Iterator

import torch

VOCAB = 256
EVAL_WINDOWS = 64


@lru_cache(maxsize=4)
def corpus(max_bytes: int) -> torch.Tensor:
    """Up to ``max_bytes`` of the standard library's .py files, as a uint8 tensor."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, size = [], 0
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        dirs[:] = [d for d in dirs if d not in ("site-packages", "__pycache__", "test", "tests")]
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read(max_bytes - size)
            chunks.append(data)
            size += len(data)
            if size >= max_bytes:
                return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).clone()
    if size < 10_000:
        raise ValueError(f"the standard library at {root} has too little Python source ({size} bytes) for a corpus")
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).clone()


def split(max_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = corpus(max_bytes).long()
    cut = len(data) * 9 // 10
    return data[:cut], data[cut:]


def batches(train: torch.Tensor, seq_len: int, batch_size: int, seed: int, rank: int
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (input, next-byte target) windows of ``seq_len`` bytes, this rank's own stream."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank + 1)
    offsets = torch.arange(seq_len + 1)
    while True:
        starts = torch.randint(0, len(train) - seq_len - 1, (batch_size, 1), generator=g)
        window = train[starts + offsets]
        yield window[:, :-1], window[:, 1:]


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def evaluator(held_out: torch.Tensor, seq_len: int):
    """Mean next-byte loss and accuracy on fixed windows of the held-out tail."""
    n = min(EVAL_WINDOWS, max(1, (len(held_out) - 1) // seq_len))
    window = torch.stack([held_out[i * seq_len:i * seq_len + seq_len + 1] for i in range(n)])
    x, y = window[:, :-1], window[:, 1:]

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        with torch.no_grad():
            logits = model(x)
            return {"loss": float(loss_fn(logits, y)), "accuracy": float((logits.argmax(-1) == y).float().mean()),
                    "samples": y.numel()}
    return evaluate


def build(model: torch.nn.Module, seq_len: int, corpus_mb: float, seed: int, rank: int, batch_size: int):
    """A language-model workload on the corpus: (model, this rank's batches, loss, evaluation)."""
    train, held_out = split(int(corpus_mb * 1e6))
    return model, batches(train, seq_len, batch_size, seed, rank), loss_fn, evaluator(held_out, seq_len)
