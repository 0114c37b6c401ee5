"""The interactive testbed, as in Mininet: clusters that outlive the command that built them.

``up`` builds a shaped cluster and returns; ``exec`` runs any program inside one of its nodes
(with the same environment a worker gets, so a user's own torchrun-style script just works);
``ls`` lists clusters and runs; ``down`` removes a cluster exactly as its ledger records it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from . import results
from .launch import state as ledger
from .launch.netns import NetnsCluster
from .launch.nodeenv import node_environment
from .net import calibrate as calibration
from .net import namespaces, topology
from .spec import RunSpec, TopologySpec, UserError


def up(spec: RunSpec) -> ledger.RunState:
    """Build the network of ``spec`` and leave it standing; returns its ledger."""
    NetnsCluster.check_host()
    state = ledger.RunState.create()
    spec = spec.replace(run_id=state.run_id)
    state.update(persistent=True)
    cluster = NetnsCluster(spec, state)
    try:
        nodes = cluster.up()
    except BaseException:
        state.undo()
        raise
    state.update(meta={"spec": spec.to_json(), "latency_impl": cluster.network.impl,
                       "nodes": [{"rank": n.rank, "netns": n.name, "address": n.address} for n in nodes]})
    return state


@contextlib.contextmanager
def scratch(topo: TopologySpec, latency_impl: str = "auto", seed: int = 0) -> Iterator[topology.Network]:
    """A network that exists only for the ``with`` block (ledgered, so a crash stays cleanable)."""
    NetnsCluster.check_host()
    state = ledger.RunState.create()
    try:
        yield topology.build(f"gct-{state.run_id}", state.subnet, topo, latency_impl, seed, state.add)
    finally:
        state.undo()


def node_of(state: ledger.RunState, node: str) -> dict:
    """A node of a cluster by rank (``0``) or namespace name (``gct-<id>-n0``)."""
    nodes = state.meta.get("nodes", [])
    for n in nodes:
        if node in (str(n["rank"]), n["netns"]):
            return n
    raise UserError(f"cluster gct-{state.run_id} has no node '{node}'; its nodes are 0 to {len(nodes) - 1}.")


def namespaces_node(n: dict) -> topology.NodePort:
    """A node of a ledger's meta as the measuring code wants it (netns, address)."""
    return topology.NodePort(rank=n["rank"], netns=n["netns"], address=n["address"], switch_ns="", port="")


def exec_in(name: str, node: str, argv: list[str]) -> None:
    """Replace this process with ``argv`` running inside a node, with the node's environment."""
    if not argv:
        raise UserError("give the command to run after '--', e.g. gctestbed exec NAME 0 -- iperf3 -s.")
    state = ledger.find(name)
    target = node_of(state, node)
    nodes = state.meta["nodes"]
    env = {**os.environ, **node_environment(target["rank"], len(nodes), nodes[0]["address"], target["netns"],
                                            threads=max(1, (os.cpu_count() or 1) // len(nodes)))}
    namespaces.enter(target["netns"])
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        raise UserError(f"command not found: {argv[0]}.") from None


def listing() -> list[dict]:
    """Every cluster and run this host has a ledger for."""
    rows = []
    for st in ledger.load_all():
        nodes = st.meta.get("nodes") or [o for o in st.objects if o["kind"] == "netns" and "-n" in o["name"]]
        rows.append({"name": f"gct-{st.run_id}", "kind": st.meta.get("kind") or ("cluster" if st.persistent else "run"),
                     "alive": st.persistent or st.owner_alive(), "nodes": len(nodes), "subnet": st.subnet,
                     "latency_impl": st.meta.get("latency_impl")})
    return rows


def down(name: str, force: bool = False) -> list[str]:
    """Remove a cluster; a live run's ledger only with ``force``. Returns what could not be removed."""
    state = ledger.find(name)
    if not state.persistent and state.owner_alive() and not force:
        raise UserError(f"gct-{state.run_id} belongs to a run that is still going (pid {state.owner_pid}): "
                        "stop it with Ctrl-C, or use --force.")
    return state.undo()


def calibrate(name: str | None, spec: RunSpec | None, seconds: float, tool: str,
              results_dir: str) -> tuple[str, list[calibration.PathResult]]:
    """Measure every path of cluster ``name``, or of a scratch network built from ``spec`` for the
    measurement; the figures are stored under the cluster's id. Returns (that id, the paths)."""
    if name:
        state = ledger.find(name)
        cluster_id = state.run_id
        topo = RunSpec.from_json(state.meta["spec"]).shaped()
        paths = calibration.calibrate(topo, [namespaces_node(n) for n in state.meta["nodes"]], seconds=seconds, tool=tool)
    else:
        topo = spec.shaped()
        with scratch(topo, spec.latency_impl) as net:
            cluster_id = net.prefix.removeprefix("gct-")
            paths = calibration.calibrate(topo, net.nodes, seconds=seconds, tool=tool)
    recorder = results.Recorder(results_dir, cluster_id)
    for p in paths:
        recorder.calibration(p.to_dict())
    recorder.close()
    return cluster_id, paths
