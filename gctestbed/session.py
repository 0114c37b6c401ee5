"""One run's records, whatever launched its nodes: its directory, spec.json, the environment
record, calibration, the store's start and finish, and the qdisc statistics at the end.

The netns, docker and hosts launchers all open a Session, so a run looks the same in the store
however it ran; they differ only in how nodes start and what shaping they describe.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import sqlite3
from importlib import metadata
from typing import Callable

from . import __version__, kernels, results
from .net import calibrate
from .spec import RunSpec


def environment() -> dict:
    """What the run ran on, so a stored run can be reproduced and compared."""
    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None
    cpu = next((line.split(":", 1)[1].strip() for line in read_text("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor())
    return {"hostname": socket.gethostname(), "kernel": platform.release(), "python": platform.python_version(),
            "torch": version("torch"), "pyroute2": version("pyroute2"), "gctestbed": __version__,
            "gctestbed_path": os.path.dirname(os.path.abspath(__file__)), "cpu": cpu, "cpus": os.cpu_count()}


def read_text(path: str) -> str:
    """A file's text, or '' where it cannot be read (a log not written yet)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def log_lines(path: str) -> list[str]:
    """A log's lines that say something, stripped (none where it cannot be read)."""
    return [line.strip() for line in read_text(path).splitlines() if line.strip()]


def log_ends(path: str, lines: list[str] | None = None, name: str = "log", last: int = 1) -> str:
    """What a process's log says last, for an error to quote: 'its log ends: LINE' (at most 300
    characters; ``last`` lines joined by ' / ', their last 300), or 'its log is empty' (``lines``:
    the log's, where read already; ``name``: what to call it)."""
    lines = log_lines(path) if lines is None else lines
    if not lines:
        return f"its {name} is empty"
    return f"its {name} ends: " + (lines[-1][:300] if last == 1 else " / ".join(lines[-last:])[-300:])


def resolve(spec: RunSpec, run_id: str, on_phase: Callable[[str], None] = lambda text: None) -> RunSpec:
    """What only the run can settle, filled in a copy: its id, and the kernels that really run
    (the torch reference where the method has no native kernels or they cannot be built)."""
    from . import compress                 # (torch: a run's, not every command's that imports this module)
    kernel_mode = spec.kernels
    if kernel_mode == "native":
        wanted = compress.get(spec.compressor).has_kernels
        if wanted:
            on_phase("building native kernels")
        if not wanted or kernels.load("native") is None:
            kernel_mode = "torch"
    return spec.replace(run_id=run_id, kernels=kernel_mode)


class Session:
    """The records of run ``spec`` (resolved: its run id set). ``shared``: other hosts write the
    same store and one of them may have started the run already."""

    def __init__(self, spec: RunSpec, shared: bool = False):
        self.spec, self.shared = spec, shared
        self.run_dir = os.path.join(os.path.abspath(spec.results_dir), "runs", spec.run_id)
        self.spec_path = os.path.join(self.run_dir, "spec.json")
        self.recorder: results.Recorder | None = None
        self.counters_error: str | None = None     # why read_counters got nothing (stored by finish)

    def start(self, launcher: str, shaping: dict, **extra) -> results.Recorder:
        """Write spec.json (the run directory is the owner's, like the store) and start the run in
        the store with the environment record."""
        os.makedirs(self.run_dir, exist_ok=True)
        os.chmod(self.run_dir, 0o700)
        with open(self.spec_path, "w") as f:
            f.write(self.spec.to_json())
        self.recorder = results.Recorder(self.spec.results_dir, self.spec.run_id)
        with contextlib.suppress(sqlite3.IntegrityError) if self.shared else contextlib.nullcontext():
            self.recorder.start_run(self.spec, {**environment(), "launcher": launcher, "shaping": shaping, **extra})
        return self.recorder

    def log_path(self, name: str) -> str:
        return os.path.join(self.run_dir, f"{name}.log")

    def calibrate(self, measure: Callable[[], list[calibrate.PathResult]]) -> str | None:
        """Store every path ``measure`` returns; the error that stops the run when one misses."""
        paths = measure()
        stored = self.shared and results.has_calibration(self.recorder.conn, self.spec.run_id)   # another host did
        for p in paths if not stored else []:
            self.recorder.calibration(p.to_dict())
        misses = [p.miss for p in paths if p.miss]
        if misses and not self.spec.accept_miss:
            return (f"calibration: {'; '.join(misses)} (more than {calibrate.TOLERANCE:.0%} off: the host may be too "
                    "slow for this rate, or something else shapes these links; --accept-miss runs anyway, "
                    "--no-calibrate skips)")
        return None

    def read_counters(self, read: Callable[[], dict]) -> dict | None:
        """The qdisc statistics ``read`` returns, while the shaping still exists (before teardown);
        None where they cannot be read (a network that was never built, or half torn down), and
        then why is kept in ``counters_error`` and stored with the run by ``finish``, so a missing
        figure says what went wrong."""
        try:
            return read()
        except Exception as e:  # noqa: BLE001 - the run's outcome matters more; the reason is stored
            self.counters_error = f"{type(e).__name__}: {e}"
            return None

    def finish(self, status: str, error: str | None, qdisc_stats: dict | None, phases: dict | None = None,
               host_cpu: dict | None = None) -> None:
        """Store the qdisc statistics (read before teardown), or why they could not be read
        (``counters_error``), the seconds each phase of the run took, the host's CPU samples
        taken while the steps went (hostcpu.Sampler.record), and the run's outcome. StoreError
        propagates: the caller keeps the outcome for 'gctestbed clean'."""
        if self.recorder is None:
            return
        extra = {**({"qdisc_stats": qdisc_stats} if qdisc_stats is not None else {}),
                 **({"counters_error": self.counters_error} if self.counters_error else {}),
                 **({"phases": phases} if phases else {}),
                 **({"host_cpu": host_cpu} if host_cpu else {})}
        if extra:
            with contextlib.suppress(results.StoreError):
                self.recorder.update_environment(**extra)
        self.recorder.finish_run(status, error)

    def summary(self) -> results.RunSummary:
        """The run's summary from the store (results.summarize), then the store is closed."""
        summary = results.summarize(self.recorder.conn, results.find_run(self.recorder.conn, self.spec.run_id))
        self.close()
        return summary

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
