"""When faults start and end (FaultPlan, on a fake clock), how --fault is read, and how a fault's
effect is read back from the step records (results.fault_effect)."""

from __future__ import annotations

import pytest

from gctestbed import results
from gctestbed.launch import faultplan
from gctestbed.spec import FaultSpec, LinkSpec, RunSpec, SpecError, parse_fault


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Cluster:
    def __init__(self):
        self.calls = []

    def fault(self, rank, kind, active, pct=0.0):
        self.calls.append((rank, kind, active, pct))


def test_faults_start_and_end_on_time_counted_from_the_first_step(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(faultplan.time, "monotonic", clock)
    cluster, records = Cluster(), []
    plan = faultplan.FaultPlan([parse_fault("link-down:node=1,at=2s,for=1s"), parse_fault("loss:node=0,pct=5,at=2.5s")],
                               cluster, lambda idx, kind, node, pct, **t: records.append((idx, *t)))
    clock.t += 50
    plan.tick(training_started=False)                 # start-up does not count
    assert cluster.calls == []
    plan.tick(training_started=True)                  # origin
    clock.t += 1.9
    plan.tick(True)
    assert cluster.calls == []
    clock.t += 0.2                                    # 2.1 s: the link goes down
    plan.tick(True)
    assert cluster.calls == [(1, "link-down", True, 0.0)]
    assert "while fault link-down on node 1 at 2s for 1s was on" in plan.context()
    clock.t += 0.5                                    # 2.6 s: loss starts
    plan.tick(True)
    clock.t += 0.5                                    # 3.1 s: the link comes back
    plan.tick(True)
    assert cluster.calls[1:] == [(0, "loss", True, 5.0), (1, "link-down", False, 0.0)]
    plan.finish()                                     # the loss lasts to the end of the run
    assert [r[0] for r in records] == [0, 1, 0, 1] and [r[1] for r in records] == ["started", "started", "ended", "ended"]
    assert "after fault" in plan.context()


@pytest.mark.parametrize("text, fault", [
    ("link-down:node=1,at=10s,for=2s", FaultSpec("link-down", 1, 10.0, 2.0)),
    ("loss:node=0,pct=5,at=5s", FaultSpec("loss", 0, 5.0, None, 5.0)),
    ("loss:node=0,pct=0.5%,at=500ms,for=1s", FaultSpec("loss", 0, 0.5, 1.0, 0.5)),
])
def test_fault_flags_parse(text, fault):
    assert parse_fault(text) == fault


def test_a_fault_on_a_node_the_run_lacks_is_refused_and_faults_round_trip_through_json():
    spec = RunSpec(nodes=2, link=LinkSpec(bw_bps=10**9), faults=[parse_fault("link-down:node=2,at=1s,for=1s")])
    with pytest.raises(SpecError, match="not a node of this run"):
        spec.validate()
    spec = spec.replace(faults=[parse_fault("loss:node=1,pct=5,at=1s")])
    assert RunSpec.from_json(spec.to_json()).faults == spec.faults


def test_the_effect_of_a_fault_is_read_from_the_steps():
    spec = RunSpec(nodes=1, link=LinkSpec(bw_bps=10**9), faults=[parse_fault("link-down:node=0,at=1s,for=2s")])
    steps = {i: [{"rank": 0, "step": i, "t": 1000.0 + i, "step_s": 0.5, "tx_bytes": 100}] for i in range(8)}
    steps[4] = [{"rank": 0, "step": 4, "t": 1006.5, "step_s": 3.0, "tx_bytes": 180}]     # ran 1003.5..1006.5
    for i in range(5, 8):
        steps[i][0]["t"] += 3
    fault = {"idx": 0, "kind": "link-down", "node": 0, "pct": 0.0, "started": 1004.0, "ended": 1006.0}
    effect = results.fault_effect(spec, fault, steps)
    assert effect["steps"] == [4] and effect["median_step_s_during"] == 3.0 and effect["median_step_s_outside"] == 0.5
    assert effect["median_tx_bytes_during"] == 180 and effect["median_tx_bytes_outside"] == 100
    assert effect["fault"] == "link-down on node 0 at 1s for 2s"
    never = results.fault_effect(spec, {**fault, "started": None, "ended": None}, steps)
    assert never["steps"] == [] and never["median_step_s_during"] is None
