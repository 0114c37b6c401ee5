"""Per-sample gradient statistics within a batch, what the variance criterion reads.

Tsuzuku et al. judge an element by the variance of its per-sample gradients within the minibatch.
``torch.func`` gives every sample's gradient in a vectorised pass (``vmap`` over ``grad`` of a
one-sample loss, through ``functional_call``), without changing the model or its backward.

Batch normalisation couples a batch's samples, so a sample's own gradient is not defined by the
model alone: here each normalisation layer is held at the batch's own statistics (the values the
training forward normalised with), so every sample's forward is the one it had in the batch, and
only the gradient that flows through the batch statistics is left out. Dropout is off in that
pass. A model without either gets exact per-sample gradients.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

CHUNK_BYTES = 256e6     # per vectorised pass, the per-sample gradients held at once: as many samples as fit


def squares(module: nn.Module, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor
            ) -> dict[nn.Parameter, torch.Tensor]:
    """Per trainable parameter, sum over the batch's samples z of (g_z / B)², g_z the gradient of
    sample z's loss and B the batch size: the squares of each sample's share of the batch's mean
    gradient, the units SampleStats gathers per micro-batch (here a micro-batch is one sample)."""
    return statistics(module, loss_fn, x, y)[0]


def statistics(module: nn.Module, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor
               ) -> tuple[dict[nn.Parameter, torch.Tensor], dict[nn.Parameter, torch.Tensor]]:
    """(squares, means) per trainable parameter: the squares as ``squares`` gives them, and the
    mean of the same per-sample gradients, sum_z g_z / B (with batch norm held or dropout off it
    differs from the training step's gradient, so a variance is taken around this mean)."""
    named = {n: p for n, p in module.named_parameters() if p.requires_grad}
    params = {n: p.detach() for n, p in named.items()}
    buffers = {n: b.detach() for n, b in module.named_buffers()}
    buffers.update(_batch_statistics(module, x))
    size = x.shape[0]

    def one(p, b, xi, yi):
        return loss_fn(functional_call(module, (p, b), (xi.unsqueeze(0),)), yi.unsqueeze(0))

    per_sample = vmap(grad(one), in_dims=(None, None, 0, 0))
    out = {n: torch.zeros_like(p) for n, p in params.items()}
    mean = {n: torch.zeros_like(p) for n, p in params.items()}
    chunk = max(1, int(CHUNK_BYTES // (4 * sum(p.numel() for p in params.values()))))
    with _evaluating(module):
        for i in range(0, size, chunk):
            g = per_sample(params, buffers, x[i:i + chunk], y[i:i + chunk])
            for n in out:
                share = g[n] / size
                out[n] += share.square().sum(0)
                mean[n] += share.sum(0)
    return {named[n]: v for n, v in out.items()}, {named[n]: v for n, v in mean.items()}


def _norms(module: nn.Module) -> dict[str, nn.modules.batchnorm._BatchNorm]:
    return {n: m for n, m in module.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats}


def _batch_statistics(module: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each training batch norm's input mean and (biased) variance over this batch, as buffers
    ``<name>.running_mean`` / ``.running_var``, from one forward without gradients; the layers'
    own running statistics are left as they were."""
    norms = _norms(module)
    if not norms:
        return {}
    stats: dict[str, torch.Tensor] = {}
    saved = {n: {k: b.clone() for k, b in m.named_buffers()} for n, m in norms.items()}

    def keep(name):
        def hook(m, args):
            a = args[0]
            dims = [d for d in range(a.dim()) if d != 1]
            stats[f"{name}.running_mean"] = a.mean(dims).detach()
            stats[f"{name}.running_var"] = a.var(dims, unbiased=False).detach()
        return hook
    handles = [m.register_forward_pre_hook(keep(n)) for n, m in norms.items()]
    devices = [x.device] if x.device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):     # training's random draws stay as they were
            module(x)
    finally:
        for h in handles:
            h.remove()
        for n, m in norms.items():
            for k, b in m.named_buffers():
                b.copy_(saved[n][k])
    return stats


@contextlib.contextmanager
def _evaluating(module: nn.Module):
    """Every submodule in eval mode (batch norm reads the statistics it is given, dropout is off),
    restored after."""
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        yield
    finally:
        for m, training in modes.items():
            m.training = training
