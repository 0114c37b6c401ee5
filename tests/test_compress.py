"""Compressors round-trip as their definitions say, report exact wire sizes, and plug into DDP."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gctestbed import compress
from gctestbed.compress import hook
from gctestbed.spec import SpecError


def test_registry_lists_and_resolves():
    assert {"none", "fp16"} <= set(compress.names())
    assert compress.resolve("fp16") == ("fp16", {})
    with pytest.raises(SpecError, match="unknown compressor"):
        compress.resolve("nope")


def test_none_is_the_identity_and_sends_fp32():
    g = torch.randn(1001)
    c = compress.create("none", {})
    bucket = compress.Bucket(0, [g.shape])
    p = c.encode(g, bucket)
    assert p.nbytes == 4 * 1001
    assert torch.equal(c.decompress(p, bucket, 1001), g)


def test_fp16_halves_bytes_and_round_trips_to_half_precision():
    g = torch.randn(1001) * 3
    c = compress.create("fp16", {})
    bucket = compress.Bucket(0, [g.shape])
    p = c.encode(g, bucket)
    assert p.nbytes == 2 * 1001
    assert [t.dtype for t in p.reduce] == [torch.float16] and p.gather == []
    out = c.decompress(p, bucket, 1001)
    assert out.dtype == torch.float32
    assert torch.equal(out, g.half().float())


@pytest.fixture
def single_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("name", ["none", "fp16"])
def test_hook_adapter_trains_like_ddp_and_counts_bytes(single_rank_group, name):
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    plain = DDP(base)
    torch.manual_seed(0)
    hooked = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
    state = hook.install(hooked, compress.create(name, {}))
    state.dense_floor = 0
    x = torch.randn(8, 32)
    plain(x).square().sum().backward()
    hooked(x).square().sum().backward()
    numel = sum(p.numel() for p in base.parameters())
    stats = state.take_step_stats()
    assert stats["payload_bytes"] == numel * (4 if name == "none" else 2)
    assert stats["buckets"] >= 1 and stats["comm_s"] is not None and stats["comm_s"] >= 0
    for a, b in zip(plain.parameters(), hooked.parameters()):
        expected = a.grad if name == "none" else a.grad.half().float()
        assert torch.equal(b.grad, expected)
    assert state.take_step_stats()["payload_bytes"] == 0     # counters restart each step


def test_buckets_under_the_floor_go_dense(single_rank_group):
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 4))                # 36 elements: one small bucket
    state = hook.install(model, compress.create("topk", {"ratio": 0.01}))
    model(torch.randn(2, 8)).sum().backward()
    assert state.take_step_stats()["payload_bytes"] == 36 * 4
