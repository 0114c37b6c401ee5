"""A fully-connected network: communication-heavy like AlexNet's or VGG's FC layers.

Its data are synthetic but learnable: like real data they lie near a low-dimensional manifold —
a 16-dimensional Gaussian latent, projected to the input width by a fixed random matrix — and
labels come from a fixed-seed random teacher network on the latent, so the loss really falls
within a few dozen steps and a compressor that hurts learning shows it. Every rank draws its own
samples (data parallelism); all ranks share the projection and the teacher.
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


LATENT = 16


def _task(o: MLPOptions, seed: int) -> tuple[torch.Tensor, nn.Sequential]:
    """The shared projection latent -> input and the teacher latent -> class logits."""
    g = torch.Generator().manual_seed(seed + 7919)
    projection = torch.randn(LATENT, o.input_dim, generator=g) / LATENT ** 0.5
    teacher = nn.Sequential(nn.Linear(LATENT, 64, bias=False), nn.Tanh(), nn.Linear(64, o.classes, bias=False))
    with torch.no_grad():           # no biases, so every class gets a fair share of the samples
        for p in teacher.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return projection, teacher.requires_grad_(False)


def _batches(o: MLPOptions, seed: int, rank: int, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    projection, teacher = _task(o, seed)
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank + 1)
    while True:
        z = torch.randn(batch_size, LATENT, generator=g)
        with torch.no_grad():
            y = teacher(z).argmax(dim=1)
        yield z @ projection, y


EVAL_SAMPLES = 4096


def _evaluator(o: MLPOptions, seed: int):
    """Loss and accuracy on held-out samples from a stream no rank trains on."""
    projection, teacher = _task(o, seed)
    g = torch.Generator().manual_seed(seed * 1_000_003 + 999_983)
    z = torch.randn(EVAL_SAMPLES, LATENT, generator=g)
    with torch.no_grad():
        x, y = z @ projection, teacher(z).argmax(dim=1)

    def evaluate(model: nn.Module) -> dict[str, float]:
        with torch.no_grad():
            logits = model(x)
            return {"loss": float(nn.functional.cross_entropy(logits, y)),
                    "accuracy": float((logits.argmax(dim=1) == y).float().mean()), "samples": len(y)}
    return evaluate


def build(o: MLPOptions, seed: int, rank: int, batch_size: int):
    torch.manual_seed(seed)
    return make_model(o), _batches(o, seed, rank, batch_size), nn.functional.cross_entropy, _evaluator(o, seed)
