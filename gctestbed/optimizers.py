"""The optimizer of a run: ``--optimizer sgd|adam|adamw[:key=value,...]``, built from torch.optim.

The variance-based paper's main results use Adam; MXNet's and DGC's use momentum SGD. A method
that applies momentum itself (``Compressor.momentum_inside``: DGC's momentum correction, Signum)
gets SGD without momentum, since momentum twice would be a different optimizer; with Adam or
AdamW it is refused with a sentence, because Adam's moments on top of an already momentum-filtered
gradient are not what either paper ran (turn DGC's ``momentum_correction`` off to use it with Adam).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import torch

from .spec import OPTIMIZERS, SpecError, parse_choice, resolve_options


@dataclass
class SGDOptions:
    momentum: float = 0.9        # heavy-ball momentum; 0 for plain SGD (a method with momentum inside forces 0)
    weight_decay: float = 0.0    # L2 penalty added to the gradient, as torch.optim.SGD does
    nesterov: bool = False       # Nesterov's look-ahead form (needs momentum > 0)
    warmup_steps: int = 0        # gradual warm-up of the learning rate (see warmup_factor); 0: none
    clip_norm: float = 0.0       # the averaged gradient's global L2 norm held to this before each step (see clip); 0: off

    def __post_init__(self):
        if self.clip_norm < 0:
            raise ValueError(f"clip_norm must be 0 or more, got {self.clip_norm}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be 0 or more, got {self.warmup_steps}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be 0 or more, got {self.weight_decay}")
        if self.nesterov and self.momentum == 0:
            raise ValueError("nesterov needs momentum above 0")


@dataclass
class AdamOptions:
    beta1: float = 0.9           # decay of the first moment (Adam's momentum)
    beta2: float = 0.999         # decay of the second moment; lower (0.98, 0.95) for transformers that spike
    eps: float = 1e-8            # added to the second moment's root; larger is more like SGD
    weight_decay: float = 0.0    # adam: L2 added to the gradient; adamw: decoupled decay of the weights
    warmup_steps: int = 0        # gradual warm-up of the learning rate (see warmup_factor); 0: none
    clip_norm: float = 0.0       # the averaged gradient's global L2 norm held to this before each step (see clip); 0: off

    def __post_init__(self):
        if self.clip_norm < 0:
            raise ValueError(f"clip_norm must be 0 or more, got {self.clip_norm}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be 0 or more, got {self.warmup_steps}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.eps <= 0 or self.weight_decay < 0:
            raise ValueError("eps must be above 0 and weight_decay 0 or more")


@dataclass
class AdamWOptions(AdamOptions):
    weight_decay: float = 0.01   # torch.optim.AdamW's default


OPTIONS: dict[str, type] = dict(zip(OPTIMIZERS, (SGDOptions, AdamOptions, AdamWOptions)))   # spec names them


def warmup_factor(step: int, warmup_steps: int, nodes: int) -> float:
    """The share of the learning rate used at ``step`` (from 0) under gradual warm-up (Goyal et
    al., 2017, and DGC's training recipe after it): lr / N at the first step, rising linearly to lr
    over ``warmup_steps`` steps, for N worker nodes. Change ``warmup_steps`` from 0 where a recipe
    calls for it (DGC warms up over its first epochs); it matters most where lr was scaled with N."""
    if step >= warmup_steps:
        return 1.0
    return (step * (nodes - 1) / warmup_steps + 1) / nodes


def warmup(optimizer: torch.optim.Optimizer, options: dict[str, Any], nodes: int):
    """The schedule that applies warmup_factor to ``optimizer`` (step it after each optimizer
    step), or None when the run has no warm-up."""
    steps = options.get("warmup_steps", 0)
    if not steps:
        return None
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_factor(step, steps, nodes))


def clip(params: Iterable[torch.nn.Parameter], options: dict[str, Any], clips_locally: bool = False) -> None:
    """Gradient clipping (Pascanu et al., 2013) as training usually applies it, after the
    gradients were averaged: their global L2 norm held to ``clip_norm``. Change it from 0 where the
    model trains with it (LSTMs: 0.25 to 5). A method that clips each node's gradient before it is
    sent (DGC's local clipping) replaces this step, as its paper moves it. It clips what the
    communication hook hands back: the averaged gradient for dense and quantizing methods; for
    error-feedback and sign methods their averaged update (what is clipped off is not returned to
    their residual); methods with momentum inside are refused (check); under local SGD and DiLoCo
    each node's own gradient between averagings."""
    limit = options.get("clip_norm", 0.0)
    if limit and not clips_locally:
        torch.nn.utils.clip_grad_norm_(params, limit)


def names() -> list[str]:
    return list(OPTIONS)


def resolve(text: str) -> tuple[str, dict[str, Any]]:
    """``adam:beta2=0.98`` -> ("adam", every option with its value or default)."""
    name, raw = parse_choice(text, "optimizer")
    if name not in OPTIONS:
        raise SpecError(f"unknown optimizer '{name}'; available: {', '.join(OPTIONS)}.")
    return name, resolve_options(f"optimizer '{name}'", OPTIONS[name], raw)


def compatible(name: str, momentum_inside: bool) -> bool:
    """Whether a method (that applies momentum itself or not) may run under optimizer ``name``."""
    return name == "sgd" or not momentum_inside


def check(name: str, compressor: str, momentum_inside: bool, options: dict[str, Any] | None = None,
          clips_locally: bool = False) -> None:
    """A sentence when ``compressor`` cannot run under optimizer ``name`` (with ``options``)."""
    if (options or {}).get("clip_norm") and momentum_inside and not clips_locally:
        raise SpecError(f"{compressor} applies momentum itself, so what it hands the optimizer is a velocity, not a "
                        f"gradient, and clip_norm would clip the update instead: clip inside the method "
                        f"({'dgc:clip_norm=...' if compressor == 'dgc' else 'not offered by it'}) or drop clip_norm.")
    if not compatible(name, momentum_inside):
        hint = (" (or turn its momentum correction off: dgc:momentum_correction=false)" if compressor == "dgc" else "")
        raise SpecError(f"{compressor} applies momentum itself before it compresses, and {name} would add its own "
                        f"moments on top: use --optimizer sgd with it{hint}.")


def build(name: str, options: dict[str, Any], params: Iterable[torch.nn.Parameter], lr: float,
          momentum_inside: bool = False, compressor: str = "") -> torch.optim.Optimizer:
    """The torch optimizer for a run; SGD loses its momentum where the method applies it itself."""
    check(name, compressor, momentum_inside)
    o = OPTIONS[name](**options)
    if name == "sgd":
        momentum = 0.0 if momentum_inside else o.momentum
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=o.weight_decay,
                               nesterov=o.nesterov and momentum > 0)
    cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    return cls(params, lr=lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)
