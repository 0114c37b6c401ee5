"""Built-in workloads by name, and users' own as ``pkg.module:function``.

A workload is a model, an endless batch iterator, a loss, and an evaluation on held-out data (the
same samples on every rank). Each built-in declares its options as a dataclass (types, defaults,
range checks in ``__post_init__``) so the CLI can parse ``--workload mlp:width=512`` before any
node starts.

User code (``--workload mypkg.train:make``): ``make(rank, world, batch_size, seed)`` returns
``(model, batches, loss_fn)`` or ``(model, batches, loss_fn, evaluate)``. ``model`` is a plain
``nn.Module`` (gctestbed wraps it in DDP), identical on every rank (seed it with ``seed``);
``batches`` yields ``(inputs, targets)`` forever, this rank's own samples; ``loss_fn(model(inputs),
targets)`` is a scalar; the optional ``evaluate(model)`` returns ``{"loss": ..., "accuracy": ...}``
(and ``"samples"``: how many held-out samples the accuracy counts, for its error bars).
The module is imported from the directory gctestbed was started in.
"""

from __future__ import annotations

import importlib
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from . import alexnet, cnn, images, lstm, mlp, replay, resnet, transformer, vgg


@dataclass
class Workload:
    model: torch.nn.Module
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[torch.nn.Module], dict[str, float | None]]
    # a replay's recorded codec (workloads/replay.py, codec=recorded): compress.recorded.RecordedCodec's
    # arguments beside the method, which the worker then stands in for the method's own payloads
    codec: dict[str, Any] | None = None
    # figures of the step the workload measures itself, for the step's row (a replay: behind_s)
    step_stats: Callable[[], dict[str, float]] | None = None
    # a replay's recorded optimizer (optim=recorded): given the real optimizer, what the worker steps instead
    optimizer: Callable[[Any], Any] | None = None
    # whether DDP sends rank 0's buffers before every forward: not where buffers=local (worker.local_buffers)
    broadcast_buffers: bool = True


_BUILDERS = {"mlp": (mlp.MLPOptions, mlp.build), "cnn": (cnn.CNNOptions, cnn.build),
             "lstm": (lstm.LSTMOptions, lstm.build), "transformer": (transformer.TransformerOptions, transformer.build),
             # the sources' own architectures, at their true layouts (scale=1) or scaled down
             "alexnet": (alexnet.AlexNetOptions, alexnet.build), "vgg16": (vgg.VGG16Options, vgg.build),
             "resnet18": (resnet.ResNet18Options, resnet.build18), "resnet50": (resnet.ResNet50Options, resnet.build50),
             "gpt2": (transformer.GPT2Options, transformer.build_gpt2),
             # a recorded run's compute (gctestbed trace record), replayed on this run's network
             "replay": (replay.ReplayOptions, replay.build)}
_USER = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def names() -> list[str]:
    return sorted(_BUILDERS)


def is_user_code(text: str) -> bool:
    """``pkg.module:function`` (user code) rather than ``name:key=value,...`` (a built-in)."""
    return bool(_USER.match(text.strip())) and text.split(":")[0] not in _BUILDERS


def options_class(name: str) -> type:
    """The options dataclass of workload ``name``; KeyError names the known ones."""
    if name not in _BUILDERS:
        raise KeyError(f"unknown workload '{name}'; available: {', '.join(names())}, or pkg.module:function for your own")
    return _BUILDERS[name][0]


def user_function(text: str) -> Callable[..., Any]:
    """Import ``pkg.module:function``; ValueError with a sentence when it cannot be found."""
    module_name, function_name = text.strip().split(":")
    if "" not in sys.path:
        sys.path.insert(0, "")          # the directory gctestbed was started in, as for python -m
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix
        raise ValueError(f"workload '{text}': cannot import {module_name} ({type(e).__name__}: {e})") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"workload '{text}': {module_name} has no function {function_name}")
    return function


def _no_evaluation(model: torch.nn.Module) -> dict[str, float | None]:
    return {"loss": None, "accuracy": None}


def build(name: str, options: dict[str, Any], seed: int, rank: int, batch_size: int, world: int = 1) -> Workload:
    """Model (identical on every rank for a seed) and this rank's own stream of batches."""
    if name == "replay" and options.get("real", 0):              # a mixed run
        trace = replay.load(options["trace"])
        job = trace["job"]
        if rank < options["real"]:                                # this rank runs the recorded model
            return build(job["workload"], job["workload_options"], seed, rank, batch_size, world)
        work = Workload(*_BUILDERS[name][1](_BUILDERS[name][0](**options), seed, rank, batch_size))
        if "buffers" not in trace:                                # a trace from before buffers were recorded
            real = build(job["workload"], job["workload_options"], seed, rank, batch_size, world)
            replay.add_buffers(work.model, list(real.model.named_buffers()))
        return work
    if name in _BUILDERS:
        cls, builder = _BUILDERS[name]
        made = builder(cls(**options), seed, rank, batch_size)
        # a replay's builder says itself whether the recorded run sent its buffers
        return Workload(*made) if name == "replay" else Workload(*made, broadcast_buffers=images.broadcasts(options))
    made = user_function(name)(rank=rank, world=world, batch_size=batch_size, seed=seed)
    if not isinstance(made, tuple) or len(made) not in (3, 4) or not isinstance(made[0], torch.nn.Module):
        raise ValueError(f"workload '{name}' must return (model, batches, loss_fn[, evaluate]) with an nn.Module first")
    model, batches, loss_fn, *evaluate = made
    return Workload(model, iter(batches), loss_fn, evaluate[0] if evaluate else _no_evaluation)
