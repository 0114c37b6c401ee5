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
    """Refuse NCCL where it could bypass the shaped link: nodes sharing a GPU (one process per
    device is NCCL's rule, and peers on one device or host talk through memory, not sockets)."""
    if gpus < nodes_per_host:
        raise UserError(f"--backend nccl with {nodes_per_host} nodes on this host needs a GPU per node, and torch sees "
                        f"{gpus}: nodes sharing a GPU would reach each other around the shaped link. Use --backend "
                        "gloo with --device cuda (Gloo sends CUDA tensors through the shaped sockets), or fewer nodes.")
