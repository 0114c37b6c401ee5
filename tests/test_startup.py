"""Commands that train nothing start without importing torch, and those that draw nothing without
matplotlib: before, every call took 3 to 4 s here, most of it torch's import. Checked here:
--help, ls, show --json, report, claims list."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import synthetic

# any 'import torch' (and, where asked, 'import matplotlib') in the command's process now raises
# ImportError: a None entry in sys.modules
NO_TORCH = "import sys\nsys.modules['torch'] = None\n"
NO_MATPLOTLIB = "sys.modules['matplotlib'] = None\n"


def _without_torch(tmp_path, *args, matplotlib=True):
    (tmp_path / "poison").mkdir(exist_ok=True)
    (tmp_path / "poison" / "sitecustomize.py").write_text(NO_TORCH + ("" if matplotlib else NO_MATPLOTLIB))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "poison"), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "gctestbed.cli", *args], capture_output=True, text=True, env=env, timeout=120)


def test_the_poison_stops_a_command_that_trains(tmp_path, state_dir):
    """The check itself can fail: a run's parent builds a compressor, and that needs torch."""
    proc = _without_torch(tmp_path, "run", "--steps", "1", "--results", str(tmp_path / "r"))
    assert proc.returncode != 0 and "torch" in proc.stderr, proc.stderr[-500:]


@pytest.mark.parametrize("args", [["--help"], ["ls", "--json"], ["show", "--json"], ["report", "--json"],
                                  ["claims", "list"]])
def test_commands_that_train_nothing_never_import_torch(tmp_path, state_dir, args):
    results_dir = str(tmp_path / "results")
    synthetic.fill(results_dir, bws=(10e6, 100e6, 1e9), modes=("overlap",))
    if args[0] in ("show", "report"):
        args = [*args, "--results", results_dir] if args[0] == "show" else [args[0], results_dir, *args[1:]]
    proc = _without_torch(tmp_path, *args, matplotlib=args[0] == "report")     # a report draws its pictures
    assert proc.returncode == 0, proc.stderr[-1500:]
    if "--json" in args:
        json.loads(proc.stdout)
