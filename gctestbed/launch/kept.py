"""A sweep's kept network: the namespaces, shaped links and CPU shares of one cell, lent to every
following cell that fits them, and one fork server for every node of every cell, so a cell pays
for its own steps and calibration and not for building a network and starting interpreters.

A cell fits when only its links differ (rates, delays: re-shaped in place) or nothing does. A
cell with another node count, topology or CPU cap, or a change between some delay and none,
replaces the kept network with one of its own; cells with faults, on docker, on CUDA or running a user's
program cannot use one at all and build theirs as a lone run does. Each cell is still a run of
its own in the store, with its own ledger for its workers, which are forked fresh by the fork
server (launch/forkserver.py) into their nodes' namespaces and share nothing with the cells
before them but imported code. The kept network and the fork server have ledgers of their own,
owned by the sweep, so 'gctestbed clean' removes them if the sweep dies; a fork server that ended
during a cell (that cell failed, saying so) is replaced at the next. Counters the kernel and
the delay line keep (qdiscs, throttling) run on across cells: what a cell records of them, at its
start and at its end, is the difference over its own run (zero at its start). The delay line's
generators restart from the cell's seed when it is re-shaped, so a cell draws the delays a network
of its own would, whatever ran before it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from pyroute2.netlink.exceptions import NetlinkError

from ..net import delayline, topology
from ..spec import RunSpec
from . import cpushare, forkserver, netns
from .netns import NetnsCluster
from .protocol import Node
from .state import RunState

# the counters among what launchers report at the end of a run; every other number is a setting
COUNTERS = frozenset({"sent_bytes", "sent_packets", "drops", "overlimits", "frames_in", "bytes_in", "frames_out",
                      "bytes_out", "lost", "overflow", "periods", "throttled_periods", "throttled_s"})


class KeptNetwork:
    """What consecutive cells share, built by the first that needs it, until ``close``: a network
    (rebuilt when a cell does not fit it) and the fork server (kept across rebuilds)."""

    def __init__(self):
        self.cluster: NetnsCluster | None = None
        self.nodes: list[Node] = []
        self.cells = 0                          # cells the network served since it was built
        self.server: forkserver.Server | None = None    # under a ledger of its own, kept across rebuilds

    @staticmethod
    def takes(spec: RunSpec) -> bool:
        """Whether a cell of ``spec`` can run on a kept network at all: namespace nodes without
        faults, whose workers the kept fork server can fork."""
        return spec.launcher == "netns" and not spec.faults and netns.forks_workers(spec.command, spec.device)

    def fits(self, spec: RunSpec) -> bool:
        """Whether the network built now serves ``spec`` once re-shaped."""
        old = self.cluster and self.cluster.spec          # the cell it was built or last re-shaped for
        return old is not None and self.takes(spec) and \
            (old.world, old.nodes, old.cpus_per_node, old.latency_impl, old.seed) == \
            (spec.world, spec.nodes, spec.cpus_per_node, spec.latency_impl, spec.seed) and \
            topology.fits(self.cluster.network, spec.shaped(), spec.latency_impl)

    def lend(self, spec: RunSpec, state: RunState) -> "Lent":
        """The launcher of one cell (``state``: the cell's own ledger) on this network."""
        return Lent(self, spec, state)

    def prepare(self, spec: RunSpec) -> list[Node]:
        """The nodes, with the links of ``spec``: re-shaped when it fits, else built anew."""
        self.live_server()                      # first: it imports while the network is built
        reshaped = False
        if self.fits(spec):
            try:
                topology.reshape(self.cluster.network, spec.shaped(), spec.seed)
                self.cluster.spec = self.cluster.shaped.spec = spec
                reshaped = True
            except (OSError, RuntimeError, NetlinkError):   # the cell before broke it (a dead delay line): build anew
                pass
        if not reshaped:
            problems = self._remove_network()
            if problems:
                raise RuntimeError("the network of the cells before could not be removed: " + "; ".join(problems))
            self.cluster = NetnsCluster(spec, RunState.create())
            self.cluster.state.update(meta={"kind": "kept network"})     # as 'gctestbed ls' shows it
            self.nodes = self.cluster.up()
            self.cells = 0
        self.cells += 1
        return self.nodes

    def live_server(self) -> forkserver.Server:
        """The fork server, started if there is none or if it ended (killed during a cell before,
        which failed saying so, or since this cell's network was built): the next forks get a new one."""
        if self.server is not None and self.server.ended():
            problems = self.server.state.undo()
            self.server = None
            if problems:
                raise RuntimeError("the ended fork server of the cells before could not be removed: " + "; ".join(problems))
        if self.server is None:
            state = RunState.create()
            try:
                state.update(meta={"kind": "fork server"})
                self.server = forkserver.Server(state)
            except BaseException:
                state.undo()
                raise
        return self.server

    def counters(self) -> dict:
        """Everything that counts so far: qdiscs, the delay line, CPU shares."""
        net = self.cluster.network
        return {"qdiscs": net.describe(), "delay_lines": delayline.counters(net.relay) if net.relay else {},
                "cpu_shares": {str(r): cpushare.stats(p) for r, p in self.cluster.cgroups.items()}}

    def close(self) -> list[str]:
        """Remove the network, the fork server and the CPU shares; what could not be removed."""
        problems = self._remove_network()
        if self.server is not None:
            problems += self.server.state.undo()
            self.server = None
        return problems

    def _remove_network(self) -> list[str]:
        if self.cluster is None:
            return []
        problems = self.cluster.down()
        self.cluster, self.nodes = None, []
        return problems


@contextlib.contextmanager
def kept_for(what: str) -> Iterator[KeptNetwork]:
    """A kept network for the consecutive runs of one command (``what``: its name, for the error),
    closed when they end; what it could not remove is an error where the runs raised none, and a
    note on the error where they did."""
    kept = KeptNetwork()
    try:
        yield kept
    except BaseException as e:
        if problems := kept.close():
            e.add_note(f"{what} could not remove its last network either (run 'gctestbed clean'): " + "; ".join(problems))
        raise
    if problems := kept.close():
        raise RuntimeError(f"{what} could not remove its last network (run 'gctestbed clean'): " + "; ".join(problems))


class Lent:
    """One cell's launcher on a kept network (launch.protocol.Launcher): its workers, forked by the
    fork server, are all this cell owns and removes."""

    launcher = "netns"
    check_host = staticmethod(NetnsCluster.check_host)
    kill = staticmethod(NetnsCluster.kill)

    def __init__(self, kept: KeptNetwork, spec: RunSpec, state: RunState):
        self.kept, self.spec, self.state = kept, spec, state
        self._before: dict = {}
        self._server: forkserver.Server | None = None       # the one this cell's nodes are forked from

    def up(self) -> list[Node]:
        nodes = self.kept.prepare(self.spec)
        self._before = self.kept.counters()
        return nodes

    def calibrate(self):
        self.kept.live_server().ready()      # its imports done: they would take the cores the probes measure with
        return self.kept.cluster.calibrate()

    def fault(self, rank: int, kind: str, active: bool, pct: float = 0.0) -> None:
        raise RuntimeError("a kept network takes no faults (KeptNetwork.takes)")

    def describe(self, qdiscs: dict | None = None) -> dict:
        """The network's description with the qdiscs as the cell found them, their counters the
        cell's own (zero: not the counts of the cells before it), or ``qdiscs``."""
        if qdiscs is None:
            qdiscs = _since(self._before["qdiscs"], self._before["qdiscs"])
        return {**self.kept.cluster.shaped.describe(qdiscs), "workers": "forked",
                "kept_network": {"ledger": self.kept.cluster.state.run_id, "cell": self.kept.cells}}

    def final_counters(self) -> dict:
        """As a network of its own would report them: this cell's counts only."""
        since = _since(self._before, self.kept.counters())
        return {**self.describe(since["qdiscs"]), "delay_lines": since["delay_lines"],
                **({"cpu_shares": since["cpu_shares"]} if since["cpu_shares"] else {})}

    def spawn(self, node: Node, argv: list[str], log_path: str, extra_env: dict[str, str] | None = None):
        """Fork our worker (``python -m gctestbed.worker SPEC``) into the node's namespace and CPU
        share, as this cell's (its kernels resolved: this process has them). Every node of a cell
        from one server: one that ended after forking some of them is not replaced mid-cell (its
        log, which the cell's error quotes, would go with it); the first node it can no longer fork
        is never started (forkserver.ServerLost), the cell fails naming that node, and the next
        cell's server is new."""
        if self._server is None:
            self._server = self.kept.live_server()
        return self.kept.cluster.fork(self._server, self.state, node, argv, log_path, extra_env,
                                      self.spec.kernels == "native")

    def down(self) -> list[str]:
        return self.state.undo()


def _since(before, after):
    """``after`` with each counter (COUNTERS) less its value in ``before``."""
    if isinstance(after, dict):
        return {k: (v - before[k] if k in COUNTERS and isinstance(before, dict) and isinstance(before.get(k), (int, float))
                    else _since(before.get(k) if isinstance(before, dict) else None, v)) for k, v in after.items()}
    if isinstance(after, list):
        old = before if isinstance(before, list) else []
        by_id = {_entry_id(e): e for e in old if _entry_id(e) is not None}
        return [_since(by_id.get(_entry_id(v)) if _entry_id(v) is not None else (old[i] if i < len(old) else None), v)
                for i, v in enumerate(after)]
    return after


def _entry_id(entry):
    """What names a qdisc or class among its egress's (the kernel's listing order is not a promise)."""
    if isinstance(entry, dict) and ("classid" in entry or "handle" in entry):
        return entry.get("classid") or entry.get("handle")
    return None
