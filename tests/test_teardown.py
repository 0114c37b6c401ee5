"""After a normal run, Ctrl-C, kill -9 of a worker or of gctestbed itself (then 'clean'): nothing of ours remains."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time

import psutil
import pytest

from helpers import SMALL, finish, gctestbed, leftovers, show, start, wait_for_steps

pytestmark = [pytest.mark.root, pytest.mark.slow]
LONG = ("run", "--nodes", "2", "--bw", "1gbit", "--workload", SMALL, "--steps", "100000", "--no-calibrate")


def test_ctrl_c_tears_down_and_records_failed(tmp_path, state_dir):
    proc = start(*LONG, "--results", str(tmp_path))
    run_id = wait_for_steps(tmp_path, 3)["run_id"]
    proc.send_signal(signal.SIGINT)
    _, err = finish(proc)
    assert proc.returncode == 130, err
    assert leftovers(run_id) == []
    s = show(tmp_path, run_id)
    assert s["status"] == "failed" and "interrupted" in s["error"]
    assert s["steps_recorded"] >= 3


def test_kill_9_of_a_worker_fails_the_run_naming_the_node(tmp_path, state_dir):
    proc = start(*LONG, "--results", str(tmp_path))
    ledger = wait_for_steps(tmp_path, 3)
    worker = next(o for o in ledger["objects"] if o["kind"] == "process" and o["name"].endswith("-n1"))
    os.kill(worker["pid"], signal.SIGKILL)
    _, err = finish(proc)
    assert proc.returncode == 1, err
    assert gctestbed("clean").returncode == 0
    assert leftovers(ledger["run_id"]) == []
    s = show(tmp_path, ledger["run_id"])
    assert s["status"] == "failed"
    assert "node 1" in s["error"] and "SIGKILL" in s["error"] and "after step" in s["error"]
    assert s["steps_recorded"] >= 3


def test_kill_9_of_the_fork_server_fails_the_run_naming_it_not_a_signal(tmp_path, state_dir):
    """The workers' fork server killed mid-run: the error says the server ended, not that a node
    was killed by SIGKILL (which it was not: its worker is orphaned, and removed at teardown).
    Planted: the server's end read as the worker's SIGKILL, as it was before."""
    proc = start(*LONG, "--results", str(tmp_path))
    ledger = wait_for_steps(tmp_path, 3)
    server = next(o for o in ledger["objects"] if o["kind"] == "process" and o["name"] == "fork server")
    os.kill(server["pid"], signal.SIGKILL)
    _, err = finish(proc)
    assert proc.returncode == 1, err
    assert leftovers(ledger["run_id"]) == []
    s = show(tmp_path, ledger["run_id"])
    assert s["status"] == "failed" and "the fork server, which ended during the run" in s["error"], s["error"]
    assert "(the server was killed by SIGKILL; " in s["error"] and not re.search(r"-n\d\) was killed by", s["error"]), s["error"]


def test_clean_after_kill_9_of_gctestbed_itself(tmp_path, state_dir):
    proc = start(*LONG, "--results", str(tmp_path))
    ledger = wait_for_steps(tmp_path, 2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert leftovers(ledger["run_id"]) != []       # the dead run really left things behind
    result = gctestbed("clean")
    assert result.returncode == 0 and ledger["run_id"] in result.stdout
    assert leftovers(ledger["run_id"]) == []
    s = show(tmp_path, ledger["run_id"])
    assert s["status"] == "failed" and "gctestbed clean" in s["error"]


def test_clean_leaves_live_runs_and_foreign_namespaces_alone(tmp_path, state_dir, monkeypatch):
    from gctestbed.launch.state import RunState
    from gctestbed.net import namespaces
    live = RunState.create()
    foreign = f"gct-notours-{os.getpid()}"
    with monkeypatch.context() as m:      # recorded where 'clean' does not look, for the next session
        m.setenv("GCTESTBED_STATE_DIR", f"{state_dir}-foreign")     # to undo if this one is killed
        keeper = RunState.create()
    try:
        live.add("netns", name=f"gct-{live.run_id}-sw")
        namespaces.create(f"gct-{live.run_id}-sw")
        keeper.add("netns", name=foreign)
        namespaces.create(foreign)
        result = gctestbed("clean")
        assert result.returncode == 0 and "nothing to clean" in result.stdout
        assert namespaces.exists(f"gct-{live.run_id}-sw") and namespaces.exists(foreign)
    finally:
        assert keeper.undo() == [] and live.undo() == []
        shutil.rmtree(f"{state_dir}-foreign", ignore_errors=True)


def test_a_normal_run_leaves_nothing(tmp_path, state_dir):
    """Three nodes and a delay line. Without calibration: what a calibrated run leaves (its probes'
    processes among them) tests/test_calibration.py checks after each of its calibrated runs."""
    before = {p.pid for p in psutil.process_iter()}
    proc = gctestbed("run", "--nodes", "3", "--bw", "1gbit", "--workload", SMALL, "--steps", "2", "--latency", "1ms",
                     "--no-calibrate", "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    s = show(tmp_path)
    assert s["latency_impl"] in ("netem", "delayline")
    assert leftovers(s["run_id"]) == []
    time.sleep(0.2)
    # its workers (forked: they carry the fork server's command line) and the fork server itself
    ours = ("gctestbed.worker", "gctestbed.launch.forkserver")
    new = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before and any(o in " ".join(p.info["cmdline"] or []) for o in ours)]
    assert new == []
    assert s["environment"]["shaping"]["workers"] == "forked"


def test_a_signal_in_a_run_is_not_swallowed_by_a_librarys_except_exception():
    """interrupts.signals_raise turns SIGTERM into Interrupted, a BaseException as KeyboardInterrupt is:
    an 'except Exception' in code the run calls (an import, a build) lets it through, and the run
    is torn down. Planted: Interrupted an Exception, which that handler swallowed."""
    from gctestbed import interrupts
    with pytest.raises(interrupts.Interrupted):
        with interrupts.signals_raise():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            except Exception:  # noqa: BLE001 - what a library might do
                pass


def test_a_signal_inside_an_import_is_sent_again_once_the_import_is_done(tmp_path, monkeypatch):
    """An import's C init can swallow what a handler raises (torch._C importing numpy did: a run
    stopped while torch imported went ahead), so a signal inside an import raises Interrupted only
    once the import is done. A module that signals itself mid-body stands in for that import.
    Planted: the handler raising inside imports (the module's body is cut short)."""
    from gctestbed import interrupts
    (tmp_path / "gct_signals_itself.py").write_text(
        "import os, signal, sys, time\nfrom gctestbed import interrupts\nIMPORTING = interrupts._importing(sys._getframe())\n"
        "os.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(0.2)\nFINISHED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    imported = None
    with pytest.raises(interrupts.Interrupted):
        with interrupts.signals_raise():
            import gct_signals_itself as imported
            time.sleep(5)                        # the signal sent again lands here
    assert imported is not None and imported.FINISHED and imported.IMPORTING    # seen as inside an import
    assert not interrupts._importing(sys._getframe())
    del sys.modules["gct_signals_itself"]


def test_a_signal_held_back_raises_where_its_block_ends_inside_the_callers_try(tmp_path, monkeypatch):
    """A signal held back inside an import, still waiting when its signals_raise ends, raises
    Interrupted there: inside the caller's try, so its teardown runs (sent 50 ms later instead, it
    met the default action, death by SIGTERM with no teardown: helper-89); nested, it reaches the
    outer block at once. One sent again while teardown ignores signals raises at the block's end
    too, and nothing is left waiting for a next run. Plants that fail: the signal sent to itself at
    the end (this test's process dies, rc 143); no raise at the end (DID NOT RAISE)."""
    from gctestbed import interrupts
    (tmp_path / "gct_signals_itself_fast.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def import_it():
        sys.modules.pop("gct_signals_itself_fast", None)
        __import__("gct_signals_itself_fast")
    reached, torn_down = [], []
    with pytest.raises(interrupts.Interrupted):
        try:
            with interrupts.signals_raise():               # a lone run's: the default action outside it
                import_it()
            reached.append("after the block")
        finally:
            torn_down.append(True)
    assert reached == [] and torn_down == [True] and interrupts.waiting() == []
    with pytest.raises(interrupts.Interrupted):
        with interrupts.signals_raise():                  # what handles it once the inner one has ended
            with interrupts.signals_raise():
                import_it()
            reached.append("after the inner block")
            time.sleep(1)
    assert reached == [] and interrupts.waiting() == []
    monkeypatch.setattr(interrupts, "RESIGNAL_S", 0.3)    # room for the check below on a slow host
    with pytest.raises(interrupts.Interrupted):
        with interrupts.signals_raise():
            import_it()                                # held back: sent again RESIGNAL_S later
            assert interrupts.waiting() == [signal.SIGTERM]
            with interrupts.signals_ignored():           # teardown: the re-send lands here
                time.sleep(1.0)
    assert interrupts.waiting() == []
    interrupts.raise_deferred()                           # nothing waits: a next run starts
    sys.modules.pop("gct_signals_itself_fast", None)


def test_a_signal_inside_a_held_section_waits_for_its_end():
    """Server's Popen and its ledger entry are one signals_held section: a SIGTERM there lets the
    section finish (the pid written) and raises Interrupted at its end. Planted: signals_held a
    no-op (the section was cut short)."""
    from gctestbed import interrupts
    done = []
    with pytest.raises(interrupts.Interrupted):
        with interrupts.signals_raise():
            with interrupts.signals_held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(2 * interrupts.RESIGNAL_S)     # the re-sends land here, and wait too
                done.append("the section's end")
            done.append("after the section")
    assert done == ["the section's end"] and interrupts.waiting() == []


def test_an_error_quotes_the_last_line_of_a_log_that_says_something(tmp_path):
    """session.log_ends, the one reader of a log's last words (the fork server's, a node's, srun's):
    blank lines skipped, 300 characters at most, a missing or empty log said to be empty."""
    from gctestbed.session import log_ends
    log = tmp_path / "x.log"
    assert log_ends(str(log)) == "its log is empty"
    log.write_text("first\n  \n")
    assert log_ends(str(log)) == "its log ends: first"
    log.write_text("first\n" + "y" * 400 + "\n\n   \n")
    assert log_ends(str(log)) == "its log ends: " + "y" * 300
    log.write_text("task 1: KeyError: 'x'\n\nsrun: error: task 1: Exited with exit code 1\n")
    assert log_ends(str(log), name="output", last=3) == \
        "its output ends: task 1: KeyError: 'x' / srun: error: task 1: Exited with exit code 1"


def test_a_re_send_taken_while_it_fires_sends_nothing():
    """A re-send whose timer has fired as the main thread takes it (raise_deferred at a run's start,
    a block's end) must not send: sent after its handler was put back, a lone run's default action
    would kill the process before its teardown (helper-92). The re-send checks and sends under the
    lock a take holds. Planted: no lock in the re-send (it sent, got == [1])."""
    import threading
    from gctestbed import interrupts
    got = []
    old = signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
    me = object()
    try:
        with interrupts._state.lock:                           # the take, under way
            interrupts._state.resends[signal.SIGUSR1] = me
            fired = threading.Thread(target=interrupts._resend, args=(os.getpid(), signal.SIGUSR1, me))
            fired.start()
            time.sleep(0.2)                                    # the timer fired: it waits for the lock
            interrupts._state.resends.clear()                  # taken
        fired.join(5)
        time.sleep(0.1)
        assert got == [] and not fired.is_alive()
    finally:
        interrupts._state.resends.clear()
        signal.signal(signal.SIGUSR1, old)
