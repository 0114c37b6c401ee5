"""A collective that fails (timed out, connection lost) fails the bucket and the step: the hook
never decodes a payload that was not summed. Before issue 8 the overlap path ignored the
all-reduce's result, and nodes whose link was gone trained on apart, with no traffic."""

from __future__ import annotations

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gctestbed import compress
from gctestbed.compress import collectives, hook
from gctestbed.worker import exchange_failed


def _failing_allreduce(tensors, group=None):
    done = torch.futures.Future()
    done.set_exception(RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv "
                                    "operation to complete"))
    return done


@pytest.mark.parametrize("name, serial", [("none", False), ("fp16", False), ("powersgd", False), ("none", True)])
def test_a_failed_all_reduce_fails_the_step(single_rank_group, monkeypatch, name, serial):
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)),
                gradient_as_bucket_view=serial)
    state = hook.install(model, compress.create(name, {}), serial=serial)
    state.dense_floor = 0
    monkeypatch.setattr(collectives, "allreduce", _failing_allreduce)
    with pytest.raises(RuntimeError) as caught:
        model(torch.randn(8, 64)).square().sum().backward()
        state.exchange_pending()
    failure = state.failure if state.failure is not None else caught.value
    line = exchange_failed(failure, 0, 3)
    assert line == ("gctestbed: rank 0 step 3: the gradient exchange failed: Timed out waiting 5000ms for recv "
                    "operation to complete"), line
