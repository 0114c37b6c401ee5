"""Gradient compressors: one module per family, a registry, and the DDP-hook adapter.

Importing this package registers every built-in method.
"""

from . import dense, dgc, lowrank, quantize, sign, sparse, variance  # noqa: F401  (each module registers its methods)
from .base import Bucket, Compressor, Payload
from . import registry
from .registry import create, for_run, get, names, resolve

__all__ = ["Bucket", "Compressor", "Payload", "create", "for_run", "get", "names", "resolve"]
