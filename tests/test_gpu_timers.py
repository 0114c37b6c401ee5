"""The hook's encode, decode and communication times are the device's own time.

On a GPU the CPU only queues kernels, so a CPU clock around an encode times the queueing. The
check is a second clock: a kernel that sleeps for a known number of GPU cycles, timed here by the
wall clock around a synchronised launch, must come back from the hook as that long. The same test
shows the CPU clock would not: the launch alone returns in a fraction of it.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gctestbed.compress import hook
from gctestbed.compress.base import Compressor, Payload


class Sleeper(Compressor):
    """Sends the bucket as it is; its encode and decode each take ``seconds`` of the device's time
    (a GPU kernel that waits ``cycles`` on a GPU, a sleep on a CPU)."""

    name = "sleeper"

    def __init__(self, cycles: int = 0, seconds: float = 0.0):
        super().__init__()
        self.cycles, self.seconds = cycles, seconds

    def _wait(self, t: torch.Tensor) -> None:
        if t.is_cuda:
            torch.cuda._sleep(self.cycles)
        else:
            time.sleep(self.seconds)

    def encode(self, grad, bucket):
        self._wait(grad)
        return Payload(reduce=[grad])

    def decode(self, tensors, meta, bucket, numel):
        self._wait(tensors[0])
        return tensors[0]


def _one_rank_group(backend: str):
    store = dist.HashStore()
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    return dist.group.WORLD


def _steps(device: str, compressor: Compressor, steps: int = 3) -> list[dict]:
    """Train a 1M-parameter linear layer for a few steps through the hook; each step's stats."""
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024, bias=False).to(device)
    ddp = DDP(model, device_ids=[0] if device == "cuda" else None, bucket_cap_mb=25)
    state = hook.install(ddp, compressor)
    out = []
    for _ in range(steps):
        ddp(torch.randn(8, 1024, device=device)).square().sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        out.append(state.take_step_stats())
    return out


def test_on_a_cpu_encode_and_decode_are_the_cpus_time():
    _one_rank_group("gloo")
    try:
        stats = _steps("cpu", Sleeper(seconds=0.03))
    finally:
        dist.destroy_process_group()
    for s in stats:
        assert 0.03 <= s["encode_s"] < 0.06 and 0.03 <= s["decode_s"] < 0.06, s
        assert s["exchanges"][0]["encode_s"] == pytest.approx(s["encode_s"])


@pytest.mark.cuda
def test_on_a_gpu_encode_and_decode_are_the_gpus_time():
    cycles = 100_000_000                  # about 50 ms at an H100's 2 GHz
    walls, launches = [], []
    for _ in range(3):                    # the second clock: wall time of the kernel, synchronised
        torch.cuda.synchronize()
        t = time.perf_counter()
        torch.cuda._sleep(cycles)
        launches.append(time.perf_counter() - t)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t)
    expected = statistics.median(walls)
    assert statistics.median(launches) < 0.2 * expected, "the launch blocked: a CPU clock would not be caught"
    _one_rank_group("nccl")
    try:
        stats = _steps("cuda", Sleeper(cycles=cycles))
    finally:
        dist.destroy_process_group()
    for s in stats[1:]:                   # step 0 builds DDP's buckets and warms the kernels
        assert s["encode_s"] == pytest.approx(expected, rel=0.2), (s["encode_s"], expected)
        assert s["decode_s"] == pytest.approx(expected, rel=0.2), (s["decode_s"], expected)
        assert s["exchanges"][0]["encode_s"] == pytest.approx(s["encode_s"])
        assert s["comm_s"] is not None and s["comm_s"] < expected, s["comm_s"]
