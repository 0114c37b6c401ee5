"""doctor tries every feature and says what a missing one disables and how to get it."""

from __future__ import annotations

import json
import os

import pytest

from helpers import gctestbed


@pytest.mark.root
def test_doctor_probes_the_kernel_and_tools(state_dir):
    proc = gctestbed("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    for name in ("root", "network namespaces", "veth", "bridge", "tun/tap", "ifb", "qdisc htb", "qdisc netem",
                 "latency emulation", "C++ compiler", "ninja", "nvcc", "iperf3", "Docker engine", "CUDA in torch",
                 "NCCL in torch"):
        assert name in checks
    assert checks["qdisc htb"]["ok"] and checks["latency emulation"]["ok"]
    expected_impl = "netem" if checks["qdisc netem"]["ok"] else "delay line"
    assert checks["latency emulation"]["detail"].startswith(expected_impl)
    for c in checks.values():
        if not c["ok"]:
            assert c["disables"] and c["fix"], c
    assert list(state_dir.iterdir()) == [state_dir / ".lock"]      # the scratch namespace is gone


def test_doctor_names_what_a_missing_tool_disables_and_the_fix(tmp_path):
    """With no tools on PATH the compiler, ninja, nvcc and iperf3 checks fail, each saying what it
    disables and how to get it (on a host where every check passes, the test above sees no failure)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = gctestbed("doctor", "--json", env={**os.environ, "PATH": str(empty), "CXX": "c++"})
    assert proc.returncode == 0, proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    for name, fix in (("C++ compiler", "g++"), ("ninja", "ninja"), ("nvcc", "CUDA toolkit"), ("iperf3", "iperf3")):
        assert not checks[name]["ok"] and checks[name]["disables"] and fix in checks[name]["fix"], checks[name]


def test_doctor_without_root_says_how(monkeypatch):
    from gctestbed import doctor
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    (root,) = doctor.kernel_checks()
    assert not root.ok and "root" in root.fix
