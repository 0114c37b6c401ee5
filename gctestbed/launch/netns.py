"""The embedded default launcher: every node is a network namespace on this host.

Needs root and nothing else: no images, no daemons. The network is the run's topology (a star
unless a topology file says otherwise), built by net/topology.py through launch.network. Given a
fork server (launch/forkserver.py), gctestbed's worker is forked from it into each node; any other
program (a user's) starts as a process of its own.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess

from ..net import namespaces
from ..spec import RunSpec, UserError
from . import cpushare
from .forkserver import Server
from .network import Shaped
from .protocol import Node
from .state import RunState

__all__ = ["NetnsCluster", "Node"]


def forks_workers(command: list | tuple, device: str) -> bool:
    """Whether a run's nodes are forked from a fork server (NetnsCluster's, or a kept network's):
    gctestbed's own worker on CPU. A user's program starts interpreters of its own, and so does a
    CUDA worker: the server's torch.cuda check (on loading the native kernels) would leave CUDA
    unusable in its forks, and forked CUDA workers have never run on a GPU."""
    return not command and device == "cpu"


class NetnsCluster:
    """N namespace nodes joined by shaped links; everything created goes through the ledger."""

    launcher = "netns"

    def __init__(self, spec: RunSpec, state: RunState, server: Server | None = None):
        self.spec, self.state, self.server = spec, state, server
        self.shaped = Shaped(spec, state)
        self.cgroups: dict[int, str] = {}        # rank -> its cgroup, with --cpus-per-node

    @property
    def network(self):
        return self.shaped.network

    @staticmethod
    def check_host() -> None:
        if os.geteuid() != 0:
            raise UserError("the netns launcher needs root to create namespaces and qdiscs: rerun with sudo.")

    def up(self) -> list[Node]:
        self.check_host()
        nodes = self.shaped.build()
        if self.spec.cpus_per_node:
            for node in nodes:
                path = cpushare.path_of(node.name)
                self.state.add("cgroup", name=path)
                self.cgroups[node.rank] = cpushare.create(path, self.spec.cpus_per_node)
        return nodes

    def calibrate(self):
        if self.server is not None:   # its imports done: they would take the cores the probes measure with
            self.server.ready()
        return self.shaped.calibrate()

    def fault(self, rank: int, kind: str, active: bool, pct: float = 0.0) -> None:
        self.shaped.fault(rank, kind, active, pct)

    def describe(self) -> dict:
        return {**self.shaped.describe(), "workers": "forked" if self.server is not None else "interpreters"}

    def final_counters(self) -> dict:
        shares = {str(rank): cpushare.stats(path) for rank, path in self.cgroups.items()}
        return {**self.shaped.final_counters(), **({"cpu_shares": shares} if shares else {})}

    def spawn(self, node: Node, argv: list[str], log_path: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``argv`` inside the node's namespace with the node environment: forked by the
        fork server where there is one (then ``argv`` must be our worker's)."""
        if self.server is not None:
            return self.fork(self.server, self.state, node, argv, log_path, extra_env, self.spec.kernels == "native")
        env = {**os.environ, **(extra_env or {}), **self.shaped.node_env(node)}
        group = self.cgroups.get(node.rank)
        with open(log_path, "ab") as log:
            proc = namespaces.popen(node.name, argv, then=group and functools.partial(cpushare.join, group), env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.state.add("process", name=node.name, pid=proc.pid)
        return proc

    def fork(self, server: Server, state: RunState, node: Node, argv: list[str], log_path: str,
             extra_env: dict[str, str] | None, kernels: bool):
        """Our worker forked by ``server`` into the node's namespace and CPU share, with the node
        environment, and recorded in ``state`` (this network's ledger, or a kept network's cell's)."""
        env = {**os.environ, **(extra_env or {}), **self.shaped.node_env(node)}
        proc = server.fork(argv, env, log_path, node.name, self.cgroups.get(node.rank), kernels=kernels)
        state.add("process", name=node.name, pid=proc.pid)
        return proc

    @staticmethod
    def kill(proc) -> None:
        """SIGKILL a worker and everything it started (its own process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def down(self) -> list[str]:
        return self.state.undo()
