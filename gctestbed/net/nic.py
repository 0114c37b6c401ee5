"""Shaping an interface gctestbed did not create (a real NIC, or a container's eth0), and putting
back exactly what was there.

``shape`` saves the interface's root qdisc, then installs the same htb (and netem leaves, where
the kernel has netem) that every launcher puts on a node's own egress, pure ACKs ahead of bulk
data. An interface whose root qdisc is not the kernel's default is refused unless forced,
because someone configured it; forced, its qdisc is saved and ``unshape`` rebuilds it with the
same parameters (tbf and the kernel defaults are rebuilt exactly; other kinds are refused, since
they could not be put back). The saved state lives in a file per interface, so an unshape in
another process, or after a crash, restores it.
"""

from __future__ import annotations

import errno
import json
import os
import socket

import psutil
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from ..spec import Direction, UserError
from . import shaping

DEFAULT_KINDS = ("noqueue", "pfifo_fast", "mq", "fq_codel", "pfifo", "fq")   # what a kernel attaches by itself
RESTORABLE = DEFAULT_KINDS + ("tbf",)


def address(ifname: str) -> str | None:
    """The IPv4 address of ``ifname`` in this namespace, or None."""
    return next((a.address for a in psutil.net_if_addrs().get(ifname, []) if a.family == socket.AF_INET), None)


def congestion_control() -> str:
    """The TCP congestion control this host's sockets get by default (its training's flows too)."""
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        return f.read().strip()


def _state_path(directory: str, ifname: str) -> str:
    """Where ``ifname``'s saved qdisc lives: per network namespace, so two namespaces of one machine
    (two emulated hosts, each with its own eth0) do not share one record."""
    return os.path.join(directory, f"shaped-{os.stat('/proc/self/ns/net').st_ino}-{ifname}.json")


def root_qdisc(ipr: IPRoute, ifname: str) -> dict:
    """The interface's root qdisc as a restorable record: kind, handle, whether the kernel made
    it, and the parameters that rebuild it."""
    index = shaping._index(ipr, ifname)
    roots = [q for q in ipr.get_qdiscs(index=index) if q["parent"] == 0xFFFFFFFF]
    if not roots:
        return {"kind": None, "default": True}
    q = roots[0]
    kind = q.get_attr("TCA_KIND")
    record = {"kind": kind, "handle": q["handle"], "default": kind in DEFAULT_KINDS and q["handle"] & 0xFFFF0000 == 0}
    if kind == "tbf":
        parms = q.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
        rate = q.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_RATE64") or parms["rate"]
        record.update(rate=rate, burst=round(parms["buffer"] * shaping.PSCHED_TICK_S * rate), limit=parms["limit"])
    return record


def shape(ifname: str, d: Direction, state_dir: str, force: bool = False) -> dict:
    """Save what ``ifname`` has, then shape its egress to ``d`` (delay, jitter and loss with netem:
    the delay line needs both ends of a cable). Returns the saved record."""
    path = _state_path(state_dir, ifname)
    if os.path.exists(path):
        raise UserError(f"{ifname} is already shaped by gctestbed: 'gctestbed unshape --dev {ifname}' first.")
    with IPRoute() as ipr:
        try:
            before = root_qdisc(ipr, ifname)
        except OSError:
            raise UserError(f"there is no interface {ifname}.") from None
        if not before["default"] and not force:
            raise UserError(f"{ifname} has a {before['kind']} qdisc that gctestbed did not make: --force replaces it "
                            "(and unshape puts it back), or remove it yourself.")
        if before["kind"] not in RESTORABLE and before["kind"] is not None:
            raise UserError(f"{ifname}'s {before['kind']} qdisc could not be put back afterwards: remove it yourself.")
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        with open(path, "w") as f:
            json.dump({"ifname": ifname, "before": before}, f)
        index = shaping._index(ipr, ifname)
        if not before["default"]:
            ipr.tc("del", index=index, handle=before["handle"], parent=0xFFFFFFFF)
        try:
            shaping.apply(ipr, ifname, d, netem=bool(d.delay_s or d.jitter_s or d.loss_pct), host=True)
        except BaseException:
            _restore(ipr, ifname, before)
            os.unlink(path)
            raise
    return before


def unshape(ifname: str, state_dir: str) -> dict:
    """Remove gctestbed's shaping from ``ifname`` and rebuild what was there before."""
    path = _state_path(state_dir, ifname)
    if not os.path.exists(path):
        raise UserError(f"{ifname} was not shaped by gctestbed (no {path}); nothing to undo.")
    with open(path) as f:
        before = json.load(f)["before"]
    with IPRoute() as ipr:
        _restore(ipr, ifname, before)
    os.unlink(path)
    return before


def _restore(ipr: IPRoute, ifname: str, before: dict) -> None:
    index = shaping._index(ipr, ifname)
    try:
        ipr.tc("del", index=index, handle=shaping.ROOT, parent=0xFFFFFFFF)
    except NetlinkError as e:
        if e.code not in (errno.ENOENT, errno.EINVAL):
            raise
    if before["kind"] == "tbf":
        ipr.tc("add", "tbf", index, before["handle"], rate=before["rate"], burst=before["burst"], limit=before["limit"])
    # a kernel default comes back by itself once the root qdisc is deleted


def describe(ifname: str) -> dict:
    """What a run on this NIC records about its shaping, in the keys a netns run uses: how delay
    is made (netem here: the delay line needs both ends of a cable) and the qdisc configuration
    the kernel reports, with counters."""
    with IPRoute() as ipr:
        try:
            found = shaping.describe(ipr, ifname)
        except (OSError, UserError):
            return {"latency_impl": None, "qdiscs": {}}
    impl = "netem" if any(q["kind"] == "netem" for q in found["qdiscs"]) else "none"
    return {"latency_impl": impl, "qdiscs": {ifname: found}}
