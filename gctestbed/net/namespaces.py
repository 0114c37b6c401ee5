"""Network namespaces: create, enter, list their processes, remove — all through pyroute2.

Namespaces are named (bind-mounted under /run/netns) so that tools such as ``ip netns`` see
them and ``gctestbed clean`` can find them again from a ledger after a crash.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import subprocess
import threading
from typing import Any, Callable, Iterable, Iterator

import psutil
from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from ..spec import UserError

NETNS_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def create(name: str) -> None:
    try:
        netns.create(name)
    except PermissionError:
        raise UserError("creating network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN): rerun with sudo.") from None


def attach(name: str, pid: int) -> None:
    """Name the network namespace of process ``pid`` (a container's) as if ``create`` had made it;
    ``remove`` later drops the name only, the namespace lives as long as its processes."""
    netns.attach(name, pid)


def exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, name))


def remove(name: str) -> None:
    """Delete a namespace; its interfaces and their qdiscs go with it. Missing is fine."""
    if not exists(name):
        return
    try:
        netns.remove(name)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.EINVAL):
            raise
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(NETNS_DIR, name))


@contextlib.contextmanager
def iproute(name: str | None) -> Iterator[IPRoute]:
    """A netlink socket inside namespace ``name`` (the host's when None); never creates one."""
    ipr = IPRoute() if name is None else IPRoute(netns=name, flags=0)
    try:
        yield ipr
    finally:
        ipr.close()


def enter(name: str) -> None:
    """Move the calling process into a namespace (for a child's preexec_fn)."""
    netns.setns(name, flags=0)


def popen(name: str | None, argv: list[str], then: Callable[[], None] | None = None, **kwargs: Any) -> subprocess.Popen:
    """Start ``argv`` inside namespace ``name``, this process's when None (argv list, never a shell);
    ``then``: what else the child does before exec (join a cgroup)."""
    def setup() -> None:
        if name is not None:
            enter(name)
        if then is not None:
            then()
    return subprocess.Popen(argv, preexec_fn=setup if name is not None or then is not None else None, **kwargs)


def write_sysctl(name: str, key: str, value: str) -> None:
    """Set ``net.*`` sysctl ``key`` (e.g. ``net/ipv4/tcp_wmem``) inside namespace ``name``.

    net sysctls belong to the namespace of the thread that opens them, so a short-lived thread
    enters the namespace, writes, and ends; the rest of the process stays where it was.
    """
    _in_namespace(name, key, "w", value)


def read_sysctl(name: str, key: str) -> str:
    """``net.*`` sysctl ``key`` as namespace ``name`` reads it (``write_sysctl``'s other half)."""
    return _in_namespace(name, key, "r").strip()


def _in_namespace(name: str, key: str, mode: str, value: str = "") -> str:
    """Open /proc/sys/``key`` in namespace ``name`` from a thread of its own, then write ``value``
    (mode "w") or read it (mode "r")."""
    out: list[str] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {name}")
            finally:
                os.close(fd)
            with open(f"/proc/sys/{key}", mode) as f:
                if mode == "w":
                    f.write(value)
                out.append("" if mode == "w" else f.read())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return out[0]


def _inode(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def processes_in(names: Iterable[str]) -> list[psutil.Process]:
    """Every process whose network namespace is one of ``names``."""
    wanted = {i for i in (_inode(os.path.join(NETNS_DIR, n)) for n in names) if i}
    if not wanted:
        return []
    found = []
    for pid in psutil.pids():
        if _inode(f"/proc/{pid}/ns/net") in wanted:
            with contextlib.suppress(psutil.Error):
                found.append(psutil.Process(pid))
    return found


def delete_link(ifname: str, namespace: str | None = None) -> None:
    """Delete an interface by name (its veth peer goes too). Missing is fine."""
    if namespace is not None and not exists(namespace):
        return
    with iproute(namespace) as ipr:
        idx = ipr.link_lookup(ifname=ifname)
        if not idx:
            return
        try:
            ipr.link("del", index=idx[0])
        except NetlinkError as e:
            if e.code != errno.ENODEV:
                raise OSError(e.code, str(e)) from None
