"""Sweeps: the grid, resuming, Ctrl-C; a real small sweep end to end."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from gctestbed import results, sweep
from gctestbed.spec import SpecError
from helpers import SMALL, gctestbed, leftovers, show, start


def _grid(tmp_path, **axes) -> sweep.Grid:
    base = {"workload": [SMALL], "batch_size": ["16"], "nodes": ["2"], "latency": ["0"], "bw": ["1gbit", "500mbit"],
            "compressor": ["none", "fp16"], "mode": ["overlap"]}
    return sweep.Grid(axes={**base, **axes}, steps=3, repeat=2, calibrate="none", results_dir=str(tmp_path))


def test_a_cell_finished_with_other_settings_is_run_again(tmp_path):
    """A sweep resumed under the same name with more steps (a claims experiment made longer) runs
    again the cells its store finished with fewer; cells finished as the sweep now asks are kept,
    whatever kernels their runs could use (planted: a finished cell always kept reuses the short
    runs; the kernels compared, every resume runs none's cells again)."""
    g = _grid(tmp_path, bw=["1gbit"], compressor=["none", "fp16"])
    g.repeat = 1
    cells = sweep.plan(g)
    for c, steps in zip(cells, (3, 5)):             # the first as the grid asks, the second with other steps
        # as session.resolve stores it: the kernels that could run (none has no native ones), not those asked
        made = c.spec.replace(steps=steps, run_id=f"run{steps}", kernels="torch")
        rec = results.Recorder(str(tmp_path), made.run_id)
        rec.start_run(made, {})
        rec.finish_run("ok")
        results.mark_cell(rec.conn, "s", c.key, c.repeat, "ok", made.run_id)
        rec.close()
    assert [c.key for c in sweep.todo(cells, "s", str(tmp_path))] == [cells[1].key]
    g.steps = 5
    assert [c.key for c in sweep.todo(sweep.plan(g), "s", str(tmp_path))] == [cells[0].key]
    g.steps, g.seed = 3, "7"                         # resumed with another seed: both again
    assert len(sweep.todo(sweep.plan(g), "s", str(tmp_path))) == 2


def test_plan_is_the_product_with_repeats_outermost(tmp_path):
    cells = sweep.plan(_grid(tmp_path))
    assert len(cells) == 8
    assert [c.repeat for c in cells] == [0] * 4 + [1] * 4
    assert len({(c.key, c.repeat) for c in cells}) == 8
    assert {c.spec.compressor for c in cells} == {"none", "fp16"}
    assert cells[0].spec.link.bw_bps == 1_000_000_000


def test_each_repeat_has_its_own_seed_and_every_method_of_a_repeat_shares_it(tmp_path):
    """Repeats are independent runs (seed + k), methods within a repeat paired (one seed)."""
    grid = _grid(tmp_path)
    grid.repeat, grid.seed = 3, "7"
    cells = sweep.plan(grid)
    by_repeat = {r: {c.spec.seed for c in cells if c.repeat == r} for r in range(3)}
    assert by_repeat == {0: {7}, 1: {8}, 2: {9}}
    slurm = sweep.node_args(cells[-1], grid, calibrate=False)
    assert slurm[slurm.index("--seed") + 1] == "9"


@pytest.mark.root
@pytest.mark.slow
def test_a_repeated_cell_is_an_independent_run(tmp_path, state_dir):
    """Two repeats of one cell start from different models and data: their first losses differ
    (with one shared seed they would be the same to the last digit), and the store records each seed."""
    proc = gctestbed("sweep", "--workload", SMALL, "--batch-size", "16", "--nodes", "2", "--bw", "1gbit",
                     "--compressor", "none", "--mode", "serial", "--steps", "2", "--repeat", "2", "--seed", "3",
                     "--calibrate", "none", "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    from gctestbed.analysis import cells
    rows = sorted(cells.load(str(tmp_path)), key=lambda r: r.repeat)
    assert [(r.repeat, r.seed) for r in rows] == [(0, 3), (1, 4)]
    assert rows[0].losses[0] != rows[1].losses[0]
    assert leftovers() == []


def test_a_typo_anywhere_fails_before_anything_runs(tmp_path):
    with pytest.raises(SpecError, match="unknown compressor 'fp61'"):
        sweep.plan(_grid(tmp_path, compressor=["none", "fp61"]))
    with pytest.raises(SpecError, match="bandwidth"):
        sweep.plan(_grid(tmp_path, bw=["100mb"]))
    with pytest.raises(SpecError, match="no value for mode"):
        sweep.plan(_grid(tmp_path, mode=[]))


def test_the_same_grid_has_the_same_name(tmp_path):
    assert _grid(tmp_path).default_name() == _grid(tmp_path / "elsewhere").default_name()
    assert _grid(tmp_path).default_name() != _grid(tmp_path, bw=["1gbit"]).default_name()


def test_resume_reruns_only_unfinished_cells(tmp_path):
    cells = sweep.plan(_grid(tmp_path))
    conn = results.connect(str(tmp_path))
    for cell, status in zip(cells, ["ok", "failed", "interrupted", "running"]):
        results.mark_cell(conn, "s", cell.key, cell.repeat, status, "r")
    conn.close()
    left = sweep.todo(cells, "s", str(tmp_path))
    assert left == cells[2:]                       # interrupted, died while running, never started
    assert sweep.todo(cells, "s", str(tmp_path), retry_failed=True) == cells[1:]
    assert sweep.todo(cells, "other", str(tmp_path)) == cells


def test_presets_plan_and_quick_covers_the_issue_methods(tmp_path):
    quick = sweep.plan(sweep.from_preset("quick", results_dir=str(tmp_path)))
    methods = {c.spec.compressor for c in quick}
    assert {"none", "fp16", "twobit", "dgc", "powersgd"} <= methods
    assert {c.spec.mode for c in quick} == {"overlap", "serial"}
    assert sweep.plan(sweep.from_preset("paper", results_dir=str(tmp_path)))


def test_cli_refuses_bad_axes_in_one_sentence(tmp_path):
    proc = gctestbed("sweep", "--compressor", "none;nope", "--results", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "unknown compressor 'nope'" in proc.stderr


@pytest.mark.root
@pytest.mark.slow
def test_real_sweep_survives_ctrl_c_and_resumes_without_loss_or_duplicates(tmp_path, state_dir):
    args = ["sweep", "--workload", SMALL, "--batch-size", "16", "--nodes", "2", "--bw", "1gbit,200mbit",
            "--compressor", "none;fp16", "--mode", "overlap", "--steps", "8", "--calibrate", "none",
            "--results", str(tmp_path)]
    proc = start(*args)
    conn = results.connect(str(tmp_path))
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:          # wait until the second cell is training
        done = conn.execute("SELECT COUNT(*) FROM sweep_cells WHERE status='ok'").fetchone()[0]
        training = conn.execute("SELECT COUNT(*) FROM runs JOIN steps USING (run_id) WHERE status='running'").fetchone()[0]
        if done >= 1 and training:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "resume" in err
    statuses = [r["status"] for r in conn.execute("SELECT status FROM sweep_cells")]
    assert "interrupted" in statuses and "running" not in statuses
    interrupted_run = conn.execute("SELECT run_id FROM sweep_cells WHERE status='interrupted'").fetchone()["run_id"]
    assert leftovers(interrupted_run) == [] and leftovers() == []       # the cell's run and the kept network
    t0, started = time.monotonic(), time.time()
    proc = gctestbed(*args, timeout=600)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    rows = conn.execute("SELECT cell, repeat, status, run_id FROM sweep_cells").fetchall()
    # each cell's wall time, split into its steps and the fixed cost around them, as the sweep printed it;
    # the cells of this invocation together took less than the command did by the test's own clock
    resumed = [show(tmp_path, r["run_id"]) for r in conn.execute("SELECT run_id FROM runs WHERE created_at > ?", (started,))]
    assert resumed and sum(s["phases"]["total_s"] for s in resumed) < wall
    for s in resumed:
        p = s["phases"]
        assert p["fixed_s"] > 0 and p["total_s"] == pytest.approx(p["steps_s"] + p["fixed_s"])
        assert p["total_s"] > s["finished_at"] - s["created_at"]      # the store's own start and end lie within
        assert f"fixed cost {p['fixed_s']:.1f} s" in proc.stderr
    fixed = sorted(s["phases"]["fixed_s"] for s in resumed)
    assert f"median {fixed[len(fixed) // 2]:.1f} s" in proc.stdout
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    assert len({r["run_id"] for r in rows}) == 4
    # the interrupted attempt stays in the store as a failed run; every cell's run is complete
    assert conn.execute("SELECT status, error FROM runs WHERE run_id=?", (interrupted_run,)).fetchone()["status"] == "failed"
    for r in rows:
        assert conn.execute("SELECT COUNT(*) FROM steps WHERE run_id=?", (r["run_id"],)).fetchone()[0] == 16
        assert leftovers(r["run_id"]) == []
    conn.close()
    assert leftovers() == []
    proc = gctestbed(*args)                        # a finished sweep runs nothing again
    assert proc.returncode == 0 and "4 already done, 0 to run" in proc.stderr
    rep = gctestbed("report", str(tmp_path), "--out", str(tmp_path / "report"))
    assert rep.returncode == 0, rep.stderr
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert {b["compressor"] for b in data["break_even"]} == {"fp16"}


def test_the_optimizer_is_an_axis_that_leaves_older_grids_names_and_cells_as_they_were(tmp_path):
    old = _grid(tmp_path)
    assert old.default_name() == "sweep-" + __import__("hashlib").sha256(json.dumps(
        {k: v for k, v in __import__("dataclasses").asdict(old).items()
         if k not in ("results_dir", "calibrate", "accept_miss", "launcher", "eval_every", "device", "cpus_per_node", "dilate", "keep",
                      "partition", "dev")},
        sort_keys=True).encode()).hexdigest()[:10]                  # the rule names were made by before the axis
    assert _grid(tmp_path, optimizer=["sgd"]).default_name() == old.default_name()
    assert all("optimizer" not in json.loads(c.key) for c in sweep.plan(old))
    both = sweep.plan(_grid(tmp_path, optimizer=["sgd", "adam:beta2=0.98"]))
    assert len(both) == 2 * len(sweep.plan(old)) and _grid(tmp_path, optimizer=["adam"]).default_name() != old.default_name()
    assert {c.spec.optimizer for c in both} == {"sgd", "adam"}
    assert {c.spec.optimizer_options.get("beta2") for c in both} == {None, 0.98}
    with pytest.raises(SpecError, match="dgc applies momentum itself"):
        sweep.plan(_grid(tmp_path, optimizer=["adam"], compressor=["dgc"]))


def test_comm_is_an_axis_that_leaves_older_grids_names_and_cells_as_they_were(tmp_path):
    old = _grid(tmp_path)
    assert _grid(tmp_path, comm=["allreduce"]).default_name() == old.default_name()
    both = sweep.plan(_grid(tmp_path, comm=["allreduce", "ps:servers=2,pull=dense"]))
    assert len(both) == 2 * len(sweep.plan(old))
    assert {(c.spec.comm, c.spec.servers, c.spec.world) for c in both} == {("allreduce", 0, 2), ("ps", 2, 4)}
    assert {json.loads(c.key).get("comm") for c in both} == {"allreduce", "ps:servers=2,pull=dense"}
    local = sweep.plan(_grid(tmp_path, comm=["localsgd:period=8"], compressor=["none"]))
    assert {(c.spec.comm, c.spec.comm_options["period"]) for c in local} == {("localsgd", 8)}
    with pytest.raises(SpecError, match="use --compressor none with it"):     # refused before anything runs
        sweep.plan(_grid(tmp_path, comm=["localsgd"]))
    with pytest.raises(SpecError, match="unknown --comm scheme 'ring'"):
        sweep.plan(_grid(tmp_path, comm=["ring"]))


def test_a_slurm_sweep_takes_its_cells_to_gctestbed_node_as_typed(tmp_path):
    """Each host parses the cell's own words (launch/slurm.py); a CPU share per node means nothing
    when every node is a host of its own, and is refused before anything runs."""
    g = _grid(tmp_path, compressor=["topk:ratio=0.01"], optimizer=["adam:beta2=0.98"])
    g.launcher = "slurm"
    cell = sweep.plan(g)[0]
    args = sweep.node_args(cell, g, calibrate=False)
    flags_given = dict(zip(args[::2], args[1::2]))
    assert flags_given["--compressor"] == "topk:ratio=0.01" and flags_given["--optimizer"] == "adam:beta2=0.98"
    assert flags_given["--bw"] == "1gbit" and flags_given["--steps"] == "3" and args[-1] == "--no-calibrate"
    assert cell.spec.launcher == "netns"          # as 'gctestbed node' builds its spec
    with pytest.raises(SpecError, match="every node is a host of its own"):
        sweep.plan(sweep.Grid(axes=g.axes, launcher="slurm", cpus_per_node="0.5", results_dir=str(tmp_path)))


def test_a_cleanup_that_raises_does_not_replace_a_cells_error(tmp_path, monkeypatch):
    """The kept network's removal raising (not returning what it left) after a cell broke: the
    cell's error is the one raised, the cleanup's a note on it (planted: the cleanup's raised in
    its place)."""
    from gctestbed import runner
    from gctestbed.launch.kept import KeptNetwork

    def broken(spec, kept=None, fresh=False):
        raise ValueError("cell broke")

    def close(self):
        raise OSError("netlink gone")
    monkeypatch.setattr(runner, "run", broken)
    monkeypatch.setattr(KeptNetwork, "close", close)
    g = _grid(tmp_path, bw=["1gbit"], compressor=["none"])
    g.repeat, g.keep = 1, True
    with pytest.raises(ValueError, match="cell broke") as e:
        sweep.run(g, "s", sweep.plan(g))
    assert any("OSError: netlink gone" in n for n in getattr(e.value, "__notes__", [])), e.value


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_what_the_kept_network_left_is_told_beside_a_cells_error(tmp_path, monkeypatch, stop):
    """A cell that raises still closes the kept network; what that could not remove is a note on
    the cell's error (not lost with it, not in its place), and an interrupted cell is marked so."""
    from gctestbed import runner
    from gctestbed.launch.kept import KeptNetwork

    def broken(spec, kept=None, fresh=False):
        raise stop("cell broke")
    monkeypatch.setattr(runner, "run", broken)
    monkeypatch.setattr(KeptNetwork, "close", lambda self: ["namespace gct-x-n0"])
    g = _grid(tmp_path, bw=["1gbit"], compressor=["none"])
    g.repeat, g.keep = 1, True
    cells = sweep.plan(g)
    with pytest.raises(stop, match="cell broke") as e:
        sweep.run(g, "s", cells)
    assert any("gct-x-n0" in n and "gctestbed clean" in n for n in getattr(e.value, "__notes__", [])), e.value
    if stop is KeyboardInterrupt:
        conn = results.connect(str(tmp_path))
        assert results.cell_status(conn, "s", cells[0].key, 0) == "interrupted"
        conn.close()


def test_a_resumed_slurm_sweep_gives_the_interrupted_cell_a_fresh_rendezvous_port(tmp_path, monkeypatch):
    """srun faked (launch/slurm.py's subprocess): the first step is interrupted, the sweep resumed;
    no step, the interrupted one's retry included, takes a port an earlier step took."""
    import types
    from gctestbed.launch import slurm
    ports, interrupt = [], [True]

    class Step:
        def __init__(self, argv, **kw):
            ports.append(argv[argv.index("--rdzv") + 1].rsplit(":", 1)[1])

        def wait(self, timeout=None):
            if interrupt.pop() if interrupt else False:
                raise KeyboardInterrupt
            return 1

    monkeypatch.setattr(slurm, "subprocess", types.SimpleNamespace(
        Popen=Step, run=lambda *a, **k: None, TimeoutExpired=TimeoutError, STDOUT=-2, DEVNULL=-3))
    monkeypatch.setattr(slurm.Allocation, "obtain", classmethod(lambda cls, n, p, s: cls("7", ["h0", "h1"], {"h0": "a0", "h1": "a1"})))
    g = _grid(tmp_path, bw=["1gbit"], compressor=["none", "fp16"])
    g.launcher, g.repeat = "slurm", 1
    cells = sweep.plan(g)
    with pytest.raises(KeyboardInterrupt):
        sweep.run(g, "s", sweep.todo(cells, "s", str(tmp_path)))
    left = sweep.todo(cells, "s", str(tmp_path))
    assert left == cells                                    # the first cell was interrupted, the second never ran
    sweep.run(g, "s", left)
    assert len(ports) == 3 and len(set(ports)) == 3, ports
