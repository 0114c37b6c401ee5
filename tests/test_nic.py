"""gctestbed shape / unshape on an interface it did not create: refuse, replace, put back exactly."""

from __future__ import annotations

import os

import pytest
from pyroute2 import IPRoute

from gctestbed.net import nic, shaping
from helpers import gctestbed

pytestmark = pytest.mark.root


@pytest.fixture
def veth():
    """A veth pair in the host namespace standing for a real NIC; removed whatever happens."""
    name = f"gctn{os.getpid() % 100000}"
    with IPRoute() as ipr:
        ipr.link("add", ifname=name, kind="veth", peer=name + "p")
        ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up")
    yield name
    with IPRoute() as ipr:
        for idx in ipr.link_lookup(ifname=name):
            ipr.link("del", index=idx)


def _config(ifname: str) -> dict:
    """The qdisc configuration without counters: what must be identical after a round trip."""
    with IPRoute() as ipr:
        d = shaping.describe(ipr, ifname)
        root = nic.root_qdisc(ipr, ifname)
    strip = lambda e: {k: v for k, v in e.items() if k not in ("sent_bytes", "sent_packets", "drops", "overlimits")}
    return {"qdiscs": [strip(q) for q in d["qdiscs"]], "classes": [strip(c) for c in d["classes"]], "root": root}


def test_round_trip_on_a_default_interface(veth, state_dir):
    before = _config(veth)
    proc = gctestbed("shape", "--dev", veth, "--bw", "50mbit")
    assert proc.returncode == 0, proc.stderr
    shaped = _config(veth)
    assert {c["classid"]: c["rate_bps"] for c in shaped["classes"]} == \
        {"1:1": 50_000_000, "1:2": 50_000_000 // 20, "1:3": 50_000_000 - 50_000_000 // 20}    # a host's egress: ACKs first
    assert gctestbed("shape", "--dev", veth, "--bw", "10mbit").returncode == 2      # already shaped by us
    proc = gctestbed("unshape", "--dev", veth)
    assert proc.returncode == 0, proc.stderr
    assert _config(veth) == before


def test_a_foreign_qdisc_is_refused_then_replaced_and_restored_exactly(veth, state_dir):
    with IPRoute() as ipr:
        ipr.tc("add", "tbf", ipr.link_lookup(ifname=veth)[0], 0x20000, rate=1_250_000, burst=20_000, limit=30_000)
    before = _config(veth)
    assert before["root"]["kind"] == "tbf"
    proc = gctestbed("shape", "--dev", veth, "--bw", "50mbit")
    assert proc.returncode == 2 and "did not make" in proc.stderr and "Traceback" not in proc.stderr
    assert _config(veth) == before                                                    # refused: untouched
    assert gctestbed("shape", "--dev", veth, "--bw", "50mbit", "--force").returncode == 0
    assert _config(veth)["root"]["kind"] == "htb"
    assert gctestbed("unshape", "--dev", veth).returncode == 0
    assert _config(veth) == before


def test_unshape_of_an_interface_never_shaped_is_refused(veth, state_dir):
    proc = gctestbed("unshape", "--dev", veth)
    assert proc.returncode == 2 and "was not shaped by gctestbed" in proc.stderr
    assert gctestbed("shape", "--dev", "no-such-if0", "--bw", "1mbit").returncode == 2
