"""The shaped network of a run whose nodes share this host's kernel (netns, docker): the run's
topology built through the ledger, its faults, its calibration and its description. Launchers
own one; none inherits another."""

from __future__ import annotations

import os

from ..net import calibrate, faults, topology
from ..spec import RunSpec
from .nodeenv import node_environment
from .protocol import Node
from .state import RunState


class Shaped:
    """The network of ``spec``: built once by ``build``, then faulted, measured and described."""

    def __init__(self, spec: RunSpec, state: RunState):
        self.spec, self.state = spec, state
        self.network: topology.Network | None = None

    def build(self, adopt: dict[int, int] | None = None) -> list[Node]:
        """The run's topology, shaped; ``adopt``: ranks whose namespace is an existing process's."""
        lossy = frozenset(f.node for f in self.spec.faults if f.kind == "loss")
        self.network = topology.build(f"gct-{self.state.run_id}", self.state.subnet, self.spec.shaped(),
                                      self.spec.latency_impl, self.spec.seed, self.state.add, adopt=adopt, lossy=lossy)
        return [Node(rank=p.rank, name=p.netns, address=p.address) for p in self.network.nodes]

    def calibrate(self) -> list[calibrate.PathResult]:
        return calibrate.calibrate(self.spec.shaped(), self.network.nodes)

    def fault(self, rank: int, kind: str, active: bool, pct: float = 0.0) -> None:
        faults.apply(self.network, rank, kind, active, pct)

    def describe(self, qdiscs: dict | None = None) -> dict:
        """How delay is made, the TCP buffers, the nodes' GSO packets, each namespace's receive
        steering (topology.keep_flows_in_order), and the qdiscs as the kernel
        reports them now (or ``qdiscs``, read already by the caller)."""
        if self.network is None:
            return {}
        return {"latency_impl": self.network.impl, "tcp_buffer_max_bytes": self.network.tcp_buffers,
                "gso_max_segs": self.network.gso_max_segs,
                "rps_default_mask": self.network.rps_default_mask,
                "tcp_congestion_control": topology.TCP_CONGESTION_CONTROL,
                # a host change the run made: the kernel lets a namespace take only an allowed one
                "tcp_congestion_control_allowed_on_host": self.network.allowed_on_host,
                "qdiscs": self.network.describe() if qdiscs is None else qdiscs}

    def final_counters(self) -> dict:
        if self.network is None:
            return {}
        return {**self.describe(), "delay_lines": self.network.stop_relays()}

    def node_env(self, node: Node) -> dict[str, str]:
        """What every launcher gives a node's worker: torchrun's variables, the CPU share, the pins."""
        threads = max(1, (os.cpu_count() or 1) // self.spec.world)
        return node_environment(node.rank, self.spec.world, self.network.nodes[0].address, node.name, threads)
