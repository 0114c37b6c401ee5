"""The docker launcher: every node is a container from the ``gctestbed-node`` image.

Each container starts with no network of its own (``network_mode=none``) and only NET_ADMIN added
(never privileged). Its network namespace is then named like a netns node's and adopted by the
very same topology code: a bridge in the run's own switch namespace, veth cables, htb on both
ends, netem or the delay line. So the shaping, calibration and records are those of the netns
launcher, and no bridge sits in the host namespace, where a running dockerd's FORWARD policy drops
bridged traffic. Workers run inside the containers through ``docker exec``; containers are in the
run's ledger, so teardown, Ctrl-C and ``gctestbed clean`` remove them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

import psutil

from .. import kernels
from ..spec import RunSpec, UserError
from . import image
from .netns import NetnsCluster
from .network import Shaped
from .protocol import Node
from .state import RunState

SHM_SIZE = "2g"          # Gloo and DataLoader workers use /dev/shm; docker's default 64 MB is too small


class ContainerProcess:
    """A worker started with ``docker exec``, shaped like a Popen: poll, wait, pid."""

    def __init__(self, client, container, argv: list[str], env: dict[str, str], log_path: str, workdir: str):
        self.client = client
        self.exec_id = client.api.exec_create(container.id, argv, environment=env, workdir=workdir)["Id"]
        stream = client.api.exec_start(self.exec_id, stream=True, demux=False)
        self._log = open(log_path, "ab")
        self._pump = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self._pump.start()
        self.pid = 0                       # the engine reports the host pid once the process exists
        deadline = time.monotonic() + 30
        while self.pid <= 0 and time.monotonic() < deadline:
            info = self._inspect()
            self.pid = info["Pid"]
            if self.pid <= 0 and not info["Running"] and info["ExitCode"] is not None:
                break                      # it has already ended
            time.sleep(0.02 if self.pid <= 0 else 0)

    def _copy(self, stream) -> None:
        with contextlib.suppress(Exception):
            for chunk in stream:
                self._log.write(chunk)
                self._log.flush()
        self._log.close()

    def _inspect(self) -> dict:
        return self.client.api.exec_inspect(self.exec_id)

    def poll(self) -> int | None:
        """None while running; else the exit code, or minus the signal that ended it (the engine
        reports 128 + signal, as a shell does), like Popen."""
        info = self._inspect()
        if info["Running"]:
            return None
        code = info["ExitCode"]
        return -(code - 128) if code is not None and 128 < code < 128 + 32 else code

    def wait(self) -> int:
        self._pump.join()
        code = self.poll()
        while code is None:
            self._pump.join(0.1)
            code = self.poll()
        return code

    def kill(self) -> None:
        """SIGKILL the worker and its children (it runs in the container's namespaces, not our group)."""
        if self.pid <= 0:                  # never started, or already gone: never signal pid 0 (our group)
            return
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(self.pid)
            for p in proc.children(recursive=True) + [proc]:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGKILL)


class DockerCluster:
    """N containers joined by shaped links; everything created goes through the ledger."""

    launcher = "docker"

    def __init__(self, spec: RunSpec, state: RunState):
        self.spec, self.state = spec, state
        self.shaped = Shaped(spec, state)
        self.gpu = spec.device == "cuda"
        self.client = None
        self.offline: bool | None = None          # known once the image is inspected in up()
        self.python = "python"
        self.containers: dict[int, object] = {}

    @property
    def network(self):
        return self.shaped.network

    @staticmethod
    def check_host() -> None:
        NetnsCluster.check_host()
        image.client()

    def _volumes(self, offline: bool) -> dict:
        """Read-write: the results directory (the store, the spec, the logs) and the kernels'
        build cache; read-only: the working directory, and for offline images this host's system
        and Python."""
        rw = [os.path.abspath(self.spec.results_dir), str(kernels.build_dir())]
        vols = {p: {"bind": p, "mode": "rw"} for p in rw}
        ro = (image.host_paths() if offline else []) + [os.getcwd()]     # the cwd: users' pkg.module:function
        vols.update({p: {"bind": p, "mode": "ro"} for p in ro if p not in vols and p != "/"})
        return vols

    def up(self) -> list[Node]:
        self.check_host()
        if self.gpu:
            import torch
            if torch.cuda.device_count() < self.spec.world:
                raise UserError(f"--launcher docker with --device cuda gives node i GPU i, and torch sees "
                                f"{torch.cuda.device_count()} for {self.spec.world} nodes: use --launcher netns, "
                                "whose nodes may share a GPU, or fewer nodes.")
        self.client = image.client()
        name = image.tag(self.gpu)
        self.offline = image.needs_host_mounts(self.client, name)
        os.makedirs(kernels.build_dir(), exist_ok=True)
        self.python = sys.executable if self.offline else "python"
        pids = {}
        for rank in range(self.spec.world):
            cname = f"gct-{self.state.run_id}-c{rank}"
            self.state.add("container", name=cname)
            extra = {"nano_cpus": round(self.spec.cpus_per_node * 1e9)} if self.spec.cpus_per_node else {}
            if self.gpu:
                import docker
                extra["device_requests"] = [docker.types.DeviceRequest(device_ids=[str(rank)], capabilities=[["gpu"]])]
            container = self.client.containers.run(
                name, [self.python, "-c", "import signal; signal.pause()"], name=cname, detach=True,
                network_mode="none", cap_add=["NET_ADMIN"], shm_size=SHM_SIZE, volumes=self._volumes(self.offline),
                labels={"gctestbed.run": self.state.run_id}, **extra)
            container.reload()
            if not container.attrs["State"].get("Running"):
                raise UserError(f"container {cname} did not start: {container.logs().decode(errors='replace')[-300:]}")
            self.containers[rank], pids[rank] = container, container.attrs["State"]["Pid"]
        return self.shaped.build(adopt=pids)

    def calibrate(self):
        return self.shaped.calibrate()

    def fault(self, rank: int, kind: str, active: bool, pct: float = 0.0) -> None:
        self.shaped.fault(rank, kind, active, pct)

    def spawn(self, node: Node, argv: list[str], log_path: str, extra_env: dict[str, str] | None = None):
        env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": "/root",
               "THP_MEM_ALLOC_ENABLE": "1", "GCTESTBED_BUILD_DIR": str(kernels.build_dir()), **(extra_env or {}),
               **self.shaped.node_env(node)}
        argv = [self.python if a == sys.executable else a for a in argv]
        proc = ContainerProcess(self.client, self.containers[node.rank], argv, env, log_path, os.getcwd())
        if proc.pid > 0:
            self.state.add("process", name=node.name, pid=proc.pid)
        return proc

    @staticmethod
    def kill(proc) -> None:
        proc.kill()

    def _image(self) -> dict:
        return {"launcher": "docker", "image": image.tag(self.gpu), "offline_image": self.offline}

    def describe(self) -> dict:
        return {**self.shaped.describe(), **self._image(), "workers": "interpreters"}   # one per container

    def final_counters(self) -> dict:
        return {**self.shaped.final_counters(), **self._image()}

    def down(self) -> list[str]:
        return self.state.undo()
