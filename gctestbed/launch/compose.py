"""docker-compose files for clusters of gctestbed nodes: one service per node, one GPU each.

Every node runs ``gctestbed node``, which shapes its own eth0 (NET_ADMIN, nothing more), joins
torchrun's c10d rendezvous at node0 and runs the worker, so the compose file and real hosts share
one path. NCCL is kept on the shaped interface: sockets only (NCCL_NET=Socket, IB, P2P and SHM
off) and a distinct NCCL_HOSTID per node, so two containers on one machine cannot talk through
shared memory or NVLink around the shaper. BW, LATENCY, COMPRESSOR, WORKLOAD, STEPS and NODES come
from the environment. Two profiles: ``gpu`` (NCCL, one GPU per node) and ``cpu`` (Gloo). The
services run the ``gctestbed-node`` image that ``gctestbed image build [--gpu]`` makes, so the file
works from any directory, not only a source tree.
"""

from __future__ import annotations

from typing import Any

RDZV_PORT = 29400
SHM_SIZE = "2gb"


def _command(rank: int, nodes: int, gpu: bool) -> list[str]:
    return ["gctestbed", "node", "--rdzv", f"node0:{RDZV_PORT}", "--nnodes", "${NODES:-%d}" % nodes,
            "--dev", "eth0", "--bw", "${BW:-1gbit}", "--latency", "${LATENCY:-0}",
            "--compressor", "${COMPRESSOR:-none}", "--workload", "${WORKLOAD:-mlp}", "--steps", "${STEPS:-20}",
            "--backend", "nccl" if gpu else "gloo", "--device", "cuda" if gpu else "cpu", "--results", "/results"]


def _service(rank: int, nodes: int, gpu: bool, gpu_id: str | None) -> dict[str, Any]:
    env = {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_NET": "Socket", "NCCL_IB_DISABLE": "1",
           "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_HOSTID": f"gctestbed-node{rank}"}
    service: dict[str, Any] = {
        "image": f"gctestbed-node:{'gpu' if gpu else 'cpu'}",
        "profiles": ["gpu" if gpu else "cpu"],
        "hostname": f"node{rank}",
        "cap_add": ["NET_ADMIN"],
        "shm_size": SHM_SIZE,
        "environment": env,
        "volumes": ["./results:/results"],
        "networks": {"gctestbed": {"aliases": [f"node{rank}"]}},
        "command": _command(rank, nodes, gpu),
    }
    if gpu:
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "device_ids": [gpu_id], "capabilities": ["gpu"]}]}}}
    return service


def compose(nodes: int, gpus: list[str] | None = None) -> dict[str, Any]:
    """A compose file for ``nodes`` nodes: ``gpu`` profile services node0.. (GPU ``gpus[i]`` each)
    and ``cpu`` profile services cpu-node0..; ``docker compose --profile gpu up``."""
    if nodes < 1:
        raise ValueError("nodes must be at least 1")
    gpus = gpus or [str(i) for i in range(nodes)]
    if len(gpus) < nodes:
        raise ValueError(f"{nodes} nodes need {nodes} GPUs, one each; --gpus names {len(gpus)}")
    if len(set(gpus[:nodes])) < nodes:
        raise ValueError("compose gives each node a GPU of its own (containers sharing one have not been run): name "
                         "a GPU per node, or use the cpu profile (Gloo, on CPU tensors)")
    services = {}
    for rank in range(nodes):
        services[f"node{rank}"] = _service(rank, nodes, True, gpus[rank])
    for rank in range(nodes):
        cpu = _service(rank, nodes, False, None)
        services[f"cpu-node{rank}"] = cpu
    return {"services": services,
            "networks": {"gctestbed": {"driver": "bridge", "ipam": {"config": [{"subnet": "198.18.250.0/24"}]}}}}
