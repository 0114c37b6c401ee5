"""ResNet-18 and ResNet-50 (He et al. 2016, the ImageNet layout): convolutional networks whose
compute is large next to their bytes, where the sources expect compression to help least. At
scale 1 they have torchvision's 11.7 M and 25.6 M parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import images


@dataclass
class ResNet18Options(images.VisionOptions):
    pass


@dataclass
class ResNet50Options(images.VisionOptions):
    pass


class Basic(nn.Module):
    expansion = 1

    def __init__(self, c_in: int, c: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c_in, c, 3, stride, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                  nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))
        self.skip = _skip(c_in, c, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, c_in: int, c: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c_in, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                  nn.Conv2d(c, c, 3, stride, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                  nn.Conv2d(c, c * 4, 1, bias=False), nn.BatchNorm2d(c * 4))
        self.skip = _skip(c_in, c * 4, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def _skip(c_in: int, c_out: int, stride: int) -> nn.Module:
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))


def make_model(o: images.VisionOptions, block: type, counts: tuple[int, ...]) -> nn.Sequential:
    c = o.width(64)
    layers: list[nn.Module] = [nn.Conv2d(3, c, 7, 2, 3, bias=False), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    for stage, count in enumerate(counts):
        width = o.width(64 * 2 ** stage)
        for i in range(count):
            layers.append(block(c, width, 2 if i == 0 and stage > 0 else 1))
            c = width * block.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, o.classes)]
    return nn.Sequential(*layers)


def build18(o: ResNet18Options, seed: int, rank: int, batch_size: int):
    torch.manual_seed(seed)
    return images.build(make_model(o, Basic, (2, 2, 2, 2)), o, seed, rank, batch_size)


def build50(o: ResNet50Options, seed: int, rank: int, batch_size: int):
    torch.manual_seed(seed)
    return images.build(make_model(o, Bottleneck, (3, 4, 6, 3)), o, seed, rank, batch_size)
