"""The Compressor interface and the Payload it produces.

A compressor turns a flat gradient into a payload (a few tensors) and back, and declares how
payloads meet on the wire: ``allreduce`` when payloads can be summed (fp16, PowerSGD's factors)
or ``allgather`` when every rank must see every other rank's payload (top-k, sign, 2-bit).
A payload's tensors are exactly what is sent, so its byte count is the wire size by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

COLLECTIVES = ("allreduce", "allgather")


@dataclass
class Payload:
    """What one rank sends for one bucket: the tensors on the wire plus what decoding needs."""

    tensors: list[torch.Tensor]
    numel: int
    dtype: torch.dtype
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Exact bytes this payload puts on the wire (before the collective's own overhead)."""
        return sum(t.numel() * t.element_size() for t in self.tensors)


@dataclass
class NoOptions:
    """This method has no options."""


class Compressor:
    """One method. Subclasses set the class attributes and implement compress/decompress.

    ``compress`` receives the bucket's flat gradient already divided by the world size, so the
    sum of what ranks contribute is the mean gradient; ``decompress`` receives a payload whose
    tensors have been through the collective (summed for ``allreduce``).
    """

    name: ClassVar[str]
    collective: ClassVar[str]
    summary: ClassVar[str]
    paper: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions

    def __init__(self, **options: Any):
        self.options = self.Options(**options)

    def compress(self, grad: torch.Tensor) -> Payload:
        raise NotImplementedError

    def decompress(self, payload: Payload) -> torch.Tensor:
        raise NotImplementedError
