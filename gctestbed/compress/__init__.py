"""Gradient compressors: one module per family, a registry, and the DDP-hook adapter.

Importing this package registers every built-in method.
"""

from . import dense  # noqa: F401  (registers none, fp16)
from .base import Compressor, Payload
from .registry import create, get, names, resolve

__all__ = ["Compressor", "Payload", "create", "get", "names", "resolve"]
