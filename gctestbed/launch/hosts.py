"""The hosts launcher: ``gctestbed node`` on each real machine (or compose container).

Each host shapes its own NIC (net/nic.py: saving and restoring what was there), joins torchrun's
c10d rendezvous and runs the same worker as every launcher, with Gloo and NCCL pinned to that
NIC. Every host keeps its own store; at the end each worker sends its rows to rank 0, whose store
then holds the whole run. The NIC is unshaped when the node ends, however it ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys

import psutil

from .. import results
from ..net import nic
from ..spec import Direction, RunSpec
from .nodeenv import node_environment
from .state import state_dir


def default_run_id(rdzv: str) -> str:
    """The same on every host of one job (repeated jobs pass --run-id, e.g. $SLURM_JOB_ID)."""
    return "h" + hashlib.sha256(rdzv.encode()).hexdigest()[:5]


def _address(ifname: str) -> str | None:
    return next((a.address for a in psutil.net_if_addrs().get(ifname, []) if a.family == socket.AF_INET), None)


def hosts_rendezvous(rdzv: str) -> bool:
    """Whether the rendezvous address is one of this host's: that node runs the c10d store
    (torchrun's own test compares host names only, which misses an address on a second NIC)."""
    host = rdzv.rsplit(":", 1)[0]
    try:
        wanted = {ai[4][0] for ai in socket.getaddrinfo(host, None, socket.AF_INET)}
    except socket.gaierror:
        return False
    mine = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}
    return bool(wanted & mine)


def run_node(spec: RunSpec, rdzv: str, nnodes: int, dev: str | None, shape: bool, force: bool) -> int:
    """Shape ``dev`` (if asked), run the worker under torchrun, unshape; returns torchrun's status."""
    run_dir = os.path.join(os.path.abspath(spec.results_dir), "runs", spec.run_id)
    os.makedirs(run_dir, exist_ok=True)
    spec_path = os.path.join(run_dir, "spec.json")
    with open(spec_path, "w") as f:
        f.write(spec.to_json())
    recorder = results.Recorder(spec.results_dir, spec.run_id)
    with contextlib.suppress(sqlite3.IntegrityError):      # another host sharing this store made it first
        recorder.start_run(spec, {"launcher": "hosts", "rdzv": rdzv, "dev": dev})
    ifname = dev or "eth0"
    env = {**os.environ, **{k: v for k, v in node_environment(0, nnodes, "", os.uname().nodename, os.cpu_count() or 1,
                                                              ifname).items()
                            if k.startswith(("NCCL_", "GLOO_", "GCTESTBED_"))},
           "GCTESTBED_GATHER": "1", "GCTESTBED_CUDA_DEVICE": "0"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv, "--rdzv-id", spec.run_id, "--max-restarts", "0",
            "--rdzv-conf", f"is_host={str(hosts_rendezvous(rdzv)).lower()}",
            *(["--local-addr", _address(ifname)] if _address(ifname) else []),   # not the host name: it may
            "-m", "gctestbed.worker", spec_path]                                  # resolve off the shaped NIC
    shaped = False
    status = 1
    try:
        if shape and dev:
            link = spec.link
            nic.shape(dev, Direction(link.bw_bps, link.latency_s, link.jitter_s, link.loss_pct), state_dir(), force)
            shaped = True
        with open(os.path.join(run_dir, f"node-{os.uname().nodename}-{_address(ifname) or os.getpid()}.log"), "ab") as log:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                status = proc.wait()
            except KeyboardInterrupt:
                os.killpg(proc.pid, signal.SIGTERM)
                status = proc.wait()
                raise
    finally:
        if shaped:
            nic.unshape(dev, state_dir())
        recorder.finish_run("ok" if status == 0 else "failed",
                            None if status == 0 else f"torchrun on {os.uname().nodename} exited with {status}")
        recorder.close()
    return status
