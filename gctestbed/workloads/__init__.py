"""Built-in workloads by name. A workload is a model, an endless batch iterator, a loss, and an
evaluation on held-out data (the same samples on every rank).

Each workload declares its options as a dataclass (types, defaults, range checks in
``__post_init__``) so the CLI can parse ``--workload mlp:width=512`` before any node starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from . import mlp


@dataclass
class Workload:
    model: torch.nn.Module
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[torch.nn.Module], dict[str, float]]


_BUILDERS = {"mlp": (mlp.MLPOptions, mlp.build)}


def names() -> list[str]:
    return sorted(_BUILDERS)


def options_class(name: str) -> type:
    """The options dataclass of workload ``name``; KeyError names the known ones."""
    if name not in _BUILDERS:
        raise KeyError(f"unknown workload '{name}'; available: {', '.join(names())}")
    return _BUILDERS[name][0]


def build(name: str, options: dict[str, Any], seed: int, rank: int, batch_size: int) -> Workload:
    """Model (identical on every rank for a seed) and this rank's own stream of batches."""
    cls, builder = _BUILDERS[name]
    model, batches, loss_fn, evaluate = builder(cls(**options), seed, rank, batch_size)
    return Workload(model, batches, loss_fn, evaluate)

