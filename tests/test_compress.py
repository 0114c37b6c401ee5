"""Compressors round-trip as their definitions say, report exact wire sizes, and plug into DDP."""

from __future__ import annotations

import pytest
import torch
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


def _dgc_payload_values(options: str, grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """The dense tensor each step's DGC payload stands for, steps encoded one after another."""
    from gctestbed.compress import Bucket, create, resolve
    dgc = create(*resolve(options), kernels="torch")
    out = []
    for step, g in enumerate(grads):
        bucket = Bucket(key=0, shapes=[torch.Size([64, 64])], step=step)
        payload = dgc.encode(g.clone(), bucket)
        out.append(dgc.decode(payload.gather, payload.meta, bucket, g.numel()))
    return out, dgc


def test_dgc_tricks_turn_off_one_by_one_as_the_ablation_needs():
    """Written from the paper's algorithm, not from our code: without accumulation the second step
    sends the top 1 % of its own gradient; with it, of both steps' sum where the first sent nothing."""
    g = torch.Generator().manual_seed(0)
    g1, g2 = torch.randn(4096, generator=g), torch.randn(4096, generator=g)
    base = "dgc:ratio=0.01,warmup_epochs=0,sample_ratio=1,momentum=0.9"

    def top(v, sent):
        """v's largest-magnitude entries, as many as ``sent`` carries (the sampled threshold picks
        about 1 %, not exactly 41): which entries and their values are what the tricks change."""
        idx = v.abs().topk(int((sent != 0).sum())).indices
        out = torch.zeros_like(v)
        out[idx] = v[idx]
        return out
    (s1, s2), dgc = _dgc_payload_values(base + ",accumulate=false,momentum_correction=false,masking=false", [g1, g2])
    assert torch.equal(s1, top(g1, s1)) and torch.equal(s2, top(g2, s2)) and not dgc.momentum_inside
    (s1, s2), _ = _dgc_payload_values(base + ",momentum_correction=false,masking=false", [g1, g2])
    assert torch.equal(s2, top(g1 - s1 + g2, s2))                                    # accumulation only
    (s1, s2), dgc = _dgc_payload_values(base + ",masking=false", [g1, g2])
    u2 = 0.9 * g1 + g2                                                               # momentum, not masked
    assert torch.allclose(s2, top(g1 - s1 + u2, s2)) and dgc.momentum_inside
    assert 30 <= int((s2 != 0).sum()) <= 54                                          # about 1 %
    # factor masking shows where half the tensor is sent: last step's winners come back without it
    half = base.replace("ratio=0.01", "ratio=0.5")
    (s1, s2), _ = _dgc_payload_values(half, [g1, g2])
    u1 = g1.clone()
    u1[s1 != 0] = 0
    assert torch.allclose(s2, top(g1 - s1 + 0.9 * u1 + g2, s2))
    (t1, t2), _ = _dgc_payload_values(half + ",masking=false", [g1, g2])
    assert torch.allclose(t2, top(g1 - t1 + 0.9 * g1 + g2, t2)) and not torch.allclose(s2, t2)
