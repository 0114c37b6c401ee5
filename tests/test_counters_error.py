"""A counter that cannot be read at the end of a run is a stored reason, not a silent gap: the
run keeps its outcome, the store keeps why, and ``show`` prints it."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gctestbed import results, runner
from gctestbed.cli import main
from gctestbed.launch.protocol import Node
from gctestbed.spec import LinkSpec, RunSpec

WHY = "NetlinkError: (19, 'No such device')"


class _Done:
    """A node process that has already exited well."""

    pid = 0

    def poll(self) -> int:
        return 0


class _BrokenCounters:
    """A launcher whose network is gone by the time its counters are read."""

    launcher = "netns"

    def __init__(self, spec: RunSpec, state) -> None:
        self.spec = spec

    @staticmethod
    def check_host() -> None:
        pass

    def up(self) -> list[Node]:
        return [Node(rank=0, name="n0", address="10.0.0.1")]

    def describe(self) -> dict:
        return {}

    def spawn(self, node, argv, log_path, extra_env=None) -> _Done:
        return _Done()

    def final_counters(self) -> dict:
        raise RuntimeError(WHY)

    def down(self) -> list[str]:
        return []


def test_a_counter_read_that_fails_is_stored_with_the_run_and_shown(tmp_path, state_dir, monkeypatch):
    monkeypatch.setattr(runner, "cluster_class", lambda spec: _BrokenCounters)
    spec = RunSpec(nodes=1, link=LinkSpec(bw_bps=100_000_000), steps=1, batch_size=4, calibrate=False,
                   results_dir=str(tmp_path))
    summary = runner.run(spec)
    assert summary.status == "ok"                         # the run's outcome is not the counters'
    assert summary.counters_error == f"RuntimeError: {WHY}"
    conn = results.connect(str(tmp_path), create=False)
    env = json.loads(results.find_run(conn, summary.run_id)["environment"])
    conn.close()
    assert env["counters_error"] == f"RuntimeError: {WHY}" and "qdisc_stats" not in env

    monkeypatch.setenv("COLUMNS", "300")                  # rich's table on one line per row
    shown = CliRunner().invoke(main, ["show", summary.run_id, "--results", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    line = next(line for line in shown.output.splitlines() if "qdisc counters" in line)
    assert "not read at the end" in line and "No such device" in line, shown.output
    as_json = CliRunner().invoke(main, ["show", summary.run_id, "--json", "--results", str(tmp_path)])
    assert json.loads(as_json.output)["counters_error"] == f"RuntimeError: {WHY}"
