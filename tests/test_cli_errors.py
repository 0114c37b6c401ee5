"""Every mistake a user can type ends in one sentence on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from gctestbed.cli import main
from helpers import leftovers


@pytest.mark.parametrize("args, fragment", [
    (["--bw", "0mbit"], "greater than zero"),
    (["--bw", "100"], "bare number"),
    (["--bw", "fast"], "not a number"),
    (["--bw", "-1gbit"], "negative"),
    (["--nodes", "0"], "--nodes must be a whole number from 1 to 64"),
    (["--nodes", "65"], "from 1 to 64"),
    (["--nodes", "two"], "--nodes must be a whole number"),
    (["--latency", "5"], "has no unit"),
    (["--compressor", "zip"], "unknown compressor 'zip'; available: bf16, dgc, efsignsgd"),
    (["--compressor", "fp16:level=3"], "has no option 'level'"),
    (["--workload", "resnet"], "unknown workload 'resnet'"),
    (["--workload", "mlp:width=wide"], "not a valid int"),
    (["--workload", "mlp:depth=0"], "depth must be 1..64"),
    (["--steps", "0"], "--steps must be"),
])
def test_bad_flags_exit_2_with_one_line(args, fragment, tmp_path):
    result = CliRunner().invoke(main, ["run", "--results", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_without_root_exit_2(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = CliRunner().invoke(main, ["run", "--results", str(tmp_path)])
    assert result.exit_code == 2
    assert "needs root" in result.output and "sudo" in result.output
    assert not (tmp_path / "gctestbed.sqlite").exists()


def test_show_without_store_exit_2(tmp_path):
    result = CliRunner().invoke(main, ["show", "--results", str(tmp_path / "none")])
    assert result.exit_code == 2
    assert "no results store" in result.output


def test_help_explains_tc_units():
    result = CliRunner().invoke(main, ["run", "--help"])
    assert result.exit_code == 0
    assert "BYTES per second" in result.output and "BITS per second" in result.output


@pytest.mark.root
def test_console_script_reports_errors_without_traceback(tmp_path, state_dir):
    """And the fork server the command started before it read the flags (runner.early_start) is
    gone with its ledger."""
    proc = subprocess.run([sys.executable, "-m", "gctestbed.cli", "run", "--bw", "1g", "--results", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("gctestbed: bandwidth '1g'") and "Traceback" not in proc.stderr
    assert [n for n in os.listdir(state_dir) if n.endswith(".json")] == [] and leftovers() == []   # no ledger, no process


@pytest.mark.root
@pytest.mark.parametrize("delay_s", [0.0, 0.15, 0.3])
def test_a_command_stopped_while_it_reads_its_flags_leaves_nothing(tmp_path, state_dir, delay_s):
    """SIGTERM after the early start (its ledger written) and ``delay_s`` more, while the command
    imports torch to read its flags (some 1.5 s more here) and the fork server imports it too: the
    fork server and the ledger are gone, exit 130, one line saying so, and no run went ahead.
    Plants: early_start without signals_raise (the server outlives the command, exit -15); the
    handler raising inside imports (torch._C's init swallowed it at 0.27-0.45 s: the run went ahead,
    exit 0); no raise_deferred at the run's start (the run started, then was torn down)."""
    proc = subprocess.Popen([sys.executable, "-m", "gctestbed.cli", "run", "--nodes", "2", "--steps", "1",
                             "--no-calibrate", "--results", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not [n for n in os.listdir(state_dir) if n.endswith(".json")]:
            assert proc.poll() is None and time.monotonic() < deadline, "no early start was made"
            time.sleep(0.01)
        time.sleep(delay_s)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted before the run started" in err and "Traceback" not in err, (proc.returncode, err)
    assert not (tmp_path / "gctestbed.sqlite").exists()                # no run went ahead
    assert [n for n in os.listdir(state_dir) if n.endswith(".json")] == [] and leftovers() == []


@pytest.mark.parametrize("where", ["verify", "bench_scale", "run_flags"])
def test_an_interruption_no_command_reports_exits_130_in_one_line(monkeypatch, tmp_path, where):
    """Ctrl-C (KeyboardInterrupt) or a run's SIGTERM (interrupts.Interrupted) out of any command: one
    line and 130, not a traceback (Interrupted) or click's "Aborted!" and 1 (KeyboardInterrupt).
    Planted: the group without its handler (verify: a traceback, exit 1)."""
    from gctestbed import flags, interrupts, verify
    from gctestbed.bench import scale

    def stop(*args, **kwargs):
        raise (KeyboardInterrupt if where == "run_flags" else interrupts.Interrupted("SIGTERM"))
    if where == "verify":
        monkeypatch.setattr(verify, "run", stop)
        args = ["verify", "--compressor", "fp16", "--results", str(tmp_path)]
    elif where == "bench_scale":
        monkeypatch.setattr(scale, "run", stop)
        args = ["bench", "scale", "--nodes", "2", "--results", str(tmp_path)]
    else:                                      # no early start (docker nodes): Ctrl-C while the flags are read
        monkeypatch.setattr(flags, "build_spec", stop)
        args = ["run", "--launcher", "docker", "--results", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130, (result.exit_code, result.output, result.exception)
    assert result.output.strip() == "gctestbed: interrupted ('gctestbed clean' removes anything it left behind)", result.output


def test_a_signal_as_the_run_ends_says_the_run_ended_and_how_it_is_recorded(monkeypatch, tmp_path):
    """Ctrl-C or SIGTERM after runner.run returned, while the early start still holds its handler:
    the run is done and recorded, so it is not said to have been stopped before it started (a
    reviewer's case). Planted: the branch for it removed (it fails)."""
    import contextlib
    from types import SimpleNamespace
    from gctestbed import interrupts, runner

    @contextlib.contextmanager
    def early_start(*args):
        yield None
        raise interrupts.Interrupted("SIGINT")              # the signal, as the with ends
    monkeypatch.setattr(runner, "early_start", early_start)
    monkeypatch.setattr(runner, "run", lambda *a, **k: SimpleNamespace(run_id="abc123", status="ok"))
    result = CliRunner().invoke(main, ["run", "--results", str(tmp_path)])
    assert result.exit_code == 130, (result.output, result.exception)
    assert "interrupted after run abc123 ended; it is recorded as ok" in result.output, result.output


def test_a_signal_as_runner_run_returns_names_the_run_that_started(monkeypatch, tmp_path):
    """The signal after runner.run took the early start but before its summary reached the
    command (Interrupted with no run id): the run it started is named, not said never to have
    started. Planted: that branch removed ("before the run started")."""
    import contextlib
    from types import SimpleNamespace
    from gctestbed import interrupts, runner
    early = SimpleNamespace(taken=False, state=SimpleNamespace(run_id="def456"))

    @contextlib.contextmanager
    def early_start(*args):
        yield early

    def run(*args, **kwargs):
        early.taken = True
        raise interrupts.Interrupted("SIGTERM")                # as it returned: no run id on it
    monkeypatch.setattr(runner, "early_start", early_start)
    monkeypatch.setattr(runner, "run", run)
    result = CliRunner().invoke(main, ["run", "--results", str(tmp_path)])
    assert result.exit_code == 130, (result.output, result.exception)
    assert "interrupted as run def456 ended ('gctestbed show def456' says how)" in result.output, result.output


def test_the_in_process_helper_keeps_an_outer_time_limit():
    """``here`` sets its own alarm; a limit armed around it (a test's own) must survive, less the time taken."""
    import signal

    from helpers import here
    signal.alarm(300)
    try:
        assert here("--help", check=True).returncode == 0
        left = signal.alarm(0)
    finally:
        signal.alarm(0)
    assert 290 <= left <= 300, left


def test_the_in_process_helper_lets_a_shorter_outer_limit_fire_once(monkeypatch):
    """An outer alarm due before the helper's own limit fires on time, once, and is not armed again."""
    import signal
    import time

    from click.testing import CliRunner

    from helpers import here

    class Slow(Exception):
        pass

    def slow(self, *args, **kwargs):
        time.sleep(2.5)
        raise Slow
    monkeypatch.setattr(CliRunner, "invoke", slow)
    calls = []
    before = signal.signal(signal.SIGALRM, lambda signum, frame: calls.append(time.monotonic()))
    began = time.monotonic()
    try:
        signal.alarm(1)
        with pytest.raises(Slow):
            here("--help")
        time.sleep(2.0)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    assert len(calls) == 1 and 0.9 <= calls[0] - began <= 1.5, [c - began for c in calls]
