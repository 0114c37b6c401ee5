"""What ``gctestbed verify`` runs for a method whose contract has phases (no run started): every
phase gets judged steps whatever options were typed, or the options are refused in one sentence."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from gctestbed import compress, contracts, verify
from gctestbed.spec import SpecError


def judged_steps(text: str, steps: int = verify.STEPS) -> list[list[int]]:
    """Per phase of ``text``'s schedule, the steps a run of steps_for's length would judge."""
    name, options = compress.resolve(text)
    n = verify.steps_for(text, steps)
    return [[s for s in range(contracts.FIRST_JUDGED, n) if p.holds(s)] for p in contracts.phases(name, options)]


def test_methods_typed_without_options_are_judged_in_every_phase():
    """The issue's 'dgc;powersgd': DGC's four warm-up epochs and its final density, PowerSGD's dense
    start and its compressed steps each get judged steps (the last phase at least two)."""
    dgc, powersgd = verify.methods_from(("dgc;powersgd",))
    assert judged_steps(dgc) == [[2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13]]
    assert judged_steps(powersgd) == [[2, 3], [4, 5, 6, 7]]
    for text in verify.methods_from(()):                        # every method, as the suite runs them
        assert all(judged_steps(text)) and len(judged_steps(text)[-1]) >= 2, text


def test_typed_schedules_are_kept_and_run_long_enough():
    (text,) = verify.methods_from(("powersgd:start_iter=10,rank=1",))
    assert text == "powersgd:start_iter=10,rank=1" and verify.steps_for(text, 8) == 12
    assert judged_steps(text) == [list(range(2, 10)), [10, 11]]
    assert verify.methods_from(("dgc:ratio=0.01",)) == ["dgc:ratio=0.01,steps_per_epoch=3"]


def test_a_phase_verify_cannot_judge_is_refused_in_one_sentence():
    """The first through the command (exit 2, one sentence, no traceback: 4 s of torch's import
    each); the others where the command takes its sentence from, verify.methods_from."""
    refusals = (("dgc:steps_per_epoch=1", "warm-up epoch 0 (density 0.25) in step 0"),
                ("powersgd:start_iter=2", "dense start (all-reduced whole) in steps 0-1"),
                ("dgc:steps_per_epoch=50", "needs 202 steps"))
    text, words = refusals[0]
    proc = subprocess.run([sys.executable, "-m", "gctestbed", "verify", "--compressor", text],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for text, words in refusals:
        with pytest.raises(SpecError, match=re.escape(words)):
            verify.methods_from((text,))


def test_the_table_names_every_methods_phases_and_the_steps_judged_in_each():
    """What verify prints says, per method, which phases it judged on which steps (a report of
    two methods of one phase and one of two, rendered to text)."""
    from rich.console import Console
    from gctestbed.cli.render import verify_table

    def method(name, phases):
        return {"method": name, "contract_bytes": 1000, "counters_bytes": 1010, "ratio_to_none": 1.0,
                "exchanges_per_step": 2, "collectives_per_step": 2, "sent_fraction": None, "ok": True,
                "problems": [], "phases": [{"phase": p, "steps_judged": s} for p, s in phases]}
    none = method("none", [("every step", [2, 3, 4, 5, 6, 7])])
    report = {"nodes": 2, "bw": "1gbit", "workload": "mlp", "model_numel": 10, "none": {**none, "steps_judged": [2, 7]},
              "methods": [none, method("fp16", [("every step", [2, 3, 4, 5, 6, 7])]),
                          method("powersgd", [("dense start", [2, 3]), ("compressed (rank 2)", [4, 5, 6, 7])])]}
    console = Console(width=200, record=True)
    console.print(verify_table(report))
    text = console.export_text()
    assert "none, fp16: one phase, steps 2-7" in text
    assert "powersgd: dense start steps 2-3; compressed (rank 2) steps 4-7" in text
