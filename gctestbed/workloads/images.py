"""Image data for the vision workloads: synthetic but learnable, or scikit-learn's bundled digits.

There is no CPU torchvision and no download here. ``synthetic``: each class has a fixed smooth
random template and a sample is its template shifted, scaled and noised, at any size and number
of classes (the ImageNet-shaped heads keep their 1000 outputs). ``digits``: the 1,797 handwritten
digits (8x8, 16 grey levels) that scikit-learn ships inside its package, scaled up to the
network's input size; a fixed fifth is held out for evaluation whatever the seed, so every run of
a comparison is judged on the same images. Every rank draws its own samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import torch
from torch import nn

DATA = ("synthetic", "digits")
DIGITS_CLASSES = 10
BUFFERS = ("broadcast", "local")


@dataclass
class VisionOptions:
    """What every vision workload shares; each network sets its own full-size defaults."""

    scale: float = 1.0       # width multiplier of every layer (channels and fully-connected units): the size knob
    image: int = 224         # input height and width in pixels
    classes: int = 1000
    data: str = "synthetic"  # synthetic | digits (scikit-learn's bundled images, 10 classes)
    noise: float = 0.5       # synthetic: noise added to the class template
    # digits: Gaussian noise, in standard deviations of the 8x8 digits, added to each digit before it is scaled
    # up (fresh on every training draw, fixed on the held-out ones); 0 keeps the digits as they are. Raise it
    # to move a task off the digits' ceiling (about 97 % for every method), so that losses of a few points show
    pixel_noise: float = 0.0
    # broadcast: DDP sends rank 0's buffers (batch norm's running statistics) before every forward, its
    # default; local: each rank keeps its own (DDP's forward_sync_buffers=False), so only gradients cross the
    # wire. Change it to measure a ratio of gradients alone, or a job that trains so.
    buffers: str = "broadcast"

    min_image = 32           # a class attribute, not an option: the smallest input the network's pooling takes

    def __post_init__(self):
        if not 0.01 <= self.scale <= 4:
            raise ValueError(f"scale must be 0.01..4, got {self.scale}")
        if not self.min_image <= self.image <= 512:
            raise ValueError(f"image must be {self.min_image}..512 pixels for this network, got {self.image}")
        if not 2 <= self.classes <= 100000:
            raise ValueError(f"classes must be 2..100000, got {self.classes}")
        if self.data not in DATA:
            raise ValueError(f"data must be one of {', '.join(DATA)}, got {self.data!r}")
        if self.data == "digits" and self.classes < DIGITS_CLASSES:
            raise ValueError(f"data=digits has {DIGITS_CLASSES} classes: classes must be at least {DIGITS_CLASSES}")
        if not 0 <= self.noise <= 10:
            raise ValueError(f"noise must be 0..10, got {self.noise}")
        if not 0 <= self.pixel_noise <= 10:
            raise ValueError(f"pixel_noise must be 0..10, got {self.pixel_noise}")
        if self.pixel_noise and self.data != "digits":
            raise ValueError("pixel_noise is for data=digits (synthetic images take noise=)")
        if self.buffers not in BUFFERS:
            raise ValueError(f"buffers must be one of {', '.join(BUFFERS)}, got {self.buffers!r}")

    def width(self, n: int) -> int:
        """Layer width ``n`` of the full-size network, scaled."""
        return max(1, round(n * self.scale))


def broadcasts(options: dict) -> bool:
    """Whether DDP sends rank 0's buffers before every forward for a workload with these options
    (buffers=broadcast, the default, or a workload without the option)."""
    return options.get("buffers", "broadcast") == "broadcast"


def _templates(o: VisionOptions, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 104729)
    coarse = torch.randn(o.classes, 3, 8, 8, generator=g)
    return nn.functional.interpolate(coarse, size=(o.image, o.image), mode="bilinear", align_corners=False)


def _synthetic(templates: torch.Tensor, o: VisionOptions, g: torch.Generator, n: int):
    y = torch.randint(0, o.classes, (n,), generator=g)
    shift = torch.randint(-(o.image // 10), o.image // 10 + 1, (2,), generator=g).tolist()
    scale = 0.5 + torch.rand(n, 1, 1, 1, generator=g)
    x = torch.roll(templates[y], shifts=shift, dims=(2, 3)) * scale
    return x + o.noise * torch.randn(x.shape, generator=g), y


@lru_cache(maxsize=1)
def _digits_raw() -> tuple[torch.Tensor, torch.Tensor]:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ValueError("data=digits needs scikit-learn, which ships the images: pip install scikit-learn "
                         "(or 'gctestbed[data]')") from None
    d = load_digits()
    return torch.tensor(d.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0, torch.tensor(d.target)


@lru_cache(maxsize=1)
def _split() -> tuple[torch.Tensor, torch.Tensor]:
    """The digits' training and held-out indices: a fixed shuffle, its last fifth held out."""
    n = len(_digits_raw()[1])
    order = torch.randperm(n, generator=torch.Generator().manual_seed(20180101))
    return order[:n * 4 // 5], order[n * 4 // 5:]


def digit_images(idx: torch.Tensor, image: int, noise: float = 0.0, g: torch.Generator | None = None):
    """Digits ``idx`` at ``image`` pixels, 3 channels, standardised as the clean images are. With
    ``noise``, Gaussian noise of that many of the 8x8 digits' standard deviations (drawn from
    ``g``) is added to each 8x8 digit before it is scaled up, so it blurs strokes at the digits'
    own scale."""
    x8, y = _digits_raw()
    raw = x8[idx]
    if noise:
        raw = raw + noise * float(x8.std()) * _noise(len(idx), g)
    mean, std = _scaled_stats(image)
    return (_scaled(raw, image) - mean) / std, y[idx]


def _noise(count: int, g: torch.Generator | None) -> torch.Tensor:
    """Unit Gaussian noise for ``count`` 8x8 digits, drawn from ``g``: one draw's shape for
    digit_images and for held_out, which skips the training set's draw to reach its own."""
    return torch.randn((count, *_digits_raw()[0].shape[1:]), generator=g)


def digits(image: int, noise: float = 0.0, g: torch.Generator | None = None):
    """(train, held out) digits at ``image`` pixels (``digit_images``); the split is fixed."""
    train, held = _split()
    return digit_images(train, image, noise, g), digit_images(held, image, noise, g)


def _scaled(x8: torch.Tensor, image: int) -> torch.Tensor:
    return nn.functional.interpolate(x8, size=(image, image), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)


@lru_cache(maxsize=4)
def _scaled_stats(image: int) -> tuple[float, float]:
    """The mean and standard deviation of every clean digit scaled to ``image`` pixels."""
    x = _scaled(_digits_raw()[0], image)
    return float(x.mean()), float(x.std())


def _batches(o: VisionOptions, seed: int, rank: int, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank + 1)
    if o.data == "digits":
        if not o.pixel_noise:
            (x, y), _ = digits(o.image)
            while True:
                pick = torch.randint(0, len(y), (batch_size,), generator=g)
                yield x[pick], y[pick]
        train = _split()[0]
        while True:                     # noise drawn afresh on every draw
            yield digit_images(train[torch.randint(0, len(train), (batch_size,), generator=g)], o.image, o.pixel_noise, g)
    templates = _templates(o, seed)
    while True:
        yield _synthetic(templates, o, g, batch_size)


EVAL_SAMPLES = 512


def held_out(o: VisionOptions, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The images every rank evaluates on: the held-out digits (with one draw of their noise, fixed
    by the run's seed), or synthetic samples from a stream no rank trains on."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + 999_983)
    if o.data == "digits":
        train, held = _split()
        if o.pixel_noise:       # the training set's noise is drawn first, as it always was: the held-out draw stays
            _noise(len(train), g)
        return digit_images(held, o.image, o.pixel_noise, g)
    return _synthetic(_templates(o, seed), o, g, EVAL_SAMPLES)


def _evaluator(o: VisionOptions, seed: int):
    x, y = held_out(o, seed)

    def evaluate(model: nn.Module) -> dict[str, float]:
        was = model.training
        model.eval()
        with torch.no_grad():
            logits = torch.cat([model(part) for part in x.split(128)])
        model.train(was)
        return {"loss": float(nn.functional.cross_entropy(logits, y)),
                "accuracy": float((logits.argmax(1) == y).float().mean()), "samples": len(y)}
    return evaluate


def build(model: nn.Module, o: VisionOptions, seed: int, rank: int, batch_size: int):
    """A classification workload on ``o``'s data: (model, this rank's batches, loss, evaluation)."""
    return model, _batches(o, seed, rank, batch_size), nn.functional.cross_entropy, _evaluator(o, seed)
