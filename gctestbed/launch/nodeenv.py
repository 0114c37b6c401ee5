"""The environment one node's worker starts with, the same for every launcher.

It is torchrun's contract (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK) plus what
keeps collectives on the shaped interface: Gloo and NCCL are pinned to it, and NCCL gets a
host id of its own per node and socket transport with P2P, SHM and IB off, so two nodes on one
machine cannot talk through shared memory and around the shaper.
"""

from __future__ import annotations

from ..spec import UserError

MASTER_PORT = 29500


def node_environment(rank: int, world_size: int, master_addr: str, host_id: str, threads: int,
                     ifname: str = "eth0", master_port: int = MASTER_PORT) -> dict[str, str]:
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GLOO_SOCKET_IFNAME": ifname,
        "NCCL_SOCKET_IFNAME": ifname,
        "NCCL_HOSTID": host_id,
        "NCCL_NET": "Socket",
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_IB_DISABLE": "1",
        "OMP_NUM_THREADS": str(threads),
        "GCTESTBED_NODE": host_id,
        "GCTESTBED_IFNAME": ifname,
    }


def check_nccl(nodes_per_host: int, gpus: int) -> None:
    """Refuse NCCL where it cannot run: a host without a GPU. Nodes may share a GPU: each has its
    own NCCL_HOSTID, so NCCL takes them for separate hosts (it refuses two ranks only when both the
    host hash, which NCCL_HOSTID sets, and the GPU's bus id match), and with P2P, SHM and IB off it
    can only reach the others through its socket transport on the node's shaped interface (two
    nodes on one H200: docs/clusters.md)."""
    if gpus < 1:
        raise UserError(f"--backend nccl needs a GPU, and torch sees none on this host for its {nodes_per_host} "
                        "node(s); use --backend gloo (--device cpu), or run where torch sees a GPU.")
