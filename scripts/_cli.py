"""What the measurement scripts share: this checkout's gctestbed run as a child process, and the
heavy-job lock a timed command holds, so two timed jobs never run at once on a shared host (other
heavy jobs interleave between commands). Imported by the scripts beside it, never by the product."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# this checkout's gctestbed first, whatever is installed: the figures are this code's
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ['PYTHONPATH']}" if os.environ.get("PYTHONPATH") else str(ROOT)}


def command(*args: str) -> list[str]:
    """The argument vector of ``gctestbed ARGS`` run from this checkout (with ENV)."""
    return [sys.executable, "-m", "gctestbed.cli", *args]


@contextlib.contextmanager
def held(lock: str | None):
    """``flock LOCK`` for the body's length, as flock(1) takes it; nothing when ``lock`` is empty."""
    with open(lock or os.devnull, "a") as f:
        if lock:
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def gctestbed(*args: str, lock: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``gctestbed ARGS`` from this checkout, under ``lock`` when one is given; with ``check``, a
    failure ends the script with the command and its error's tail."""
    with held(lock):
        done = subprocess.run(command(*args), capture_output=True, text=True, env=ENV)
    if check and done.returncode:
        sys.exit(f"gctestbed {' '.join(args)}: {done.stderr[-2000:]}")
    return done
