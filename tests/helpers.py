"""Helpers for tests that start real runs: the CLI as a subprocess, runs in this process on one kept
network, and proof that nothing leaked."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import torch

from gctestbed.launch.state import census

SMALL = "mlp:width=512,depth=2,input_dim=512"   # 530,442 parameters: 2.1 MB of fp32 gradient per step


def gctestbed(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gctestbed.cli", *args], capture_output=True, text=True,
                          timeout=kw.pop("timeout", 300), **kw)


def here(*args, env: dict | None = None, check: bool = False, limit_s: int = 900) -> subprocess.CompletedProcess:
    """The same gctestbed command through click in this process (CliRunner): its parsing, its code
    and its exit status, stdout and stderr, without a fresh interpreter's imports (torch's alone is
    3 to 4 s here). For what a command computes, writes or refuses; a command's life as a process of
    its own (its entry point, its imports, signals) is tested by running it as one (``gctestbed``),
    and tests/test_startup.py runs the commands that train nothing that way. ``check``: fail the
    test unless it exits 0. A command still going after ``limit_s`` (as a subprocess's timeout)
    gets TimeoutError wherever it is; an alarm set around it (an outer limit) is kept, less the
    time the command took."""
    from click.testing import CliRunner

    from gctestbed.cli import main

    def too_long(signum, frame):
        raise TimeoutError(f"gctestbed {' '.join(map(str, args))} took over {limit_s} s")
    fired = []

    def outer_fired(signum, frame):       # the outer limit, once: not armed again afterwards
        fired.append(signum)
        if callable(before):
            before(signum, frame)
    before = signal.signal(signal.SIGALRM, too_long)
    outer, began = signal.alarm(limit_s), time.monotonic()
    if outer and outer < limit_s:         # the outer limit comes first: keep it
        signal.signal(signal.SIGALRM, outer_fired)
        signal.alarm(outer)
    try:
        done = CliRunner().invoke(main, [str(a) for a in args], env=env, prog_name="gctestbed", catch_exceptions=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
        if outer and not fired:
            signal.alarm(max(1, round(outer - (time.monotonic() - began))))
    if check:
        assert done.exit_code == 0, (args, done.stderr)
    return subprocess.CompletedProcess(args, done.exit_code, done.stdout, done.stderr)


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gctestbed.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[str, str]:
    """Wait for a CLI started with ``start``; kill its whole session if it outlives ``timeout``."""
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


GRACE_S = 60       # what kept_runs gives a run past its limit to tear itself down


@contextlib.contextmanager
def kept_runs(limit_s: int = 600):
    """Run specs in this process one after another on one kept network and fork server, as a
    sweep's cells (launch/kept.py: re-shaped where they fit; tests/test_kept.py holds plain cells
    to cells on networks of their own, and sweeps run dilated, replayed, CPU-capped and
    native-kernel cells this way): for tests of what a run computes, not of a lone run's own
    start. Yields ``run(**flags) -> run id`` (flags as typed: strings; calibration off), which
    fails the test on a run that did not end ok or took over ``limit_s`` (then SIGTERM tears the
    run down, as Ctrl-C would, and the test gets TimeoutError; a run still going GRACE_S later, or
    stuck where that handler is not in place, gets TimeoutError wherever it is. Checked by hand: a
    3 s limit ended a 200-step run after 3.2 s with nothing left, and a run stuck before its
    handler after the limit and the grace); the network is removed afterwards, pass or fail.
    Ctrl-C during a run stops the test session, as around a subprocess."""
    from gctestbed import flags, interrupts, runner
    from gctestbed.launch.kept import kept_for

    def run(**typed) -> str:
        spec = flags.build_spec(calibrate=False, **typed)
        late = []

        def too_long(signum, frame):
            late.append(True)
            if len(late) > 1:             # still not done GRACE_S later: stop it wherever it is (what it leaves,
                #                           the test's ledger directory undoes)
                raise TimeoutError(f"a run took over {limit_s} s and did not stop within {GRACE_S} s more")
            signal.alarm(GRACE_S)
            # stop the run as Ctrl-C would, where runner.run's own handler will tear it down; elsewhere (its
            # teardown, where signals are ignored, or before that handler) it gets GRACE_S to end on its own
            if getattr(signal.getsignal(signal.SIGTERM), "__module__", None) == interrupts.__name__:
                os.kill(os.getpid(), signal.SIGTERM)
        before = signal.signal(signal.SIGALRM, too_long)
        signal.alarm(limit_s)
        try:
            summary = runner.run(spec, kept=kept)
        except interrupts.Interrupted:
            if late:
                raise TimeoutError(f"a run took over {limit_s} s (torn down)") from None
            raise KeyboardInterrupt from None
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, before)
        if late:
            raise TimeoutError(f"a run took over {limit_s} s")
        assert summary.status == "ok", summary.error
        return summary.run_id

    with kept_for("the test") as kept:
        yield run


def show(results_dir, run_id=None) -> dict:
    """``gctestbed show --json`` of ``run_id`` (the latest run when None), in this process (``here``)."""
    proc = here("show", *([run_id] if run_id else []), "--json", "--results", str(results_dir))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def wait_for_steps(results_dir, at_least: int, timeout_s: float = 120) -> dict:
    """Poll the store until rank 0 has recorded ``at_least`` steps; return the ledger of that run."""
    from gctestbed import results
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(results.db_path(str(results_dir))):
            conn = results.connect(str(results_dir))
            row = conn.execute("SELECT run_id, MAX(step) AS s FROM steps WHERE rank=0").fetchone()
            conn.close()
            if row["s"] is not None and row["s"] + 1 >= at_least:
                return ledger_of(row["run_id"])
        time.sleep(0.2)
    raise AssertionError(f"no {at_least} steps recorded within {timeout_s}s")


def ledger_of(run_id: str) -> dict:
    with open(os.path.join(os.environ["GCTESTBED_STATE_DIR"], f"{run_id}.json")) as f:
        return json.load(f)


def leftovers(run_id: str | None = None) -> list[str]:
    """Everything of run ``run_id`` (of any run, a sweep's kept networks too, when None) still
    on this machine: namespaces, ledger, processes, CPU cgroups."""
    found = census(f"gct-{run_id}-" if run_id else "gct-")
    return [f"{'ledger file' if kind == 'ledgers' else kind} {item}" for kind, items in found.items() for item in items]


@contextlib.contextmanager
def bare_cluster(nodes: int):
    """A cluster 'up' built, its nodes' eth0 handed back unshaped as a real host's NIC is (the
    kernel's default qdisc): (its name, rank 0's address for the rendezvous); down afterwards."""
    from gctestbed.launch.state import find
    from gctestbed.net import namespaces, shaping
    up = gctestbed("up", "--nodes", str(nodes), "--bw", "1gbit")
    assert up.returncode == 0, up.stderr
    name = up.stdout.strip().splitlines()[-1]
    try:
        state = find(name)
        for node in state.meta["nodes"]:
            with namespaces.iproute(node["netns"]) as ipr:
                ipr.tc("del", index=ipr.link_lookup(ifname="eth0")[0], handle=shaping.ROOT, parent=0xFFFFFFFF)
        yield name, state.meta["nodes"][0]["address"]
    finally:
        assert gctestbed("down", name).returncode == 0



FORWARD_S, BACKWARD_S = 0.03, 0.05      # the known pauses of PausedChain's forward and backward


class _Pause(torch.autograd.Function):
    """Sleeps FORWARD_S on the way forward and BACKWARD_S on the way back: known durations, for
    checks of the hook's clocks held against something other than the code."""

    @staticmethod
    def forward(ctx, x):
        time.sleep(FORWARD_S)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(BACKWARD_S)
        return grad


class PausedChain(torch.nn.Module):
    """first, a pause of known length each way, then second: the two layers' gradients reach DDP
    at least BACKWARD_S apart, the second's at least FORWARD_S after the step began."""

    def __init__(self, first, second):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x):
        return self.second(_Pause.apply(self.first(x)))
