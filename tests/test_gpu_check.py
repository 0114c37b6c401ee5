"""scripts/gpu-check, the GPU half's one entry point: its dry run works here, so a session lent a
GPU spends the device's time measuring (issue 30's first step)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu-check"


def _check(tmp_path, *args):
    return subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=300)


def test_dry_run_records_the_machine_and_lists_the_gpu_commands(tmp_path):
    done = _check(tmp_path, "--only", "env,cuda-tests")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    steps = {s["name"]: s for s in summary["steps"]}
    assert summary["dry_run"] is True and list(steps) == ["env", "cuda-tests"]
    assert steps["env"]["status"] == "ok", steps["env"]
    facts = json.loads((tmp_path / "env.json").read_text())
    assert facts["python"] and "torch" in facts and facts["modules"]["click"]
    # the CUDA tests are collected here for real, and their GPU command is listed, not run
    collect, gpu = steps["cuda-tests"]["commands"]
    assert collect["rc"] == 0 and gpu["rc"] is None and "-m" in gpu["argv"] and "cuda" in gpu["argv"]
    assert steps["cuda-tests"]["status"] == "dry-run"
    assert (tmp_path / "bundle.tar.gz").stat().st_size > 0


def test_a_step_that_breaks_is_recorded_and_fails_the_check(tmp_path):
    """A missing wheel bundle is a failure on the GPU machine, never a silent pass."""
    done = subprocess.run([sys.executable, "-c", f"""
import runpy, sys
sys.argv = ["gpu-check", "--out", {str(tmp_path)!r}, "--only", "wheels"]
mod = runpy.run_path({str(SCRIPT)!r}, run_name="gpu_check")
mod["REPO"] = mod["Path"]({str(tmp_path)!r})        # a checkout with no .whl/
mod["main"].__globals__["REPO"] = mod["REPO"]
sys.exit(mod["main"]())
"""], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    step = json.loads((tmp_path / "summary.json").read_text())["steps"][0]
    assert step["status"] == "failed" and any("gpu-wheels" in n for n in step["notes"]), step


def test_unknown_steps_are_refused(tmp_path):
    done = _check(tmp_path, "--only", "envv")
    assert done.returncode == 2 and "unknown step(s) envv" in done.stderr
