"""Commands that train nothing start without importing torch, and those that draw nothing without
matplotlib: before, every call took 3 to 4 s here, most of it torch's import. Checked here:
--help, ls, show --json, report, claims list and report, exec, down, clean, and trace record, import, show
and chrome (docs/performance.md, "A command's own start-up")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import synthetic
from gctestbed import tracefile
from helpers import gctestbed, leftovers

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


@pytest.mark.parametrize("args", [["--help"], ["ls"], ["ls", "--json"], ["show", "--json"], ["report", "--json"],
                                  ["claims", "list"], ["claims", "report"]])
def test_commands_that_train_nothing_never_import_torch(tmp_path, state_dir, args):
    results_dir = str(tmp_path / "results")
    synthetic.fill(results_dir, bws=(10e6, 100e6, 1e9), modes=("overlap",))
    if args[0] in ("show", "report") or args[:2] == ["claims", "report"]:
        args = [*args, "--results", results_dir] if args[0] in ("show", "claims") else [args[0], results_dir, *args[1:]]
    proc = _without_torch(tmp_path, *args, matplotlib="report" in args)     # a report draws its pictures
    assert proc.returncode == 0, proc.stderr[-1500:]
    if "--json" in args:
        json.loads(proc.stdout)


# a run's ledger and namespace, made by a process that then exits: what a gctestbed killed mid-run leaves
DEAD_RUN = """
from gctestbed.launch.state import RunState
from gctestbed.net import namespaces
state = RunState.create()
state.add("netns", name=f"gct-{state.run_id}-n0")
namespaces.create(f"gct-{state.run_id}-n0")
print(state.run_id)
"""


@pytest.mark.root
def test_a_clusters_exec_down_and_clean_never_import_torch(tmp_path, state_dir):
    """'up' builds a spec as a run does (torch); what comes after it does not need torch."""
    proc = gctestbed("up", "--nodes", "2", "--bw", "100mbit")
    assert proc.returncode == 0, proc.stderr
    name = proc.stdout.strip()
    try:
        ran = _without_torch(tmp_path, "exec", name, "1", "--", "sh", "-c", "exit 7")
        assert ran.returncode == 7, ran.stderr[-1500:]
        listed = _without_torch(tmp_path, "ls", matplotlib=False)          # the table, with a cluster in it
        assert listed.returncode == 0 and name in listed.stdout, (listed.stdout, listed.stderr[-1500:])
        # a run whose gctestbed died, leaving a namespace: 'clean' removes it (and leaves the cluster to 'down')
        dead = subprocess.run([sys.executable, "-c", DEAD_RUN], capture_output=True, text=True, timeout=60)
        assert dead.returncode == 0, dead.stderr
        run_id = dead.stdout.strip()
        assert leftovers(run_id) != []
        clean = _without_torch(tmp_path, "clean", matplotlib=False)
        assert clean.returncode == 0 and run_id in clean.stdout, (clean.stdout, clean.stderr[-1500:])
        assert leftovers(run_id) == []
    finally:
        down = _without_torch(tmp_path, "down", name, matplotlib=False)
        if down.returncode != 0:
            gctestbed("down", name)
    assert down.returncode == 0, down.stderr[-1500:]
    assert leftovers(name.removeprefix("gct-")) == []


def _one_rank_run(results_dir: str) -> None:
    """A one-rank fp16 run of a small DDP model (batch norm's buffers included), stored as a worker
    stores it: each step with its buckets' figures, the node's row with its buffer record."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from gctestbed import compress, results
    from gctestbed.compress import hook
    from gctestbed.spec import LinkSpec, RunSpec
    from gctestbed.timing import Laps
    from gctestbed.worker import buffer_record
    spec = RunSpec(nodes=1, link=LinkSpec(bw_bps=10**9), steps=2, compressor="fp16", run_id="one", results_dir=results_dir)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.BatchNorm1d(256), torch.nn.Linear(256, 256)),
                bucket_cap_mb=0.1)
    state = hook.install(model, compress.for_run(spec))
    rec = results.Recorder(results_dir, "one")
    rec.start_run(spec, {})
    rec.node(0, name="n0", buffers=buffer_record(model))
    for step in range(2):
        laps = Laps()
        model(torch.rand(8, 16)).sum().backward()
        compute_s = laps.lap()
        rec.step(0, step, step_s=compute_s, compute_s=compute_s, optim_s=0.0, **state.take_step_stats())
    rec.finish_run("ok")
    rec.close()


def test_the_trace_commands_never_import_torch(tmp_path, state_dir, single_rank_group):
    """trace record (of a run whose store holds its buffer record), import (of a torch.profiler
    trace), show and chrome."""
    results_dir = str(tmp_path / "results")
    _one_rank_run(results_dir)
    path = str(tmp_path / "one.json.gz")
    from test_profiler_import import _profile
    _profile(tmp_path / "profile.json")
    for args in (["trace", "record", "--results", results_dir, "-o", path], ["trace", "show", path, "--json"],
                 ["trace", "import", str(tmp_path / "profile.json"), "-o", str(tmp_path / "imported.json")],
                 ["trace", "chrome", "--results", results_dir, "-o", str(tmp_path / "run.json")],
                 ["trace", "chrome", path, "-o", str(tmp_path / "trace.json")]):
        proc = _without_torch(tmp_path, *args, matplotlib=False)
        assert proc.returncode == 0, (args, proc.stderr[-1500:])
    # what they wrote: fp16's two bytes for each of the model's 16*256+256 + 2*256 + 256*256+256 elements
    shown = json.loads(_without_torch(tmp_path, "trace", "show", path, "--json").stdout)
    assert shown["elements"] == 70656 and [r["bytes"] for r in shown["ranks"]] == [2 * 70656]
    assert [b[0] for b in tracefile.load(path)["buffers"]] == ["1.running_mean", "1.running_var", "1.num_batches_tracked"]
    for out in ("run.json", "trace.json"):
        assert json.loads((tmp_path / out).read_text())["traceEvents"]
