"""Memories follow their parameters: when DDP rebuilds its buckets, a residual, velocity,
accumulation or PowerSGD's Q stays with the parameter it was built from, never with a bucket index.

DDP (this torch) trains its first step with one bucket of every parameter in registration order
and then rebuilds the buckets in the order gradients became ready. A model that registers ``b``
before ``a`` but uses ``b`` first therefore has bucket 0 = [b, a] at step 0 and [a, b] after:
the same bucket index and size, the parameters swapped. Its twin registers ``a`` first and keeps
[a, b] throughout. With memories that follow the parameters both train identically; with
memories kept per bucket index, a's memory after the rebuild is b's.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gctestbed import compress
from gctestbed.compress import hook
from gctestbed.compress.base import Bucket
from gctestbed.compress.memory import Memory
from gctestbed.worker import forward_backward

N = 48          # a and b are N x N: 2304 elements each, above the dense floor
STEPS = 4

# Every method that keeps state between steps, with options that make it act on this small task
# (thresholds near the gradients' scale, no warm-up of plain all-reduce).
STATEFUL = ["twobit:threshold=0.0005", "onebit:scale=0.0005", "threshold:tau=0.0005", "topk:ratio=0.05",
            "efsignsgd", "signum", "dgc:ratio=0.05,warmup_epochs=0,min_numel=16", "variance:alpha=0.5",
            "hybrid:alpha=0.5,tau=0.0005", "powersgd:rank=2,start_iter=0", "randomk:ratio=0.1"]
# randomk draws its k positions over the bucket's flat layout, which differs at step 0 between the
# twins: its memory is covered by the helper's own tests and the no-dict check, not the twin run.
LAYOUT_FREE = [m for m in STATEFUL if not m.startswith("randomk")]


class Pair(torch.nn.Module):
    """y = (x b) a, with the parameters registered in ``order``."""

    def __init__(self, order: tuple[str, str]):
        super().__init__()
        init = {"a": torch.randn(N, N, generator=torch.Generator().manual_seed(1)) * 0.1,
                "b": torch.randn(N, N, generator=torch.Generator().manual_seed(2)) * 0.1}
        for name in order:
            self.register_parameter(name, torch.nn.Parameter(init[name].clone()))

    def forward(self, x):
        return (x @ self.b) @ self.a


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def train(method: str, order: tuple[str, str]):
    """Train the Pair registered in ``order``: its parameters by name, the bucket layouts the
    compressor saw per step, and the compressor."""
    name, options = compress.resolve(method)
    model = Pair(order)
    ddp = DDP(model, bucket_cap_mb=25)
    compressor = compress.create(name, options, kernels="torch")
    state = hook.install(ddp, compressor)
    state.dense_floor = 0
    names = {id(p): n for n, p in model.named_parameters()}
    layouts: list[list[list[str]]] = []
    encode = compressor.encode

    def watched(grad, bucket: Bucket):
        layouts[-1].append([names[id(p)] for p in bucket.params])
        return encode(grad, bucket)

    compressor.encode = watched
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.5, momentum=0.0 if compressor.momentum_inside else 0.9)
    gen = torch.Generator().manual_seed(3)
    for step in range(STEPS):
        layouts.append([])
        x, y = torch.randn(32, N, generator=gen), torch.randn(32, N, generator=gen)
        loss = lambda out, t: (out - t).square().mean()     # noqa: E731
        if compressor.reads_batch:
            compressor.observe(ddp.module, loss, x, y)
        forward_backward(ddp, loss, x, y, compressor.microbatches)
        optimizer.step()
        optimizer.zero_grad()
        assert state.take_step_stats()["buckets"] == 1 and state.step == step + 1   # the hook numbers its steps
    return {n: p.detach().clone() for n, p in model.named_parameters()}, layouts, compressor


def test_the_twins_differ_only_in_their_bucket_layout(group):
    _, swapped, _ = train("none", ("b", "a"))
    _, steady, _ = train("none", ("a", "b"))
    assert swapped[0] == [["b", "a"]] and all(layout == [["a", "b"]] for layout in swapped[1:])
    assert all(layout == [["a", "b"]] for layout in steady)


@pytest.mark.parametrize("method", LAYOUT_FREE)
def test_memories_follow_their_parameters_when_buckets_are_rebuilt(group, method):
    swapped, _, _ = train(method, ("b", "a"))
    steady, _, _ = train(method, ("a", "b"))
    init = Pair(("a", "b"))
    for name in ("a", "b"):
        assert not torch.equal(steady[name], getattr(init, name)), f"{method} did not train {name}"
        torch.testing.assert_close(swapped[name], steady[name], rtol=1e-5, atol=1e-7,
                                   msg=lambda m: f"{method}, parameter {name}: {m}")


@pytest.mark.parametrize("method", STATEFUL)
def test_every_method_keeps_its_state_in_the_memory_helper(group, method):
    """No method keeps tensors in dicts of its own (keyed by bucket index, as they once were)."""
    _, _, compressor = train(method, ("b", "a"))
    memories = []
    for owner in (compressor, getattr(compressor, "inner", compressor)):
        for attr, value in vars(owner).items():
            if isinstance(value, Memory):
                memories.append(value)
            assert not (isinstance(value, dict) and any(isinstance(v, torch.Tensor) for v in value.values())), \
                f"{method} keeps tensors in its own dict {attr!r}"
    assert memories and any(m.held() for m in memories), f"{method} holds no state in a Memory"


def test_memory_regroups_parameters_across_buckets_of_equal_size():
    """[p0 p1][p2 p3] rebuilt as [p0 p2][p3 p1]: every parameter keeps its own state."""
    memory = Memory()
    first = memory.flat(["p0", "p1"], [3, 2], "cpu")
    second = memory.flat(["p2", "p3"], [2, 3], "cpu")
    first.copy_(torch.tensor([0.0, 0, 0, 1, 1]))
    second.copy_(torch.tensor([2.0, 2, 3, 3, 3]))
    a = memory.flat(["p0", "p2"], [3, 2], "cpu")
    b = memory.flat(["p3", "p1"], [3, 2], "cpu")
    assert a.tolist() == [0, 0, 0, 2, 2] and b.tolist() == [3, 3, 3, 1, 1]
    assert memory.of("p1").tolist() == [1, 1] and memory.held() == 4
    a += 10                                       # the handed-out tensor is the state itself
    assert memory.of("p2").tolist() == [12, 12]
    assert memory.flat(["p0", "p2"], [3, 2], "cpu") is a


def test_memory_starts_a_parameter_afresh_only_when_new_or_resized():
    memory = Memory()
    memory.flat(["w"], [4], "cpu").fill_(1.0)
    assert memory.flat(["w", "new"], [4, 2], "cpu").tolist() == [1, 1, 1, 1, 0, 0]
    assert memory.flat(["w"], [6], "cpu").tolist() == [0] * 6
    seeded = memory.flat(["q"], [3], "cpu", fresh=lambda pid, n: torch.full((n,), 7.0))
    assert seeded.tolist() == [7, 7, 7]


def test_memory_hands_back_no_stale_bucket_after_a_parameter_moved_on():
    """[a b], then [a c] (a moves on; [a b] still holds b), then [a b] again: a's state is the one
    it took with it, not the copy left behind in the first bucket's tensor."""
    memory = Memory()
    memory.flat(["a", "b"], [2, 2], "cpu").copy_(torch.tensor([1.0, 1, 2, 2]))
    memory.flat(["a", "c"], [2, 2], "cpu")[:2] += 10                  # a's state moves on and changes
    assert memory.flat(["a", "b"], [2, 2], "cpu").tolist() == [11, 11, 2, 2]
