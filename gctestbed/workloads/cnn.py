"""A small ResNet (He et al. 2016, the CIFAR shape) on synthetic but learnable 32x32 images.

There is no CPU torchvision and no dataset download here, so the images are made (images.py's
synthetic data, at 32 pixels): each class has a fixed smooth random template, and a sample is its
class's template, randomly shifted, scaled and noised. Convolutions carry most of the compute and few of the bytes: the
compute-heavy end of the spectrum, where compression pays off least.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch
from torch import nn

from . import images


@dataclass
class CNNOptions:
    width: int = 32          # channels of the first stage (doubled per stage): the size knob
    blocks: int = 1          # residual blocks per stage (3 stages)
    classes: int = 10
    noise: float = 0.5

    def __post_init__(self):
        if not 4 <= self.width <= 1024:
            raise ValueError(f"width must be 4..1024, got {self.width}")
        if not 1 <= self.blocks <= 32:
            raise ValueError(f"blocks must be 1..32, got {self.blocks}")
        if not 2 <= self.classes <= 1000:
            raise ValueError(f"classes must be 2..1000, got {self.classes}")
        if not 0 <= self.noise <= 10:
            raise ValueError(f"noise must be 0..10, got {self.noise}")


class Residual(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
            nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out))
        self.skip = nn.Identity() if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def make_model(o: CNNOptions) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(3, o.width, 3, 1, 1, bias=False), nn.BatchNorm2d(o.width), nn.ReLU()]
    c = o.width
    for stage in range(3):
        for b in range(o.blocks):
            c_out = o.width * 2 ** stage
            layers.append(Residual(c, c_out, 2 if b == 0 and stage > 0 else 1))
            c = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, o.classes)]
    return nn.Sequential(*layers)


def build(o: CNNOptions, seed: int, rank: int, batch_size: int):
    torch.manual_seed(seed)
    data = images.VisionOptions(image=32, classes=o.classes, noise=o.noise)   # the vision workloads' synthetic images
    return images.build(make_model(o), data, seed, rank, batch_size)
