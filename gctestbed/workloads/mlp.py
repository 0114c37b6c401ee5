"""A fully-connected network: communication-heavy like AlexNet's or VGG's FC layers.

Its data are synthetic but learnable: inputs are Gaussian and labels come from a fixed-seed
random teacher network, so the loss really falls and a compressor that hurts learning shows it.
Every rank draws its own inputs (data parallelism); all ranks share the teacher.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn


@dataclass
class MLPOptions:
    width: int = 2048        # hidden units per layer; the default model has about 14.7 M parameters
    depth: int = 4           # hidden layers
    input_dim: int = 1024
    classes: int = 10

    def __post_init__(self):
        if not 1 <= self.width <= 65536:
            raise ValueError(f"width must be 1..65536, got {self.width}")
        if not 1 <= self.depth <= 64:
            raise ValueError(f"depth must be 1..64, got {self.depth}")
        if not 1 <= self.input_dim <= 1 << 20:
            raise ValueError(f"input_dim must be 1..1048576, got {self.input_dim}")
        if not 2 <= self.classes <= 100000:
            raise ValueError(f"classes must be 2..100000, got {self.classes}")


def make_model(o: MLPOptions) -> nn.Sequential:
    layers: list[nn.Module] = []
    width_in = o.input_dim
    for _ in range(o.depth):
        layers += [nn.Linear(width_in, o.width), nn.ReLU()]
        width_in = o.width
    layers.append(nn.Linear(width_in, o.classes))
    return nn.Sequential(*layers)


def _teacher(o: MLPOptions, seed: int) -> nn.Sequential:
    g = torch.Generator().manual_seed(seed + 7919)
    w1 = torch.randn(o.input_dim, 64, generator=g) / o.input_dim ** 0.5
    w2 = torch.randn(64, o.classes, generator=g) / 8.0
    teacher = nn.Sequential(nn.Linear(o.input_dim, 64, bias=False), nn.Tanh(), nn.Linear(64, o.classes, bias=False))
    with torch.no_grad():
        teacher[0].weight.copy_(w1.T)
        teacher[2].weight.copy_(w2.T)
    return teacher.requires_grad_(False)


def _batches(o: MLPOptions, seed: int, rank: int, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    teacher = _teacher(o, seed)
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank + 1)
    while True:
        x = torch.randn(batch_size, o.input_dim, generator=g)
        with torch.no_grad():
            y = teacher(x).argmax(dim=1)
        yield x, y


def build(o: MLPOptions, seed: int, rank: int, batch_size: int):
    torch.manual_seed(seed)
    return make_model(o), _batches(o, seed, rank, batch_size), nn.functional.cross_entropy
