"""AlexNet (Krizhevsky et al. 2012, in torchvision's single-tower layout): the fully-connected-heavy
network of MXNet's 2-bit claims. At scale 1 it has torchvision's 61.1 M parameters, 58.6 M of them
in three fully-connected layers: many bytes for little compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import images


@dataclass
class AlexNetOptions(images.VisionOptions):
    dropout: float = 0.5

    min_image = 63           # five strided stages: a smaller input pools away to nothing

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


def make_model(o: AlexNetOptions) -> nn.Sequential:
    w = o.width
    return nn.Sequential(
        nn.Conv2d(3, w(64), 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.Conv2d(w(64), w(192), 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.Conv2d(w(192), w(384), 3, padding=1), nn.ReLU(),
        nn.Conv2d(w(384), w(256), 3, padding=1), nn.ReLU(),
        nn.Conv2d(w(256), w(256), 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.AdaptiveAvgPool2d(6), nn.Flatten(),
        nn.Dropout(o.dropout), nn.Linear(w(256) * 36, w(4096)), nn.ReLU(),
        nn.Dropout(o.dropout), nn.Linear(w(4096), w(4096)), nn.ReLU(),
        nn.Linear(w(4096), o.classes))


def build(o: AlexNetOptions, seed: int, rank: int, batch_size: int):
    torch.manual_seed(seed)
    return images.build(make_model(o), o, seed, rank, batch_size)
