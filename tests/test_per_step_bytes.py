"""Bytes per step of a method that does not send every step are a mean over steps (what the
method costs, amortised), not the median step's 0; ``show`` names the statistic it reports."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gctestbed import results
from gctestbed.cli import main
from gctestbed.spec import LinkSpec, RunSpec

PERIOD, STEPS = 4, 13
TX = {0: 1_000_000, 1: 1_200_000}       # each rank's interface bytes on a step that averages


def _averages(step: int) -> bool:
    return step % PERIOD == PERIOD - 1      # local SGD averages after steps 3, 7, 11


def _store(results_dir: str) -> None:
    """A local SGD run and a ring run, written through the project's Recorder as workers write them."""
    for run_id, comm, options in (("local", "localsgd", {"period": PERIOD}), ("ring", "allreduce", {})):
        spec = RunSpec(nodes=2, link=LinkSpec(bw_bps=100_000_000), steps=STEPS, batch_size=8, run_id=run_id,
                       results_dir=results_dir, comm=comm, comm_options=options)
        rec = results.Recorder(results_dir, run_id)
        rec.start_run(spec, {})
        for step in range(STEPS):
            sends = comm == "allreduce" or _averages(step)
            for rank in (0, 1):
                rec.step(rank, step, step_s=0.1, compute_s=0.05, loss=1.0, tx_bytes=TX[rank] if sends else 0,
                         payload_bytes=1_000_000 if sends else 0, expected_tx_bytes=1_000_000 if sends else 0,
                         reduce_calls=int(sends), buckets=int(sends), sync_s=0.01 if comm != "allreduce" and sends else 0.0)
        rec.finish_run("ok")
        rec.close()


def test_local_sgd_bytes_per_step_are_the_mean_over_whole_periods_and_say_so(tmp_path, monkeypatch):
    _store(str(tmp_path))
    # by hand: step 0 is left out; whole periods run from the step after the first average (4) to
    # the last average (11): 8 steps, two of which averaged, each sending the ranks' mean of TX
    window = range(4, 12)
    per_step = [(TX[0] + TX[1]) / 2 if _averages(s) else 0 for s in window]
    assert sum(1 for s in window if _averages(s)) == 2
    mean = sum(per_step) / len(per_step)                       # 275,000 bytes
    conn = results.connect(str(tmp_path), create=False)
    local = results.summarize(conn, results.find_run(conn, "local"))
    ring = results.summarize(conn, results.find_run(conn, "ring"))
    conn.close()
    assert local.per_step_stat == "mean" and local.wire_bytes_per_step == pytest.approx(mean) and mean > 0
    assert local.payload_bytes_per_step == pytest.approx(1_000_000 * 2 / 8)
    assert ring.per_step_stat == "median" and ring.wire_bytes_per_step == pytest.approx((TX[0] + TX[1]) / 2)

    monkeypatch.setenv("COLUMNS", "300")                       # rich's table on one line per row
    shown = CliRunner().invoke(main, ["show", "local", "--results", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    sent = next(line for line in shown.output.splitlines() if "sent per node per step" in line)
    assert "(eth0, mean)" in sent and "0.275 MB" in sent, sent
    shown = CliRunner().invoke(main, ["show", "ring", "--results", str(tmp_path)])
    sent = next(line for line in shown.output.splitlines() if "sent per node per step" in line)
    assert "(eth0, median)" in sent and "1.1 MB" in sent, sent
    as_json = json.loads(CliRunner().invoke(main, ["show", "local", "--json", "--results", str(tmp_path)]).output)
    assert as_json["per_step_stat"] == "mean" and as_json["wire_bytes_per_step"] == pytest.approx(mean)
