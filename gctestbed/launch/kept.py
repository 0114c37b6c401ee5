"""A sweep's kept network: the namespaces, shaped links, CPU shares and fork servers of one cell,
lent to every following cell that fits them, so a cell pays for its own steps and calibration
and not for building a network and starting interpreters.

A cell fits when only its links differ (rates, delays: re-shaped in place) or nothing does;
other node counts, topologies, CPU caps, a change between delay and none, faults and users'
programs get a network of their own (the kept one is removed first). Each cell is still a run
of its own in the store, with its own ledger for its workers, which are forked fresh from the
node's fork server (launch/forkserver.py) and share nothing with the cells before them but
imported code. The kept network has a ledger of its own, owned by the sweep, so 'gctestbed
clean' removes it if the sweep dies. Counters the kernel and the delay line keep (qdiscs,
throttling) run on across cells: a cell's are the difference over its own run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from ..net import delayline, namespaces, topology
from ..session import read_text
from ..spec import RunSpec
from . import cpushare, forkserver
from .netns import NetnsCluster
from .protocol import Node
from .state import RunState

# the counters among what launchers report at the end of a run; every other number is a setting
COUNTERS = frozenset({"sent_bytes", "sent_packets", "drops", "overlimits", "frames_in", "bytes_in", "frames_out",
                      "bytes_out", "lost", "overflow", "periods", "throttled_periods", "throttled_s"})


class KeptNetwork:
    """What consecutive cells share, built by the first that needs it, until ``close``."""

    def __init__(self):
        self.cluster: NetnsCluster | None = None
        self.spec: RunSpec | None = None        # the cell it was built or last re-shaped for
        self.nodes: list[Node] = []
        self.sockets: dict[int, str] = {}       # rank -> its fork server's socket
        self.cells = 0                          # cells it served since it was built

    @staticmethod
    def takes(spec: RunSpec) -> bool:
        """Whether a cell of ``spec`` can run on a kept network at all."""
        return spec.launcher == "netns" and not spec.faults and not spec.command

    def fits(self, spec: RunSpec) -> bool:
        """Whether the network built now serves ``spec`` once re-shaped."""
        old = self.spec
        return self.cluster is not None and self.takes(spec) and \
            (old.world, old.nodes, old.cpus_per_node, old.latency_impl, old.seed) == \
            (spec.world, spec.nodes, spec.cpus_per_node, spec.latency_impl, spec.seed) and \
            topology.fits(self.cluster.network, spec.network(), spec.latency_impl)

    def lend(self, spec: RunSpec, state: RunState) -> "Lent":
        """The launcher of one cell (``state``: the cell's own ledger) on this network."""
        return Lent(self, spec, state)

    def prepare(self, spec: RunSpec) -> list[Node]:
        """The nodes, with the links of ``spec``: re-shaped when it fits, else built anew."""
        if self.fits(spec):
            self.cluster.spec = self.cluster.shaped.spec = spec
            topology.reshape(self.cluster.network, spec.network())
        else:
            problems = self.close()
            if problems:
                raise RuntimeError("the network of the cells before could not be removed: " + "; ".join(problems))
            self.cluster = NetnsCluster(spec, RunState.create())
            self.cluster.state.update(meta={"kept_by_sweep": True})
            self.nodes = self.cluster.up()
            self._start_servers()
            self.cells = 0
        self.spec = spec
        self.cells += 1
        return self.nodes

    def counters(self) -> dict:
        """Everything that counts so far: qdiscs, the delay line, CPU shares."""
        net = self.cluster.network
        return {"qdiscs": net.describe(), "delay_lines": delayline.counters(net.relay) if net.relay else {},
                "cpu_shares": {str(r): cpushare.stats(p) for r, p in self.cluster.cgroups.items()}}

    def close(self) -> list[str]:
        """Remove the network, its processes and CPU shares; what could not be removed."""
        if self.cluster is None:
            return []
        problems = self.cluster.down()
        self.cluster, self.spec, self.nodes, self.sockets = None, None, [], {}
        return problems

    def _start_servers(self) -> None:
        """One fork server per node, importing side by side; returns once all are ready."""
        directory = os.path.join(tempfile.gettempdir(), f"gct-{self.cluster.state.run_id}-servers")
        self.cluster.state.add("dir", name=directory)
        os.makedirs(directory, mode=0o700)
        started = {}
        for node in self.nodes:
            sock = os.path.join(directory, f"n{node.rank}.sock")
            log = os.path.join(directory, f"n{node.rank}.log")
            group = self.cluster.cgroups.get(node.rank)
            with open(log, "ab") as out:
                proc = namespaces.popen(node.name, [sys.executable, "-m", "gctestbed.launch.forkserver", sock,
                                                    *([group] if group else [])],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=out,
                                        start_new_session=True, text=True)
            self.cluster.state.add("process", name=f"{node.name} fork server", pid=proc.pid)
            started[node.rank] = (proc, sock, log)
        for rank, (proc, sock, log) in started.items():
            if proc.stdout.readline().strip() != forkserver.READY:
                tail = read_text(log).strip().splitlines()[-1:] or ["no output"]
                raise RuntimeError(f"the fork server of node {rank} did not start: {tail[0]}")
            proc.stdout.close()
            self.sockets[rank] = sock


class Lent:
    """One cell's launcher on a kept network (launch.protocol.Launcher): its workers are forked by
    the nodes' servers and are all this cell owns and removes."""

    launcher = "netns"
    check_host = staticmethod(NetnsCluster.check_host)
    kill = staticmethod(NetnsCluster.kill)

    def __init__(self, kept: KeptNetwork, spec: RunSpec, state: RunState):
        self.kept, self.spec, self.state = kept, spec, state
        self._before: dict = {}

    def up(self) -> list[Node]:
        nodes = self.kept.prepare(self.spec)
        self._before = self.kept.counters()
        return nodes

    def calibrate(self):
        return self.kept.cluster.calibrate()

    def fault(self, rank: int, kind: str, active: bool, pct: float = 0.0) -> None:
        raise RuntimeError("a kept network takes no faults (KeptNetwork.takes)")

    def describe(self) -> dict:
        return {**self.kept.cluster.describe(), "kept_network": {"ledger": self.kept.cluster.state.run_id,
                                                                 "cell": self.kept.cells}}

    def final_counters(self) -> dict:
        """As a network of its own would report them: this cell's counts only."""
        since = _since(self._before, self.kept.counters())
        return {**self.describe(), "qdiscs": since["qdiscs"], "delay_lines": since["delay_lines"],
                **({"cpu_shares": since["cpu_shares"]} if since["cpu_shares"] else {})}

    def spawn(self, node: Node, argv: list[str], log_path: str, extra_env: dict[str, str] | None = None):
        """Fork our worker (``python -m gctestbed.worker SPEC``) from the node's server."""
        if argv[1:3] != ["-m", "gctestbed.worker"]:
            raise ValueError(f"a kept network forks only gctestbed's worker, not {argv}")
        env = {**os.environ, **(extra_env or {}), **self.kept.cluster.shaped.node_env(node)}
        proc = forkserver.Forked(self.kept.sockets[node.rank], argv[3:], env, log_path)
        self.state.add("process", name=node.name, pid=proc.pid)
        return proc

    def down(self) -> list[str]:
        return self.state.undo()


def _since(before, after):
    """``after`` with each counter (COUNTERS) less its value in ``before``."""
    if isinstance(after, dict):
        return {k: (v - before[k] if k in COUNTERS and isinstance(before, dict) and isinstance(before.get(k), (int, float))
                    else _since(before.get(k) if isinstance(before, dict) else None, v)) for k, v in after.items()}
    if isinstance(after, list):
        old = before if isinstance(before, list) else []
        return [_since(old[i] if i < len(old) else None, v) for i, v in enumerate(after)]
    return after
