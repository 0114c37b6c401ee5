"""Every mistake a user can type ends in one sentence on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

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
