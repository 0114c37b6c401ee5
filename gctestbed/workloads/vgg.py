"""VGG-16 (Simonyan and Zisserman 2015, configuration D): thirteen 3x3 convolutions and three
fully-connected layers. At scale 1 it has torchvision's 138.4 M parameters, 123.6 M of them in
the fully-connected head: the other network MXNet's and DGC's speed-ups were shown on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import images

CONFIG_D = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


@dataclass
class VGG16Options(images.VisionOptions):
    batchnorm: bool = False   # the original has none; on makes it train from scratch with larger rates
    dropout: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


def make_model(o: VGG16Options) -> nn.Sequential:
    layers: list[nn.Module] = []
    c = 3
    for v in CONFIG_D:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
            continue
        layers += [nn.Conv2d(c, o.width(v), 3, padding=1)] + ([nn.BatchNorm2d(o.width(v))] if o.batchnorm else [])
        layers.append(nn.ReLU())
        c = o.width(v)
    layers += [nn.AdaptiveAvgPool2d(7), nn.Flatten(),
               nn.Linear(c * 49, o.width(4096)), nn.ReLU(), nn.Dropout(o.dropout),
               nn.Linear(o.width(4096), o.width(4096)), nn.ReLU(), nn.Dropout(o.dropout),
               nn.Linear(o.width(4096), o.classes)]
    return nn.Sequential(*layers)


def build(o: VGG16Options, seed: int, rank: int, batch_size: int):
    torch.manual_seed(seed)
    return images.build(make_model(o), o, seed, rank, batch_size)
