"""The fork server: one interpreter that imports torch and the worker once, then forks a fresh
worker for every node of a run (every cell of a sweep), inside the node's namespace and CPU share.

Starting a worker from scratch costs an interpreter and torch's imports, about 1.5 s of CPU per
node (torch and the lazy import of torch._dynamo by DDP's constructor), which on a 2-core host was
most of a small cell's wall time and, with 64 nodes, over a minute of start-up and 15 GB of
memory. A forked worker starts with those imports done and shares their pages with the server
and every other worker, but it is still a process of its own: its own process group, network
namespace, cgroup, store connection, collectives and exit status, so a crash or a kill ends one
node's worker and nothing else. The server never runs a tensor operation or a collective, so no
Gloo state and no pool of torch's is forked; the one thread its imports start (OpenBLAS's server
thread, by numpy) is not carried into a fork, as POSIX forks only the calling thread. CUDA
workers are not forked (launch/netns.py's ``forks_workers``).

``python -m gctestbed.launch.forkserver SOCKET [PARENT]`` imports, listens on the Unix socket
``SOCKET`` and prints "ready". A client sends one JSON line ``{"argv": [...], "env": {...}, "log": PATH,
"netns": NAME, "cgroup": PATH}`` (the last two may be null) and reads ``{"pid": N}``, then, when
the worker ends, ``{"exit": CODE}`` (negative: killed by that signal, as Popen has it). ``Forked``
is that client, shaped like Popen for the runner (``load_kernels`` asks the server to load the
native kernels first). The server ends when its parent (the run or sweep, whose pid ``PARENT``
is: told, since one that died before the server started would go unseen) does, killing the
workers it still has. ``Server`` starts one under a ledger without waiting for its imports, so a
run builds its network (and the command line imports torch) while the server imports.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import traceback

from ..interrupts import signals_held

READY = "ready"
TICK_S = 1.0         # how often the server looks for its parent's death while idle


class Forked:
    """One worker forked by the fork server; ``poll``, ``wait`` and ``pid`` as Popen's."""

    def __init__(self, socket_path: str, argv: list[str], env: dict[str, str], log_path: str,
                 netns: str | None = None, cgroup: str | None = None, server: "Server | None" = None):
        self.returncode: int | None = None
        self.server = server                   # the Server that forked it (Server.fork), for the run's error
        self.server_lost = False               # the server itself went away: this worker is lost with it
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(socket_path)
        self._file = self._sock.makefile("rwb")
        request = {"argv": argv, "env": env, "log": log_path, "netns": netns, "cgroup": cgroup}
        self._file.write(json.dumps(request).encode() + b"\n")
        self._file.flush()
        reply = self._read()
        if "pid" not in reply:
            self._close()
            if not reply:                      # it ended as it read the request: Server.fork says so
                raise ConnectionResetError(f"the fork server at {socket_path} closed the connection")
            raise RuntimeError(f"the fork server at {socket_path} replied {reply} instead of a worker's pid")
        self.pid: int = reply["pid"]

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._sock], [], [], 0)[0]:
            self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if timeout is not None and not select.select([self._sock], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            self._ended()
        return self.returncode

    def _ended(self) -> None:
        reply = self._read()
        if "exit" not in reply:     # the server itself went away (killed): its worker is gone or orphaned, lost either way
            self.server_lost = True
        self.returncode = reply.get("exit", -signal.SIGKILL)
        self._close()

    def _read(self) -> dict:
        line = self._file.readline()
        return json.loads(line) if line else {}

    def _close(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
            self._sock.close()


class ServerLost(RuntimeError):
    """The fork server had ended (killed) when a node's worker was to be forked: the node is lost
    with it, as a worker it forked before is. The message is the server's last words."""


def _log_beside(socket_path: str) -> str:
    """The server's log, in the directory of its socket."""
    return os.path.join(os.path.dirname(socket_path), "fork.log")


SUN_PATH_MAX = 107      # bytes of a Unix socket's path, its terminating zero left out (sys/un.h's sun_path)


def _socket_path(run_id: str, root: str | None = None) -> str:
    """Where a server's socket goes, in a directory of its own: under the temporary directory, or
    under /tmp where the path there would be too long to bind (a long TMPDIR)."""
    path = os.path.join(root or tempfile.gettempdir(), f"gct-{run_id}-server", "fork.sock")
    return path if root or len(os.fsencode(path)) <= SUN_PATH_MAX else _socket_path(run_id, "/tmp")


class Server:
    """A fork server started under ``state`` (a ledger: its process and its directory, named for
    the ledger so 'gctestbed clean' and a census by run id find it and its workers), not yet
    waited for: ``fork`` waits for its imports the first time, then forks."""

    def __init__(self, state):
        self.state, self.kernels = state, False     # kernels: whether it has loaded the native kernels
        self.socket = _socket_path(state.run_id)
        directory = os.path.dirname(self.socket)
        state.add("dir", name=directory)
        os.makedirs(directory, mode=0o700)
        self._log = _log_beside(self.socket)
        with signals_held(), open(self._log, "ab") as out:      # a Ctrl-C waits until its pid is in the ledger
            self._proc = subprocess.Popen([sys.executable, "-m", "gctestbed.launch.forkserver", self.socket, str(os.getpid())],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=out,
                                          start_new_session=True, text=True)
            state.add("process", name="fork server", pid=self._proc.pid)
        self._ready = False

    def stop(self) -> None:
        """End the server now (a run that forks nothing, whose command started it early); what its
        ledger holds of it is still removed at the run's teardown."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._proc.stdout.close()

    def ended(self) -> bool:
        """Whether the server's process has ended (killed, or failed to start)."""
        return self._proc.poll() is not None

    def ready(self) -> None:
        """Wait until the server listens (its imports done); RuntimeError, with its log's last
        line, if it ended instead."""
        if self._ready:
            return
        if self._proc.stdout.readline().strip() != READY:
            raise RuntimeError(f"the fork server did not start: {self.last_words()}")
        self._proc.stdout.close()
        self._ready = True

    def last_words(self) -> str:
        """How the server ended (where it has) and its log's last line, for an error to quote."""
        from ..session import log_ends
        from .protocol import exit_text
        code = self._proc.poll()
        return "; ".join(([] if code is None else [f"the server {exit_text(code)}"]) + [log_ends(self._log)])

    def fork(self, argv: list[str], env: dict[str, str], log_path: str, netns: str | None, cgroup: str | None,
             kernels: bool) -> "Forked":
        """Our worker (``python -m gctestbed.worker ARGS``) forked into ``netns`` and ``cgroup``;
        ``kernels``: the run uses the native kernels, which the server then loads first (once)."""
        if argv[1:3] != ["-m", "gctestbed.worker"]:
            raise ValueError(f"a fork server forks only gctestbed's worker, not {argv}")
        self.ready()
        try:
            if kernels and not self.kernels and not self.ended():
                self.kernels = load_kernels(self.socket)
                if not self.kernels:           # its forks would run the torch reference while the run records native
                    raise RuntimeError(f"the fork server could not load the native kernels this run has: {self.last_words()} "
                                       "(--kernels torch runs without them)")
            if not self.ended():
                return Forked(self.socket, argv[3:], env, log_path, netns=netns, cgroup=cgroup, server=self)
        except (ConnectionError, FileNotFoundError):   # refused or cut off: the server ended just now (else ours)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=2)
            if not self.ended():
                raise
        raise ServerLost(self.last_words())


def _child(request: dict) -> None:
    """In the forked child: become the worker ``request`` describes, then end with its status."""
    code = 1
    try:
        os.setsid()                   # its own process group: the runner kills it and what it starts
        if request.get("netns"):
            from ..net import namespaces
            namespaces.enter(request["netns"])
        if request.get("cgroup"):
            from . import cpushare
            cpushare.join(request["cgroup"])
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)   # as a fresh interpreter has it: a write to a dead peer
                                                        # is an error the worker reports, not a death by signal
        signal.set_wakeup_fd(-1)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        os.environ.clear()
        os.environ.update(request["env"])
        from .. import worker
        worker.main(request["argv"])
        code = 0
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - the worker's own failure, told in its log as Python would
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def load_kernels(socket_path: str) -> bool:
    """Have the server load the native compressor kernels, so workers forked from then on have
    them (each would otherwise load them itself); whether they loaded. Asked for only once the
    run's (or sweep's) own process has them, built and fresh, so the server never builds."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(socket_path)
        s.sendall(json.dumps({"load": "kernels"}).encode() + b"\n")
        reply = s.makefile("rb").readline()
    if not reply:
        raise ConnectionResetError("the fork server closed the connection")      # it ended: Server.fork says so
    return bool(json.loads(reply).get("loaded"))


def _load_kernels(conn: socket.socket) -> None:
    from .. import kernels
    loaded = kernels.load("native") is not None
    with conn:
        conn.sendall(json.dumps({"loaded": loaded}).encode() + b"\n")


def serve(socket_path: str, parent: int | None = None) -> None:
    """Fork workers on request at ``socket_path`` for as long as ``parent`` (the process that
    started the server, which says so: one that died before the server read its own parent
    would otherwise go unseen) lives; without it, the parent the server has as it starts."""
    parent = parent or os.getppid()       # before the imports: a parent that dies during them is seen after
    import torch  # noqa: F401 - imported once here, inherited by every worker
    import torch._dynamo  # noqa: F401 - DDP's constructor imports it lazily: 1.4 s of CPU per worker otherwise
    from .. import compress, optimizers, workloads, worker  # noqa: F401 - likewise
    from ..comm import local, ps, server  # noqa: F401
    from ..net import namespaces  # noqa: F401
    from . import cpushare  # noqa: F401
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    listener.bind(socket_path)
    listener.listen(64)
    clients: dict[int, socket.socket] = {}      # worker pid -> the connection that asked for it
    print(READY, flush=True)
    try:
        while os.getppid() == parent:
            readable, _, _ = select.select([listener, wake_r], [], [], TICK_S)
            if wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
            if listener in readable:
                conn, _ = listener.accept()
                request = json.loads(conn.makefile("rb").readline() or b"{}")
                if request.get("load") == "kernels":
                    _load_kernels(conn)
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for c in clients.values():
                        c.close()
                    conn.close()
                    _child(request)
                clients[pid] = conn
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            while clients:                    # after a fork too: a worker may end before it is listed
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                conn = clients.pop(pid, None)
                if conn is not None:
                    with contextlib.suppress(OSError):
                        conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                    conn.close()
    finally:
        for pid in clients:                   # the sweep is gone: so are the cells it started
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
