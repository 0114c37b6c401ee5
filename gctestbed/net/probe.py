"""What this kernel can really do, found by trying it on a scratch veth, never guessed from config.

Probes run inside a namespace the caller owns, so a probe interface can never touch the host's
network and disappears with that namespace whatever happens.
"""

from __future__ import annotations

import errno
from typing import Callable

from pyroute2.netlink.exceptions import NetlinkError

from . import namespaces

PROBE_IF = "gct-probe0"
ROOT_HANDLE, INGRESS_HANDLE = 0x10000, 0xFFFF0000     # ingress and clsact live at ffff:


def qdisc_available(namespace: str, kind: str, record: Callable[..., None] = lambda *a, **k: None,
                    **params) -> bool:
    """True when a ``kind`` qdisc can be attached to a scratch veth in ``namespace``."""
    handle = INGRESS_HANDLE if kind in ("ingress", "clsact") else ROOT_HANDLE
    record("link", name=PROBE_IF, netns=namespace)
    with namespaces.iproute(namespace) as ipr:
        ipr.link("add", ifname=PROBE_IF, kind="veth", peer="gct-probe1")
        try:
            index = ipr.link_lookup(ifname=PROBE_IF)[0]
            ipr.tc("add", kind, index, handle, **params)
            return True
        except NetlinkError as e:
            if e.code in (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL):
                return False
            raise
        finally:
            ipr.link("del", index=ipr.link_lookup(ifname=PROBE_IF)[0])
