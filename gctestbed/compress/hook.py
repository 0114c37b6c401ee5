"""The one adapter that turns any Compressor into a DDP communication hook.

Installed with ``register_comm_hook``, compression runs per bucket as soon as the bucket's
gradients are ready, so it overlaps with the rest of backward exactly as production DDP does,
and any model wrapped in DDP can use it. The state object, like PyTorch's PowerSGDState, also
counts what each step cost: payload bytes, buckets, encode and decode time, and the span from
the first bucket's collective launch to the last one's completion (the communication time).
"""


import threading
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..timing import now
from .base import Compressor, Payload


class HookState:
    """A compressor, the process group it talks over, and the running counters of a step.

    Decoding runs on the communication thread when a collective completes, so the counters are
    guarded by a lock.
    """

    def __init__(self, compressor: Compressor, process_group: dist.ProcessGroup | None = None):
        if compressor.collective != "allreduce":
            raise NotImplementedError(f"{compressor.name}: the {compressor.collective} collective is not wired into the hook yet")
        self.compressor = compressor
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._stats = {"payload_bytes": 0, "buckets": 0, "encode_s": 0.0, "decode_s": 0.0}
        self._comm_start: float | None = None
        self._comm_end: float | None = None

    def take_step_stats(self) -> dict[str, Any]:
        """The counters since the last call (one step), then start afresh."""
        with self._lock:
            stats = dict(self._stats)
            span = (self._comm_end - self._comm_start) if self._comm_start and self._comm_end else None
            stats["comm_s"] = span
            self._reset()
        return stats

    def _encoded(self, payload: Payload, seconds: float, launched: float) -> None:
        with self._lock:
            self._stats["payload_bytes"] += payload.nbytes
            self._stats["buckets"] += 1
            self._stats["encode_s"] += seconds
            if self._comm_start is None:
                self._comm_start = launched

    def _decoded(self, arrived: float, seconds: float) -> None:
        with self._lock:
            self._stats["decode_s"] += seconds
            self._comm_end = arrived if self._comm_end is None else max(self._comm_end, arrived)


def compression_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP hook: compress the bucket, run the compressor's collective, decompress into the bucket."""
    buffer = bucket.buffer()
    compressor = state.compressor
    t0 = now()
    payload = compressor.compress(buffer.div_(state.world_size))
    launched = now()
    state._encoded(payload, launched - t0, launched)
    futures = [dist.all_reduce(t, group=state.process_group, async_op=True).get_future() for t in payload.tensors]

    def decode(_: torch.futures.Future) -> torch.Tensor:
        arrived = now()
        out = compressor.decompress(payload)
        if out.data_ptr() != buffer.data_ptr():
            buffer.copy_(out)
        state._decoded(arrived, now() - arrived)
        return buffer

    return torch.futures.collect_all(futures).then(decode)


def install(model: DistributedDataParallel, compressor: Compressor,
            process_group: dist.ProcessGroup | None = None) -> HookState:
    """Make ``model`` communicate through ``compressor``; returns the state holding the counters."""
    state = HookState(compressor, process_group)
    model.register_comm_hook(state, compression_hook)
    return state
