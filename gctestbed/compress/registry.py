"""Every compressor by name, and the parsing of ``--compressor name:key=value,...``."""

from __future__ import annotations

from typing import Any

from ..spec import SpecError, parse_choice, resolve_options
from .base import COLLECTIVES, Compressor

_REGISTRY: dict[str, type[Compressor]] = {}


def register(cls: type[Compressor]) -> type[Compressor]:
    """Class decorator: make a compressor available under ``cls.name``."""
    if cls.collective not in COLLECTIVES:
        raise ValueError(f"{cls.__name__}.collective must be one of {COLLECTIVES}")
    if cls.name in _REGISTRY:
        raise ValueError(f"two compressors are named {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str) -> type[Compressor]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise SpecError(f"unknown compressor '{name}'; available: {', '.join(names())}.") from None


def resolve(text: str) -> tuple[str, dict[str, Any]]:
    """``dgc:ratio=0.001`` -> ("dgc", every option of dgc with its value or default)."""
    name, raw = parse_choice(text, "compressor")
    cls = get(name)
    return name, resolve_options(f"compressor '{name}'", cls.Options, raw)


def describe() -> list[dict[str, Any]]:
    """Every method with its collective, options (type, default), paper and one-line summary."""
    import dataclasses
    rows = []
    for name in names():
        cls = _REGISTRY[name]
        options = [{"name": f.name, "type": f.type if isinstance(f.type, str) else f.type.__name__,
                    "default": f.default} for f in dataclasses.fields(cls.Options)]
        rows.append({"name": name, "collective": cls.collective, "summary": cls.summary, "paper": cls.paper,
                     "error_feedback": bool(cls.error_feedback), "momentum_inside": cls.momentum_inside,
                     "options": options})
    return rows


def create(name: str, options: dict[str, Any], kernels: str = "torch", feedback: bool = True) -> Compressor:
    """An instance of ``name``, wrapped in error feedback when the method calls for it (and
    ``feedback``: a parameter server's copy has none; and unless its ``residual`` option is off), running the native kernels
    (``kernels="native"``, where built) or the pure-torch reference."""
    from .. import kernels as native
    compressor = get(name)(**options)
    compressor.ops = native.load(kernels) if compressor.has_kernels else None
    if compressor.error_feedback and feedback and getattr(compressor.options, "residual", True):
        from .feedback import ErrorFeedback
        return ErrorFeedback(compressor)
    return compressor


RUN_SEED_STRIDE = 1_000_003


def for_run(spec: Any, kernels: str | None = None, feedback: bool = True) -> Compressor:
    """The run's method, its random streams (QSGD's and TernGrad's rounding, random-k's picks,
    DGC's samples, PowerSGD's start) drawn from its ``seed`` option and the run's seed together: a
    sweep's repeats (seed + k) are then independent in the method's noise too, while every rank
    and server of one run, sharing the run's seed, draws the same numbers. Seed 0 leaves the
    option's own seed as typed."""
    options = dict(spec.compressor_options)
    if "seed" in options:
        options["seed"] = options["seed"] + RUN_SEED_STRIDE * spec.seed
    return create(spec.compressor, options, kernels=spec.kernels if kernels is None else kernels, feedback=feedback)
