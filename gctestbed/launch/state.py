"""The ledger of what a run created, written to disk before each thing is created.

A run owns a state file ``<state dir>/<run id>.json`` naming its owner process, its /24 subnet
and every namespace, link, qdisc, process and container it made. Teardown undoes exactly that list, so
``gctestbed clean`` can remove what a dead run left behind and never touches anything else.
Run ids and subnets are handed out under a lock so concurrent runs never collide.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Iterator

import psutil

from ..net import namespaces
from ..spec import UserError
from . import cpushare

BENCHMARK_NET = ipaddress.ip_network("198.18.0.0/15")
SUBNETS = list(BENCHMARK_NET.subnets(new_prefix=24))


def state_dir() -> str:
    """Where ledgers live: tmpfs, so they vanish with the namespaces at reboot."""
    return os.environ.get("GCTESTBED_STATE_DIR", "/run/gctestbed")


@dataclass
class RunState:
    """One run's ledger. ``add`` persists an entry before the caller creates the object."""

    run_id: str
    owner_pid: int
    owner_started: float
    subnet: str
    results_db: str = ""
    persistent: bool = False                 # an interactive cluster: outlives its owner until 'down'
    meta: dict = field(default_factory=dict)  # what 'exec' and 'ls' need: nodes, addresses, topology
    objects: list[dict] = field(default_factory=list)
    path: str = ""

    # -- creation -----------------------------------------------------------------------
    @classmethod
    def create(cls, results_db: str = "") -> "RunState":
        """Allocate a fresh run id and a /24 no live run uses, and write the ledger."""
        directory = state_dir()
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except PermissionError:
            raise UserError(f"cannot create the state directory {directory}: run as root or set GCTESTBED_STATE_DIR.") from None
        with _locked(directory):
            taken = {s.subnet for s in load_all()}
            free = [str(n) for n in SUBNETS if str(n) not in taken]
            if not free:
                raise UserError(f"all {len(SUBNETS)} subnets of {BENCHMARK_NET} are used by live runs; stop some or run 'gctestbed clean'.")
            while True:
                run_id = secrets.token_hex(3)
                if not os.path.exists(os.path.join(directory, f"{run_id}.json")):
                    break
            me = psutil.Process()
            state = cls(run_id=run_id, owner_pid=me.pid, owner_started=me.create_time(),
                        subnet=free[0], results_db=results_db,
                        path=os.path.join(directory, f"{run_id}.json"))
            state._write()
        return state

    def update(self, **fields) -> None:
        """Set ledger fields (``persistent``, ``meta``, ``results_db``) and write them out."""
        for key, value in fields.items():
            if key not in ("persistent", "meta", "results_db"):
                raise KeyError(key)
            setattr(self, key, value)
        self._write()

    def add(self, kind: str, **where) -> None:
        """Record an object (``netns``, ``link``, ``qdisc``, ``process``, ``container``, ``cgroup``,
        ``dir``, ``slurm-job``) before creating it (a Slurm job just after: its id comes with it).

        A process is recorded just after it starts (its pid is needed), with its start time, so a
        later teardown never signals another process that reused the pid.
        """
        if kind == "process" and "started" not in where:
            try:
                where["started"] = psutil.Process(where["pid"]).create_time()
            except psutil.Error:
                where["started"] = 0.0
        self.objects.append({"kind": kind, **where})
        self._write()

    def _write(self) -> None:
        data = asdict(self)
        data.pop("path")
        tmp = f"{self.path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    # -- inspection ---------------------------------------------------------------------
    def owner_alive(self) -> bool:
        try:
            return abs(psutil.Process(self.owner_pid).create_time() - self.owner_started) < 1.0
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    def names(self, kind: str) -> list[str]:
        return [o["name"] for o in self.objects if o["kind"] == kind]

    # -- teardown -----------------------------------------------------------------------
    def undo(self) -> list[str]:
        """Remove every recorded object, processes first; return what could not be removed."""
        problems: list[str] = []
        netns_names = set(self.names("netns"))
        _kill_processes(self._recorded_processes() + namespaces.processes_in(netns_names))
        for obj in reversed(self.objects):
            kind = obj["kind"]
            try:
                if kind == "netns":
                    namespaces.remove(obj["name"])
                elif kind == "container":
                    _remove_container(obj["name"])
                elif kind == "link" and obj.get("netns") not in netns_names:
                    namespaces.delete_link(obj["name"], obj.get("netns"))
                elif kind == "cgroup":
                    cpushare.remove(obj["name"])
                elif kind == "dir":
                    shutil.rmtree(obj["name"], ignore_errors=True)
                elif kind == "slurm-job":
                    _cancel_job(obj["name"])
            except OSError as e:
                problems.append(f"{kind} {obj['name']}: {e}")
        leftover = [n for n in netns_names if namespaces.exists(n)]
        problems += [f"netns {n} still exists" for n in leftover]
        if not problems:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        return problems

    def _recorded_processes(self) -> list[psutil.Process]:
        procs = []
        for obj in self.objects:
            if obj["kind"] != "process":
                continue
            try:
                p = psutil.Process(obj["pid"])
                if abs(p.create_time() - obj["started"]) < 1:
                    procs.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return procs


