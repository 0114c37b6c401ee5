"""A sweep on Slurm: one allocation of hosts for the whole sweep, every cell one ``srun`` step
across as many of them as the cell has nodes.

Each host of a step runs ``gctestbed node`` (launch/hosts.py): it shapes its own NIC with the
cell's link, joins the rendezvous on the step's first host, calibrates and trains with the
others, and puts its NIC back however it ends. Each host keeps its own store under the sweep's
results directory (``hosts/<host name>``: SQLite wants a local lock, which a cluster's shared
file system may not give), and rank 0's holds the whole run once every rank has sent it its
rows; the sweep copies that run into its own store, where the cell is marked as any other. The
allocation is the sweep's (``salloc --no-shell``) unless the sweep already runs inside one
(``sbatch``, ``salloc``); one it made is in its ledger, so 'gctestbed clean' cancels it if the
sweep dies. ``srun`` and ``scontrol`` are the only interfaces used: Slurm's own commands, as a
user would type them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from .. import results
from ..session import Session, log_ends, read_text
from ..spec import RunSpec, UserError
from .state import RunState

RDZV_PORT = 29400
RDZV_PORTS = 500     # the ports steps take in turn, from RDZV_PORT
STOP_S = 60          # how long an interrupted step's hosts get to unshape and end


class Allocation:
    """The hosts a sweep runs on: their names, in Slurm's order, and the address of each."""

    def __init__(self, job_id: str, hosts: list[str], addresses: dict[str, str]):
        self.job_id, self.hosts, self.addresses = job_id, hosts, addresses

    @classmethod
    def obtain(cls, nodes: int, partition: str | None, state: RunState) -> "Allocation":
        """The allocation the sweep runs in, or a new one of ``nodes`` hosts (recorded in ``state``)."""
        job = os.environ.get("SLURM_JOB_ID")
        if job is None:
            argv = ["salloc", "--no-shell", "--nodes", str(nodes), "--ntasks-per-node", "1", "--job-name", "gctestbed-sweep",
                    *(["--partition", partition] if partition else [])]
            out = _slurm(argv, timeout_s=600)
            found = re.search(r"Granted job allocation (\d+)", out)
            if not found:
                raise UserError(f"salloc gave no allocation: {out.strip()[-300:]}")
            job = found.group(1)
            state.add("slurm-job", name=job)
        listing = _slurm(["scontrol", "show", "job", job, "--oneliner"])
        nodelist = re.search(r"\bNodeList=(\S+)", listing)
        if not nodelist or nodelist.group(1) in ("(null)", ""):
            raise UserError(f"Slurm job {job} has no nodes: {listing.strip()[-300:]}")
        hosts = _slurm(["scontrol", "show", "hostnames", nodelist.group(1)]).split()
        if len(hosts) < nodes:
            raise UserError(f"the sweep needs {nodes} hosts and Slurm job {job} has {len(hosts)}: allocate more with "
                            "--nodes, or give the sweep fewer.")
        addresses = {}
        for host in hosts:
            addr = re.search(r"\bNodeAddr=(\S+)", _slurm(["scontrol", "show", "node", host, "--oneliner"]))
            addresses[host] = addr.group(1) if addr else host
        return cls(job, hosts, addresses)


def rdzv_port(base: str) -> int:
    """The next rendezvous port of the steps run for results directory ``base``: the one after the
    last step's, kept in ``runs/slurm-rdzv-port`` so that a resumed sweep never takes again the port
    of a step it interrupted (whose rendezvous store may still hold it, or its connections linger)."""
    path = os.path.join(base, "runs", "slurm-rdzv-port")
    try:
        last = int(read_text(path).strip())
        port = RDZV_PORT + (last - RDZV_PORT + 1) % RDZV_PORTS
    except (OSError, ValueError):
        port = RDZV_PORT
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(f"{port}\n")
    os.replace(path + ".tmp", path)
    return port


def run_cell(spec: RunSpec, node_args: list[str], alloc: Allocation, dev: str) -> results.RunSummary:
    """Run one cell (``spec``, resolved: its run id set) as a step on the first ``spec.world``
    hosts of ``alloc``; ``node_args``: the cell's flags for 'gctestbed node'. The run lands in
    ``spec.results_dir``'s store, and a step that left no run there is stored as a failed run."""
    hosts = alloc.hosts[:spec.world]
    base = os.path.abspath(spec.results_dir)
    rdzv = f"{alloc.addresses[hosts[0]]}:{rdzv_port(base)}"     # a fresh port per step, resumed sweeps' included
    log = os.path.join(base, "runs", f"slurm-{spec.run_id}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    argv = ["srun", "--jobid", alloc.job_id, "--nodes", str(len(hosts)), "--ntasks", str(len(hosts)),
            "--ntasks-per-node", "1", "--nodelist", ",".join(hosts), "--kill-on-bad-exit=1",
            sys.executable, "-m", "gctestbed.cli", "node", "--rdzv", rdzv, "--nnodes", str(spec.nodes), "--dev", dev,
            "--run-id", spec.run_id, "--results", os.path.join(base, "hosts", "{host}"), *node_args]
    with open(log, "ab") as out:
        # a session of its own: a Ctrl-C meant for the sweep must not reach srun, whose answer to
        # it (and to SIGTERM) is to kill the step outright, before the hosts can put their NICs back
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            code = proc.wait()
        except BaseException:
            # SIGTERM to the step's tasks (not the job): every host's node unshapes and ends, then srun
            subprocess.run(["scancel", "--signal=TERM", alloc.job_id], capture_output=True, timeout=30)
            try:
                proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    conn = results.connect(spec.results_dir)
    try:
        if not _gather(base, hosts, conn, spec.run_id):
            session = Session(spec)
            session.start("hosts", {})
            session.finish("failed", f"srun exited with {code} before any host stored the run; "
                                     f"{log_ends(log, name='output', last=3)}", None)   # srun's own last line restates the code
            session.close()
        return results.summarize(conn, results.find_run(conn, spec.run_id))
    finally:
        conn.close()


def _gather(base: str, hosts: list[str], dst, run_id: str) -> bool:
    """Copy the run from the hosts' stores into ``dst``: rank 0's first (it holds every rank's
    rows once they were sent, and the run's outcome as rank 0 saw it), then what the others hold
    that it lacks (a run that failed before the rows were sent). False if no host stored it."""
    found = []
    for host in hosts:
        directory = os.path.join(base, "hosts", host)
        if not os.path.exists(results.db_path(directory)):
            continue
        src = results.connect(directory, create=False)
        ranks = results.ranks_of(src, run_id)
        found.append((0 in ranks, len(ranks), src))
    try:
        return any([results.copy_run(src, dst, run_id) for _, _, src in sorted(found, key=lambda f: f[:2], reverse=True)])
    finally:
        for _, _, src in found:
            src.close()


def _slurm(argv: list[str], timeout_s: float = 60) -> str:
    """A Slurm command's output (stdout and stderr: salloc speaks on stderr); one sentence on failure."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise UserError(f"--launcher slurm needs Slurm's '{argv[0]}' on PATH (Debian: slurm-client).") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"'{' '.join(argv)}' did not answer in {timeout_s:.0f} s: is slurmctld up?") from None
    if proc.returncode != 0:
        raise UserError(f"'{' '.join(argv)}' failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc.stdout + proc.stderr
