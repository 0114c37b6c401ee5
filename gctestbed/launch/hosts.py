"""The hosts launcher: ``gctestbed node`` on each real machine (or compose container).

Each host shapes its own NIC (net/nic.py: saving and restoring what was there), joins torchrun's
c10d rendezvous and runs the same worker as every launcher, with Gloo and NCCL pinned to that
NIC. Every host keeps its own store; at the end each worker sends its rows to rank 0, whose store
then holds the whole run. The NIC is unshaped when the node ends, however it ends.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys

import psutil

from ..net import calibrate, nic
from ..session import Session, resolve
from ..spec import Direction, RunSpec
from ..timing import Laps
from .nodeenv import node_environment
from .state import state_dir


def default_run_id(rdzv: str) -> str:
    """The same on every host of one job (repeated jobs pass --run-id, e.g. $SLURM_JOB_ID)."""
    return "h" + hashlib.sha256(rdzv.encode()).hexdigest()[:5]


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


def _torchrun(spec: RunSpec, rdzv: str, ifname: str, module: str, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(spec.world), "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv, "--rdzv-id", spec.run_id, "--max-restarts", "0",
            "--rdzv-conf", f"is_host={str(hosts_rendezvous(rdzv)).lower()}",
            *(["--local-addr", nic.address(ifname)] if nic.address(ifname) else []),   # not the host name: it may
            "-m", module, *args]                                                  # resolve off the shaped NIC


def _wait(argv: list[str], env: dict, log: str) -> int:
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise


def run_node(spec: RunSpec, rdzv: str, dev: str | None, shape: bool, force: bool) -> tuple[int, str | None]:
    """Shape ``dev`` (if asked), calibrate the hosts' paths (when shaped) and run the worker in one
    torchrun job, unshape; returns the exit status (torchrun's: hostcal.MISSED when calibration
    stopped the run) and what went wrong, as stored with the run.
    The run's records are a Session's, as for every launcher; hosts sharing one store start the
    run once."""
    ifname = dev or "eth0"
    spec = resolve(spec, spec.run_id)
    session = Session(spec, shared=True)
    env = {**os.environ, **{k: v for k, v in node_environment(0, spec.world, "", os.uname().nodename,
                                                              os.cpu_count() or 1, ifname).items()
                            if k.startswith(("NCCL_", "GLOO_", "GCTESTBED_"))},
           "GCTESTBED_GATHER": "1", "GCTESTBED_CUDA_DEVICE": "0"}
    me = f"{os.uname().nodename}-{nic.address(ifname) or os.getpid()}"
    shaped = False
    status, error = 1, None
    laps, phases = Laps(), {}      # as a netns run's, but teardown (unshaping) comes after the store is written
    try:
        if shape and dev:
            link = spec.link
            nic.shape(dev, Direction(link.bw_bps, link.latency_s, link.jitter_s, link.loss_pct), state_dir(), force)
            shaped = True
        session.start("hosts", nic.describe(ifname), rdzv=rdzv, dev=dev)
        phases["build_s"] = laps.lap()
        log = session.log_path(f"node-{me}")
        if shaped and spec.calibrate and spec.world > 1:        # one job: calibration, then training
            out = os.path.join(session.run_dir, f"calibration-{me}.json")
            status = _wait(_torchrun(spec, rdzv, ifname, "gctestbed.launch.hostcal",
                                     [session.spec_path, out]), env, log)
            phases["nodes_s"] = laps.lap()
            if os.path.exists(out):
                error = session.calibrate(lambda: calibrate.load(out))
                phases["calibrate_s"] = calibrate.load_seconds(out)
                phases["nodes_s"] -= phases["calibrate_s"]
            elif status != 0:
                error = f"calibrating the hosts' paths failed on {os.uname().nodename} (torchrun exited with {status}; see {log})"
        else:
            status = _wait(_torchrun(spec, rdzv, ifname, "gctestbed.worker", [session.spec_path]), env, log)
            phases["nodes_s"] = laps.lap()
        if error is None and status != 0:
            error = f"torchrun on {os.uname().nodename} exited with {status}"
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        try:
            phases["teardown_s"] = 0.0
            session.finish("ok" if status == 0 and error is None else "failed", error,
                           session.read_counters(lambda: nic.describe(ifname)), phases)         # before unshaping
        finally:
            session.close()
            if shaped:
                nic.unshape(dev, state_dir())
    return status, error