def _remove_container(name: str) -> None:
    """Remove a container this run made (stopping it first); gone already is fine."""
    import docker
    from docker.errors import DockerException, NotFound
    try:
        docker.from_env().containers.get(name).remove(force=True)
    except NotFound:
        pass
    except DockerException as e:
        raise OSError(f"docker: {e}") from None


def _cancel_job(job_id: str) -> None:
    """End a Slurm allocation this run made (gone already is fine)."""
    try:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OSError(f"scancel {job_id}: {e}") from None


def _kill_processes(procs: list[psutil.Process], grace_s: float = 2.0) -> None:
    """SIGTERM, wait a little, then SIGKILL whatever is left."""
    mine = os.getpid()
    procs = [p for p in {p.pid: p for p in procs}.values() if p.pid not in (mine, 0)]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


@contextlib.contextmanager
def _locked(directory: str) -> Iterator[None]:
    fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def find(name: str) -> RunState:
    """The ledger of cluster ``name`` (``gct-<id>`` or ``<id>``)."""
    run_id = name.removeprefix("gct-")
    path = os.path.join(state_dir(), f"{run_id}.json")
    if not os.path.exists(path):
        live = ", ".join(f"gct-{s.run_id}" for s in load_all()) or "none"
        raise UserError(f"there is no cluster named {name}; clusters: {live}.")
    return load(path)


def load(path: str) -> RunState:
    with open(path) as f:
        data = json.load(f)
    return RunState(path=path, **data)


def load_all() -> list[RunState]:
    directory = state_dir()
    states = []
    if not os.path.isdir(directory):
        return states
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            try:
                states.append(load(os.path.join(directory, name)))
            except (OSError, ValueError, TypeError):
                continue
    return states


def clean_dead() -> tuple[list[RunState], list[str]]:
    """Undo the ledgers of runs whose owner process is gone; live runs and clusters brought up
    with 'gctestbed up' (removed with 'gctestbed down') are left alone."""
    cleaned, problems = [], []
    with _locked_if_present():
        for state in load_all():
            if not state.persistent and not state.owner_alive():
                problems += state.undo()
                cleaned.append(state)
    return cleaned, problems


@contextlib.contextmanager
def _locked_if_present() -> Iterator[None]:
    directory = state_dir()
    if not os.path.isdir(directory):
        yield
        return
    with _locked(directory):
        yield


def census(prefix: str = "gct-", containers: bool = False) -> dict[str, list[str]]:
    """What of gctestbed's is on this machine now: namespaces, ledgers, processes, CPU cgroups,
    and (asked for when a launcher makes them, so no engine is bothered otherwise) containers."""
    found = {"namespaces": sorted(n for n in os.listdir(namespaces.NETNS_DIR) if n.startswith(prefix))
             if os.path.isdir(namespaces.NETNS_DIR) else [],
             "ledgers": sorted(s.run_id for s in load_all() if f"gct-{s.run_id}-".startswith(prefix)),
             "processes": [], "containers": [], "cgroups": cpushare.existing(prefix)}
    for p in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            cmdline = " ".join(p.info["cmdline"] or [])
            if (p.info["environ"] or {}).get("GCTESTBED_NODE", "").startswith(prefix) or prefix in cmdline:
                found["processes"].append(f"{p.pid} {cmdline[:120]}")
        except psutil.Error:
            continue
    if containers:
        import docker
        client = docker.from_env()
        try:
            found["containers"] = sorted(c.name for c in client.containers.list(
                all=True, filters={"label": "gctestbed.run"}) if c.name.startswith(prefix))
        finally:
            client.close()
    return found
