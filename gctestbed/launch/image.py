"""The ``gctestbed-node`` image every docker node runs: built from a Dockerfile where a registry
is reachable, or offline where none is.

Online: ``gctestbed/docker/Dockerfile.cpu`` (python:3.11-slim, CPU torch) or ``Dockerfile.gpu``
(an NVIDIA CUDA runtime base), built from a context made here: this gctestbed package, as
installed, and its requirements read from its metadata, so a source tree and an installed wheel
build the same image. Offline: an image imported from an archive of empty directories, labelled
``gctestbed.host-mounts``; the launcher then mounts this host's system directories, its Python
installation and the gctestbed package into each node, read-only, at the same paths, so the node
runs exactly the Python, torch and gctestbed installed here. The choice is made by trying the
registry (a pull of the Dockerfile's base image).
"""

from __future__ import annotations

import io
import os
import re
import sys
import sysconfig
import tarfile
from importlib import metadata
from pathlib import Path

from ..spec import UserError

IMAGE = "gctestbed-node"
HOST_MOUNTS_LABEL = "gctestbed.host-mounts"
PACKAGE = Path(__file__).resolve().parent.parent           # gctestbed/, in a source tree or site-packages
DOCKER_DIR = PACKAGE / "docker"
DOCKERFILES = {False: "Dockerfile.cpu", True: "Dockerfile.gpu"}
BASES = {False: "python:3.11-slim", True: "nvidia/cuda:12.4.1-runtime-ubuntu22.04"}
SKELETON = ("proc", "sys", "dev", "dev/shm", "tmp", "etc", "root", "run", "var", "var/tmp", "usr", "opt", "home")
TOP_LEVEL = ("lib", "lib64", "bin", "sbin")      # symlinks into /usr on a merged-/usr host, as there


def client():
    """The Docker engine, or one sentence on how to get one."""
    try:
        import docker
        c = docker.from_env()
        c.ping()
        return c
    except Exception as e:  # noqa: BLE001 - any failure to reach the engine is the user's to fix
        raise UserError(f"no Docker engine answers ({type(e).__name__}): install one (apt-get install docker.io) and "
                        "start it (dockerd &), or use --launcher netns.") from None


def tag(gpu: bool = False) -> str:
    return f"{IMAGE}:{'gpu' if gpu else 'cpu'}"


def host_paths() -> list[str]:
    """What an offline node needs from this host, read-only at the same paths: the system's
    binaries and libraries, this Python and its packages, the directory gctestbed is imported from."""
    paths = ["/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/alternatives",
             sys.prefix, sys.base_prefix, sysconfig.get_paths()["purelib"], str(PACKAGE.parent)]
    out: list[str] = []
    for p in paths:
        p = os.path.realpath(p)
        if os.path.exists(p) and not any(p == q or p.startswith(q + "/") for q in out):
            out = [q for q in out if not q.startswith(p + "/")] + [p]
    return sorted(out)


def build(gpu: bool = False, offline: bool | None = None, on_phase=lambda text: None) -> dict:
    """Build ``gctestbed-node:cpu|gpu``; ``offline`` None tries the registry first."""
    c = client()
    if offline is None:
        on_phase(f"trying the registry ({BASES[gpu]})")
        offline = not _registry_reachable(c, BASES[gpu])
    if not offline:
        on_phase(f"building {DOCKERFILES[gpu]}")
        c.images.build(fileobj=io.BytesIO(context(gpu)), custom_context=True, dockerfile=DOCKERFILES[gpu],
                       tag=tag(gpu), rm=True)
        return {"tag": tag(gpu), "offline": False}
    if gpu:
        raise UserError("an offline GPU image needs the NVIDIA container toolkit's host libraries; build the "
                        "GPU image where a registry is reachable (gctestbed image build --gpu --online).")
    on_phase("importing the offline base")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for d in SKELETON + TOP_LEVEL:
            info = tarfile.TarInfo(d)
            if os.path.islink(f"/{d}"):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(f"/{d}")
            else:
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d in ("tmp", "var/tmp", "dev/shm") else 0o755
            t.addfile(info)
    repo, _, version = tag(gpu).partition(":")
    c.api.import_image_from_data(buf.getvalue(), repository=repo, tag=version,
                                 changes=[f'LABEL {HOST_MOUNTS_LABEL}="1"', "WORKDIR /tmp"])
    return {"tag": tag(gpu), "offline": True, "host_mounts": host_paths()}


def requirements() -> list[str]:
    """gctestbed's run-time requirements, from its installed metadata (pyproject.toml's list), torch
    left out: each Dockerfile installs the torch build its base needs first."""
    try:
        wanted = metadata.requires("gctestbed") or []
    except metadata.PackageNotFoundError:
        raise UserError("gctestbed is not installed (pip install gctestbed, or pip install -e . in its source "
                        "tree): the image installs what its metadata requires.") from None
    return [r for r in wanted if "extra ==" not in r and re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] != "torch"]


def context(gpu: bool = False) -> bytes:
    """The online build's context, as a tar: the Dockerfile, requirements.txt, and the gctestbed
    package without its byte code."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(DOCKER_DIR / DOCKERFILES[gpu], arcname=DOCKERFILES[gpu])
        text = ("\n".join(requirements()) + "\n").encode()
        info = tarfile.TarInfo("requirements.txt")
        info.size = len(text)
        t.addfile(info, io.BytesIO(text))
        t.add(PACKAGE, arcname="gctestbed", filter=lambda i: None if "__pycache__" in i.name else i)
    return buf.getvalue()


def _registry_reachable(c, base: str) -> bool:
    try:
        c.images.pull(base)
        return True
    except Exception:  # noqa: BLE001 - no registry, no DNS, no route: all mean offline
        return False


def needs_host_mounts(c, name: str) -> bool:
    """Whether image ``name`` is an offline one (runs this host's Python through mounts)."""
    try:
        labels = c.images.get(name).labels or {}
    except Exception:  # noqa: BLE001
        raise UserError(f"there is no image {name}: build it with 'gctestbed image build'.") from None
    return labels.get(HOST_MOUNTS_LABEL) == "1"
