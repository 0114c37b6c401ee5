"""What a run is: RunSpec and LinkSpec, and the parsing of what users type into them.

Everything a run needs travels in a RunSpec, fully resolved (units parsed, defaults filled) and
JSON-serialisable, so a worker never reads flags or global state and a stored run can be
reproduced. Units follow tc: ``kbit``/``mbit``/``gbit`` are bits per second, ``kbps``/``mbps``
are BYTES per second; anything that could be read two ways is refused with a message naming the
accepted forms. This module imports nothing of gctestbed so every other room may use it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

MAX_NODES = 64


class UserError(Exception):
    """A mistake the user can fix (bad flag, missing privilege, missing kernel feature).

    Its message is one sentence that says what is wrong and how to fix it; the CLI prints it
    without a traceback and exits 2.
    """


class SpecError(UserError, ValueError):
    """A value typed by the user that cannot be parsed or is out of range."""


# tc's rate units (iproute2 tc_util.c): the *bit forms are bits/s, the *bps forms BYTES/s.
_RATE_UNITS = {
    "bit": 1,
    "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
    "kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40,
    "bps": 8,
    "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9, "tbps": 8 * 10**12,
    "kibps": 8 * 2**10, "mibps": 8 * 2**20, "gibps": 8 * 2**30, "tibps": 8 * 2**40,
}
_TIME_UNITS = {
    "us": 1e-6, "usec": 1e-6, "usecs": 1e-6,
    "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3,
    "s": 1.0, "sec": 1.0, "secs": 1.0,
}
RATE_FORMS = "bit, kbit, mbit, gbit, tbit (bits per second) or bps, kbps, mbps, gbps (BYTES per second, as in tc)"
TIME_FORMS = "us, ms or s"
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e([+-]?[0-9]+))?\s*([a-zA-Z]*)\s*$")


def _split_quantity(text: str, what: str, forms: str, example: str) -> tuple[float, str]:
    raw = str(text).strip()
    if raw.startswith("-"):
        raise SpecError(f"{what} '{raw}' is negative: give a positive number with a unit ({forms}), e.g. {example}.")
    m = _QUANTITY.match(raw)
    if not m:
        raise SpecError(f"{what} '{raw}' is not a number with a unit: use one of {forms}, e.g. {example}.")
    number = float(m.group(1) + (f"e{m.group(2)}" if m.group(2) else ""))
    if not math.isfinite(number):
        raise SpecError(f"{what} '{raw}' is not a finite number: use one of {forms}, e.g. {example}.")
    return number, m.group(3).lower()


def parse_rate(text: str) -> int:
    """Parse a tc rate such as ``100mbit`` or ``12.5mbps`` into bits per second."""
    number, unit = _split_quantity(text, "bandwidth", RATE_FORMS, "100mbit")
    if unit not in _RATE_UNITS:
        hint = "a bare number" if not unit else f"unit '{unit}'"
        raise SpecError(
            f"bandwidth '{str(text).strip()}' has {hint}, which is ambiguous or unknown: "
            f"use one of {RATE_FORMS}, e.g. 100mbit."
        )
    bps = round(number * _RATE_UNITS[unit])
    if bps <= 0:
        raise SpecError(f"bandwidth '{str(text).strip()}' must be greater than zero, e.g. 100mbit.")
    return bps


def parse_duration(text: str, what: str = "latency") -> float:
    """Parse a tc time such as ``5ms`` or ``250us`` into seconds; a bare ``0`` means none."""
    number, unit = _split_quantity(text, what, TIME_FORMS, "5ms")
    if not unit:
        if number == 0:
            return 0.0
        raise SpecError(f"{what} '{str(text).strip()}' has no unit: use one of {TIME_FORMS}, e.g. 5ms.")
    if unit not in _TIME_UNITS:
        raise SpecError(f"{what} '{str(text).strip()}' has unknown unit '{unit}': use one of {TIME_FORMS}, e.g. 5ms.")
    return number * _TIME_UNITS[unit]


def format_rate(bps: float) -> str:
    """Render bits per second the way tc would print it (``100mbit``)."""
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def format_duration(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if seconds >= 1:
        return f"{seconds:g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds * 1e6:g}us"


def parse_choice(text: str, what: str) -> tuple[str, dict[str, str]]:
    """Split ``name:key=value,key=value`` into the name and its raw option strings."""
    name, _, rest = str(text).strip().partition(":")
    if not name:
        raise SpecError(f"{what} '{text}' has no name: write NAME or NAME:key=value,...")
    options: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise SpecError(f"{what} option '{item}' in '{text}' is not key=value: write {name}:key=value,...")
        if key.strip() in options:
            raise SpecError(f"{what} option '{key.strip()}' is given twice in '{text}'.")
        options[key.strip()] = value.strip()
    return name, options


def resolve_options(owner: str, options_cls: type, raw: dict[str, str]) -> dict[str, Any]:
    """Turn raw option strings into the typed, defaulted fields of ``options_cls`` (a dataclass).

    The dataclass declares each option's type and default; its ``__post_init__`` may raise
    ValueError with a sentence for values out of range.
    """
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    valid = ", ".join(f"{n} (default {_default_of(f)!r})" for n, f in fields.items()) or "none"
    typed: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise SpecError(f"{owner} has no option '{key}'; valid options: {valid}.")
        typed[key] = _coerce(owner, key, value, fields[key].type)
    try:
        return dataclasses.asdict(options_cls(**typed))
    except ValueError as e:
        raise SpecError(f"{owner}: {e}") from None


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _coerce(owner: str, key: str, value: str, typ: Any) -> Any:
    name = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if name == "bool":
            low = value.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if name == "int":
            return int(value)
        if name == "float":
            number = float(value)
            if not math.isfinite(number):
                raise ValueError
            return number
        return value
    except ValueError:
        raise SpecError(f"{owner} option {key}={value!r} is not a valid {name}.") from None


@dataclass
class LinkSpec:
    """One shaped direction pair of a link: rate in bits/s, one-way latency in seconds."""

    bw_bps: int
    latency_s: float = 0.0

    def validate(self) -> None:
        if not isinstance(self.bw_bps, int) or self.bw_bps <= 0:
            raise SpecError(f"link bandwidth must be a positive number of bits per second, got {self.bw_bps!r}.")
        if not (isinstance(self.latency_s, (int, float)) and math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise SpecError(f"link latency must be zero or a positive number of seconds, got {self.latency_s!r}.")


@dataclass
class RunSpec:
    """Everything one run needs, resolved; workers receive it as JSON and nothing else."""

    nodes: int
    link: LinkSpec
    compressor: str = "none"
    compressor_options: dict[str, Any] = field(default_factory=dict)
    workload: str = "mlp"
    workload_options: dict[str, Any] = field(default_factory=dict)
    steps: int = 20
    batch_size: int = 32
    lr: float = 0.05
    seed: int = 0
    backend: str = "gloo"
    device: str = "cpu"
    bucket_cap_mb: float = 25.0
    timeout_s: float = 300.0
    results_dir: str = "results"
    run_id: str = ""

    def validate(self) -> None:
        if not isinstance(self.nodes, int) or not 1 <= self.nodes <= MAX_NODES:
            raise SpecError(f"--nodes must be a whole number from 1 to {MAX_NODES}, got {self.nodes!r}.")
        self.link.validate()
        for name in ("steps", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SpecError(f"--{name.replace('_', '-')} must be a whole number of at least 1, got {value!r}.")
        for name in ("lr", "bucket_cap_mb", "timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise SpecError(f"{name} must be a positive number, got {value!r}.")
        if self.backend not in ("gloo", "nccl"):
            raise SpecError(f"--backend must be gloo or nccl, got {self.backend!r}.")
        if self.device not in ("cpu", "cuda"):
            raise SpecError(f"--device must be cpu or cuda, got {self.device!r}.")
        if self.backend == "nccl" and self.device != "cuda":
            raise SpecError("--backend nccl needs --device cuda; use gloo for CPU tensors.")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        try:
            data = json.loads(text)
            data["link"] = LinkSpec(**data["link"])
            spec = cls(**data)
        except (ValueError, TypeError, KeyError) as e:
            raise SpecError(f"run spec JSON is not valid: {e}.") from None
        spec.validate()
        return spec
