"""Equal, enforced CPU shares for the nodes of one host (``--cpus-per-node X``), as Mininet's
CPU-limited hosts have: one cgroup per node whose CFS quota is X CPUs, so N nodes on fewer cores
each get at most X and compute times stop depending on who the scheduler favoured.

The cpu controller is found where this kernel mounts it: cgroup v1's ``cpu`` hierarchy
(cpu.cfs_quota_us / cpu.cfs_period_us), else cgroup v2's unified tree with the cpu controller
enabled (cpu.max). The node's process joins its group before it runs anything (``join`` in the
child, before exec), so every thread and child it starts is held to the share. The kernel's own
counters (cpu.stat: periods, throttled periods, time throttled) are read back before teardown.
"""

from __future__ import annotations

import errno
import os
import time

from ..spec import UserError

V1_ROOT = "/sys/fs/cgroup/cpu"
V2_ROOT = "/sys/fs/cgroup"
MIN_PERIOD_US, MIN_QUOTA_US = 10_000, 2_000   # short periods: a node's share comes in slices of ms, not of 100 ms
PREFIX = "gctestbed-"


def hierarchy() -> tuple[str, str] | None:
    """("v1" or "v2", the cgroup root that has the cpu controller), or None when neither does. A
    kernel gives the controller to one hierarchy only: v1's when a v1 ``cpu`` hierarchy is mounted
    (a hybrid host, whose cgroup2 tree then lacks it), else the cgroup2 tree's where that lists it."""
    if os.path.exists(os.path.join(V1_ROOT, "cpu.cfs_quota_us")):
        return "v1", V1_ROOT
    for root in _cgroup2_mounts():
        controllers = os.path.join(root, "cgroup.controllers")
        if os.path.exists(controllers):
            with open(controllers) as f:
                if "cpu" in f.read().split():
                    return "v2", root
    return None


def _cgroup2_mounts() -> list[str]:
    """Where cgroup2 is mounted (/proc/mounts): /sys/fs/cgroup on a v2 host, /sys/fs/cgroup/unified
    on a hybrid one."""
    try:
        with open("/proc/mounts") as f:
            found = [line.split()[1] for line in f if line.split()[2:3] == ["cgroup2"]]
    except OSError:
        found = []
    return sorted(set(found), key=lambda m: m != V2_ROOT) or [V2_ROOT]


def check() -> tuple[str, str]:
    """The hierarchy to use, or the sentence that says why --cpus-per-node cannot work here."""
    found = hierarchy()
    if found is None:
        raise UserError("--cpus-per-node needs the cgroup cpu controller (cgroup v1's cpu hierarchy or cgroup v2 with "
                        "cpu enabled) and this host mounts neither: run without it or mount one.")
    if os.geteuid() != 0:
        raise UserError("--cpus-per-node needs root to create cgroups: rerun with sudo.")
    return found


def path_of(name: str) -> str:
    """Where the group of node ``name`` lives (to be in the ledger before it exists)."""
    return os.path.join(check()[1], PREFIX + name)


def create(path: str, cpus: float) -> str:
    """The cgroup at ``path`` (``path_of``), holding its members to ``cpus`` CPUs; its path."""
    version, root = check()
    os.makedirs(path, exist_ok=True)
    period, quota = period_quota(cpus)
    if version == "v1":
        _write(path, "cpu.cfs_period_us", period)
        _write(path, "cpu.cfs_quota_us", quota)
    else:
        with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
            f.write("+cpu")
        _write(path, "cpu.max", f"{quota} {period}")
    return path


def period_quota(cpus: float) -> tuple[int, int]:
    """CFS period and quota (µs) for ``cpus`` CPUs. CFS's default period of 100 ms would let a
    0.06-CPU node run 6 ms and then stall 94 ms, so step times would come in 100 ms steps; the
    period here is the shortest (10 ms and up) that leaves a quota of at least 2 ms."""
    period = max(MIN_PERIOD_US, round(MIN_QUOTA_US / cpus))
    return period, round(cpus * period)


def join(path: str) -> None:
    """Move the calling process into the group (in a child before exec: all it starts stays in)."""
    _write(path, "cgroup.procs", os.getpid())


def quota(path: str) -> float:
    """The CPUs the group is held to, as the kernel has it."""
    if os.path.exists(os.path.join(path, "cpu.max")):
        q, period = _read(path, "cpu.max").split()
        return float("inf") if q == "max" else int(q) / int(period)
    q = int(_read(path, "cpu.cfs_quota_us"))
    return float("inf") if q < 0 else q / int(_read(path, "cpu.cfs_period_us"))


def stats(path: str) -> dict:
    """The kernel's counters of the group: CFS periods, how many were throttled, time throttled (s)."""
    raw = dict(line.split() for line in _read(path, "cpu.stat").splitlines() if line.strip())
    throttled = int(raw["throttled_time"]) / 1e9 if "throttled_time" in raw else int(raw.get("throttled_usec", 0)) / 1e6
    return {"cpus": quota(path), "periods": int(raw.get("nr_periods", 0)),
            "throttled_periods": int(raw.get("nr_throttled", 0)), "throttled_s": throttled}


def remove(path: str, wait_s: float = 3.0) -> None:
    """Remove the group once its members have left it (killed members take a moment to exit);
    gone already is fine."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def existing(prefix: str = "gct-") -> list[str]:
    """The groups of nodes named ``prefix``... that are on this machine now."""
    found = hierarchy()
    if found is None:
        return []
    return sorted(os.path.join(found[1], n) for n in os.listdir(found[1]) if n.startswith(PREFIX + prefix))


def _write(path: str, key: str, value) -> None:
    with open(os.path.join(path, key), "w") as f:
        f.write(str(value))


def _read(path: str, key: str) -> str:
    with open(os.path.join(path, key)) as f:
        return f.read().strip()
