"""The embedded default launcher: every node is a network namespace on this host.

Needs root and nothing else: no images, no daemons. The network is the run's topology (a star
unless a topology file says otherwise), built by net/topology.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass

from ..net import faults, namespaces, topology
from ..spec import RunSpec, UserError
from .nodeenv import node_environment
from .state import RunState


@dataclass
class Node:
    rank: int
    name: str
    address: str


class NetnsCluster:
    """N namespace nodes joined by shaped links; everything created goes through the ledger."""

    launcher = "netns"

    def __init__(self, spec: RunSpec, state: RunState):
        self.spec, self.state = spec, state
        self.network: topology.Network | None = None

    @staticmethod
    def check_host() -> None:
        """Refuse early, before anything is created, when this host cannot run the launcher."""
        if os.geteuid() != 0:
            raise UserError("the netns launcher needs root to create namespaces and qdiscs: rerun with sudo.")

    def up(self) -> list[Node]:
        self.check_host()
        return self._build_network()

    def _build_network(self, adopt: dict[int, int] | None = None) -> list[Node]:
        """The run's topology, shaped; ``adopt``: ranks whose namespace is an existing process's."""
        lossy = frozenset(f.node for f in self.spec.faults if f.kind == "loss")
        self.network = topology.build(f"gct-{self.state.run_id}", self.state.subnet, self.spec.network(),
                                      self.spec.latency_impl, self.spec.seed, self.state.add, adopt=adopt, lossy=lossy)
        return [Node(rank=p.rank, name=p.netns, address=p.address) for p in self.network.nodes]

    def fault(self, rank: int, kind: str, active: bool, pct: float = 0.0) -> None:
        """Start (``active``) or end a fault on node ``rank``'s cable; see net/faults.py."""
        faults.apply(self.network, rank, kind, active, pct)

    def describe(self) -> dict:
        """How delay is made and the qdisc configuration actually in the kernel, with counters."""
        if self.network is None:
            return {}
        return {"latency_impl": self.network.impl, "tcp_buffer_max_bytes": self.network.tcp_buffers,
                "qdiscs": self.network.describe()}

    def final_counters(self) -> dict:
        """describe() plus the delay lines' own counters; stops the delay lines."""
        if self.network is None:
            return {}
        return {**self.describe(), "delay_lines": self.network.stop_relays()}

    def node_env(self, node: Node) -> dict[str, str]:
        """What every launcher gives a node's worker: torchrun's variables, the CPU share, the pins."""
        threads = max(1, (os.cpu_count() or 1) // self.spec.nodes)
        return node_environment(node.rank, self.spec.nodes, self.network.nodes[0].address, node.name, threads)

    def spawn(self, node: Node, argv: list[str], log_path: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``argv`` inside the node's namespace with the node environment."""
        env = {**os.environ, **(extra_env or {}), **self.node_env(node)}
        with open(log_path, "ab") as log:
            proc = namespaces.popen(node.name, argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.state.add("process", name=node.name, pid=proc.pid)
        return proc

    @staticmethod
    def kill(proc) -> None:
        """SIGKILL a worker and everything it started (its own process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def down(self) -> list[str]:
        return self.state.undo()

