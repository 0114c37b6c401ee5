"""What this host can do for gctestbed, each item found by trying it, never guessed from config.

Kernel features are tried in a scratch namespace (recorded in a ledger like any run, so a crash
leaves nothing 'gctestbed clean' cannot remove); tools by running them; torch's CUDA and NCCL by
asking torch. Every missing piece says what it disables and how to get it.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass

from pyroute2.netlink.exceptions import NetlinkError

from .launch.state import RunState
from .net import delayline, namespaces, probe

QDISCS = ("htb", "tbf", "netem", "ingress", "clsact", "sfq", "fq_codel", "cake")
PROBE_PARAMS = {"htb": {"default": 1}, "tbf": {"rate": 125_000, "burst": 3028, "latency": 50}, "netem": {"delay": 1000}}
NEEDED_QDISCS = {"htb": "bandwidth shaping (every run)", "netem": "in-kernel latency, jitter and loss "
                 "(the delay line replaces it)", "ingress": "shaping real NICs' downloads with ifb",
                 "tbf": "nothing (htb is used)"}

_TAP_PROBE = r"""
import fcntl, os, struct
fd = os.open('/dev/net/tun', os.O_RDWR)
fcntl.ioctl(fd, 0x400454ca, struct.pack('16sH', b'gct-probetap', 0x0002 | 0x1000 | 0x4000))
print('ok')
"""


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    disables: str = ""
    fix: str = ""


def _run(argv: list[str], line: int = 0) -> str | None:
    """One line of what a tool says about its version, or None if it is missing or fails."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[line] if out.returncode == 0 and text else None


def kernel_checks() -> list[Check]:
    if os.geteuid() != 0:
        return [Check("root", False, f"running as uid {os.geteuid()}", "every launcher but hosts' own NICs",
                      "run gctestbed as root (sudo)")]
    checks = [Check("root", True, "uid 0")]
    state = RunState.create()
    scratch = f"gct-{state.run_id}-doctor"
    try:
        state.add("netns", name=scratch)
        try:
            namespaces.create(scratch)
            checks.append(Check("network namespaces", True, "created one"))
        except Exception as e:  # noqa: BLE001 - any failure means the feature is unusable
            checks.append(Check("network namespaces", False, str(e), "the netns launcher", "a kernel with CONFIG_NET_NS"))
            return checks
        with namespaces.iproute(scratch) as ipr:
            for kind, extra, disables, fix in (
                    ("veth", {"peer": "gct-pveth1"}, "the netns launcher", "load the veth module"),
                    ("bridge", {}, "the netns launcher's switches", "load the bridge module"),
                    ("ifb", {}, "shaping the download of real NICs (hosts launcher)", "load the ifb module")):
                name = f"gct-p{kind}"
                state.add("link", name=name, netns=scratch)
                try:
                    ipr.link("add", ifname=name, kind=kind, **extra)
                    checks.append(Check(kind, True, "created one"))
                except NetlinkError as e:
                    checks.append(Check(kind, False, os.strerror(e.code), disables, fix))
        tap = namespaces.popen(scratch, [sys.executable, "-c", _TAP_PROBE], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        out, err = tap.communicate(timeout=20)
        checks.append(Check("tun/tap", out.strip() == "ok", "created a TAP device" if out.strip() == "ok"
                            else (err.strip().splitlines() or ["failed"])[-1],
                            "the delay line (latency where netem is missing)", "load the tun module; /dev/net/tun"))
        for kind in QDISCS:
            ok = probe.qdisc_available(scratch, kind, state.add, **PROBE_PARAMS.get(kind, {}))
            checks.append(Check(f"qdisc {kind}", ok, "attached to a scratch veth" if ok else "the kernel refused it",
                                "" if ok else NEEDED_QDISCS.get(kind, "nothing gctestbed needs"),
                                "" if ok else f"load sch_{kind} (modprobe sch_{kind}) or use a kernel that has it"))
    finally:
        state.undo()
    return checks


def latency_check(kernel: list[Check]) -> Check:
    has_netem = any(c.name == "qdisc netem" and c.ok for c in kernel)
    if has_netem:
        return Check("latency emulation", True, "netem (the delay line is also available)")
    try:
        path = delayline.program()
        return Check("latency emulation", True, f"delay line (netem is missing): {path}")
    except Exception as e:  # noqa: BLE001
        return Check("latency emulation", False, str(e), "--latency, --jitter and --loss",
                     "install g++ and ninja (pip install ninja), or use a kernel with netem")


def tool_checks() -> list[Check]:
    out = []
    gxx = _run([os.environ.get("CXX", "c++"), "--version"])
    out.append(Check("C++ compiler", gxx is not None, gxx or "not found", "the delay line and native kernels",
                     "apt-get install g++"))
    ninja = _run(["ninja", "--version"])
    out.append(Check("ninja", ninja is not None, ninja or "not found", "building native code", "pip install ninja"))
    nvcc = _run(["nvcc", "--version"], line=-1)
    out.append(Check("nvcc", nvcc is not None, nvcc or "not found", "CUDA kernels", "install the CUDA toolkit"))
    iperf = _run(["iperf3", "--version"])
    out.append(Check("iperf3", iperf is not None, iperf or "not found (the built-in TCP probe is used)",
                     "nothing: calibration falls back to the built-in probe", "apt-get install iperf3"))
    out.append(_docker())
    return out


def _docker() -> Check:
    path = "/var/run/docker.sock"
    if not os.path.exists(path):
        return Check("Docker engine", False, "no /var/run/docker.sock", "the docker launcher",
                     "apt-get install docker.io and start dockerd")
    try:
        conn = http.client.HTTPConnection("localhost", timeout=5)
        conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.sock.settimeout(5)
        conn.sock.connect(path)
        conn.request("GET", "/version")
        body = conn.getresponse().read().decode()
        version = body.split('"Version":"', 1)[1].split('"', 1)[0] if '"Version":"' in body else "answers"
        return Check("Docker engine", True, f"engine {version}")
    except OSError as e:
        return Check("Docker engine", False, f"{path}: {e}", "the docker launcher", "start dockerd")


def torch_checks() -> list[Check]:
    import torch
    import torch.distributed as dist
    cuda = torch.cuda.is_available()
    out = [Check("torch", True, torch.__version__),
           Check("CUDA in torch", cuda, f"{torch.cuda.device_count()} device(s)" if cuda
                 else f"not available (torch {torch.__version__}, CUDA build {torch.version.cuda})",
                 "--device cuda", "a CUDA build of torch on a host with an NVIDIA GPU")]
    nccl = dist.is_nccl_available()
    version = ".".join(map(str, torch.cuda.nccl.version())) if nccl and cuda else ""
    out.append(Check("NCCL in torch", nccl, version or ("built in" if nccl else "not built in"),
                     "--backend nccl", "a CUDA build of torch"))
    out.append(Check("Gloo in torch", dist.is_gloo_available(), "built in" if dist.is_gloo_available() else "missing",
                     "every run", "a torch build with Gloo"))
    return out


def diagnose() -> list[Check]:
    kernel = kernel_checks()
    checks = kernel + ([latency_check(kernel)] if os.geteuid() == 0 else []) + tool_checks() + torch_checks()
    return checks


def to_json(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]

