"""Real runs on namespace nodes: bytes on the wire, identical replicas, link-rate all-reduce."""

from __future__ import annotations

import json
import os

import pytest

from gctestbed import results
from helpers import SMALL, gctestbed, kept_runs, leftovers, show

pytestmark = [pytest.mark.root, pytest.mark.slow]


# The runs these tests judge, made once for the module in one kept_runs block (a sweep's kept
# network and fork server: tests/test_kept.py holds its cells to runs on networks of their own),
# in this order: the link-rate run first, so its 100 mbit links are the ones the network is built
# with (as a lone run's are), then the 1 gbit runs on that network re-shaped, the one-node run last
# (a network of its own). Each entry is the run's id, or the AssertionError of a run that did not
# end ok: each test says its own.
_PLAN = [
    ("link rate", dict(bw="100mbit", compressor="none", steps="6")),
    ("none", dict(bw="1gbit", compressor="none", steps="6")),
    ("fp16", dict(bw="1gbit", compressor="fp16", steps="6")),
    ("teacher", dict(bw="1gbit", workload="mlp:width=256,depth=2,input_dim=64", steps="60", batch_size="64")),
    ("warmed", dict(bw="1gbit", steps="3", lr="0.1", optimizer="sgd:momentum=0,warmup_steps=1")),
    ("half", dict(bw="1gbit", steps="3", lr="0.05", optimizer="sgd:momentum=0")),
    ("full", dict(bw="1gbit", steps="3", lr="0.1", optimizer="sgd:momentum=0")),
    ("frozen", dict(bw="1gbit", steps="2", lr="1e-12", optimizer="sgd:momentum=0")),
    ("clipped", dict(bw="1gbit", steps="2", lr="0.1", optimizer="sgd:momentum=0,clip_norm=1e-9")),
    ("unclipped", dict(bw="1gbit", steps="2", lr="0.1", optimizer="sgd:momentum=0")),
    ("local", dict(bw="1gbit", steps="2", lr="0.1", optimizer="sgd:clip_norm=1e-9",
                   compressor="dgc:ratio=1,warmup_epochs=0,clip_norm=100")),
    ("one node", dict(nodes="1", bw="1gbit", steps="3")),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, module_ledgers):
    """(the results directory, name -> run id or AssertionError, run id -> what of it was left
    right after it ended, what was left of everything once the kept network was removed)."""
    results_dir, ids, left = tmp_path_factory.mktemp("runs"), {}, {}
    with kept_runs() as run:
        for name, typed in _PLAN:
            typed = {"nodes": "2", "workload": SMALL, "results_dir": str(results_dir), **typed}
            try:
                ids[name] = run(**typed)
            except AssertionError as e:
                ids[name] = AssertionError(str(e))
                continue
            left[ids[name]] = leftovers(ids[name])
    everything = leftovers()
    after = {run_id: leftovers(run_id) for run_id in left}
    return results_dir, ids, left, everything, after


def _id(runs, name: str) -> str:
    run_id = runs[1][name]
    assert isinstance(run_id, str), run_id
    return run_id


def _summary(runs, name: str) -> dict:
    """What 'gctestbed show RUN --json' prints of run ``name``."""
    return show(runs[0], _id(runs, name))


def _losses(runs, name: str) -> list[float]:
    conn = results.connect(str(runs[0]))
    try:
        return [r[0] for r in conn.execute("SELECT loss FROM steps WHERE run_id=? AND rank=0 ORDER BY step",
                                           (_id(runs, name),))]
    finally:
        conn.close()


def test_the_runs_and_their_kept_network_leave_nothing(runs):
    """Each run's ledger gone once it ended (a forked worker carries the kept network's names, not
    the run's: the census by run id finds the ledger only), and once the network was removed,
    nothing of gctestbed's at all: its namespaces, fork server, workers and cgroups."""
    _, _, left, everything, after = runs
    assert left and all(found == [] for found in left.values()) and all(found == [] for found in after.values()), (left, after)
    assert everything == []


def test_fp16_halves_the_wire_bytes_and_replicas_stay_identical(runs):
    none, fp16 = _summary(runs, "none"), _summary(runs, "fp16")
    for s in (none, fp16):
        assert s["status"] == "ok" and s["steps_recorded"] == 6 and s["error"] is None
        assert s["params_identical"] is True
        # the counters saw the payload cross eth0: a ring all-reduce on 2 nodes sends it once
        assert 0.95 <= s["wire_bytes_per_step"] / s["payload_bytes_per_step"] <= 1.15
    assert fp16["payload_bytes_per_step"] * 2 == none["payload_bytes_per_step"]
    assert 0.45 <= fp16["wire_bytes_per_step"] / none["wire_bytes_per_step"] <= 0.55


def test_all_reduce_runs_at_link_rate(runs):
    s = _summary(runs, "link rate")
    assert s["busbw_fraction_of_link"] >= 0.85, s
    # and the link really was the limit: nothing crossed faster than the shaped rate
    assert s["busbw_fraction_of_link"] <= 1.0


def test_the_host_cpu_is_sampled_over_the_measured_steps(runs):
    """The runner samples the kernel's counters of the host once per poll from the poll before the
    first recorded step until the nodes exit (the figure itself is held to a known load in
    tests/test_hostcpu.py): the samples are a poll apart and bracket the steps, whose rows the
    workers stamped themselves."""
    import statistics

    from gctestbed import runner
    conn = results.connect(str(runs[0]))
    try:
        run_id = _id(runs, "teacher")
        first, last = conn.execute("SELECT MIN(t), MAX(t) FROM steps WHERE run_id=?", (run_id,)).fetchone()
        env = json.loads(conn.execute("SELECT environment FROM runs WHERE run_id=?", (run_id,)).fetchone()[0])
    finally:
        conn.close()
    t = [sample[0] for sample in env["host_cpu"]["samples"]]
    assert t[0] <= first and t[-1] >= last, (t[0], t[-1], first, last)       # the polls around the steps
    assert runner.POLL_S <= statistics.median(b - a for a, b in zip(t, t[1:])) < 2 * runner.POLL_S + 0.2
    shown = _summary(runs, "teacher")
    assert "host_cpu" not in shown["environment"]       # show --json prints the figure, not the samples
    host = shown["cpu"]["host"]                         # read between the samples around steps 1 to the last
    assert host is not None and 0 < host["window_s"] <= last - first + 2 * runner.POLL_S + 0.5, (host, first, last)


def test_one_node_runs_without_communication(runs):
    s = _summary(runs, "one node")
    assert s["status"] == "ok" and s["nodes"] == 1 and s["busbw_bps"] is None


def test_loss_falls_on_the_teacher_task(runs):
    losses = _losses(runs, "teacher")
    assert sum(losses[-10:]) / 10 < 0.8 * sum(losses[:10]) / 10


def test_a_warm_up_takes_its_first_step_at_lr_over_the_node_count_then_rises(runs):
    """Warm-up in the worker's loop: with 2 nodes and one warm-up step, lr 0.1 takes its first
    step at 0.05 and its second at 0.1. So its second step's loss is exactly that of a run at
    lr 0.05 without warm-up (same seed, same batches), and not that of lr 0.1; its third is not the
    lr 0.05 run's (the schedule moved on)."""
    warmed, half = _losses(runs, "warmed"), _losses(runs, "half")
    assert warmed[1] == half[1] and warmed[2] != half[2]
    assert warmed[1] != _losses(runs, "full")[1]


def test_clipping_applies_to_the_averaged_gradient_unless_dgc_clips_locally(runs):
    """Clipping in the worker's loop: held to a global norm of 1e-9, a step moves the weights by at
    most lr x 1e-9, so the second step's loss is that of weights that did not move (a run at lr
    1e-12); unclipped they move. DGC with its own local clipping replaces the run's clipping: its
    weights move although the run asks for 1e-9."""
    def second_loss(name):
        return _losses(runs, name)[1]

    frozen = second_loss("frozen")
    assert second_loss("clipped") == pytest.approx(frozen, rel=1e-6)
    assert second_loss("unclipped") != pytest.approx(frozen, rel=1e-4)
    local = second_loss("local")
    assert local != pytest.approx(frozen, rel=1e-4)


def test_netem_asked_for_without_netem_is_refused_and_leaves_nothing(tmp_path, state_dir):
    """The run's probe is told this kernel has no netem (a sitecustomize in the CLI's process), so
    the refusal is tested on every kernel, with netem or without."""
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(
        "from gctestbed.net import probe\n"
        "_real = probe.qdisc_available\n"
        "probe.qdisc_available = lambda ns, kind, record: False if kind == 'netem' else _real(ns, kind, record)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plant), os.environ.get("PYTHONPATH", "")])}
    proc = gctestbed("run", "--latency", "5ms", "--latency-impl", "netem", "--results", str(tmp_path / "r"), env=env)
    assert proc.returncode == 2, proc.stderr
    assert "no netem qdisc" in proc.stderr and "Traceback" not in proc.stderr
    assert list(state_dir.iterdir()) == [state_dir / ".lock"]


DIGITS = "resnet18:scale=0.125,image=32,classes=10,data=digits"


def test_adam_evaluations_and_an_fp16_baseline_through_sweep_report_and_bench(tmp_path, state_dir):
    """The new choices end to end: a sweep with Adam on real digits, evaluated every 2 steps of 4
    (two evaluations, as every 5 of 10 gave); report's speedups against fp16 and its time to
    accuracy; bench convergence on the same task (what it reports of the methods does not depend
    on how many steps they took); GPT-2's layout with AdamW, run on a kept network (not a test of
    a lone run's start: its report is what is judged)."""
    res = str(tmp_path / "r")
    out = gctestbed("sweep", "--workload", DIGITS, "--compressor", "none;fp16;twobit:threshold=0.01", "--optimizer",
                    "adam", "--lr", "0.001", "--bw", "1gbit", "--steps", "4", "--eval-every", "2", "--batch-size", "16",
                    "--calibrate", "none", "--results", res, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(gctestbed("report", res, "--baseline", "fp16", "--json", timeout=300).stdout)
    assert r["baseline"] == "fp16" and {b["compressor"] for b in r["break_even"]} == {"none", "twobit:threshold=0.01"}
    (tta,) = r["time_to_accuracy"]
    assert tta["baseline"] == "fp16" and "adam" in tta["group"]
    assert all(e["evaluations"] == 2 for e in tta["rows"])              # after steps 2 and 4
    s = show(res)
    assert s["eval_samples"] == 360 and 0 <= s["eval_accuracy"] <= 1
    out = gctestbed("bench", "convergence", "--workload", DIGITS, "--optimizer", "adam", "--lr", "0.001", "--baseline",
                    "fp16", "--methods", "twobit:threshold=0.01;dgc", "--steps", "4", "--batch-size", "16", "--json",
                    "--results", str(tmp_path / "c"), timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    bench = json.loads(out.stdout)
    assert bench["baseline"] == "fp16" and "resnet18" in bench["workload"] and "adam" in bench["optimizer"]
    assert set(bench["methods"]) == {"fp16", "twobit:threshold=0.01"}    # dgc applies momentum itself: not with adam
    assert bench["methods"]["fp16"]["bytes_vs_baseline"] == 1.0
    gpt2 = "gpt2:scale=0.05,seq_len=32"           # GPT-2's layout (its 50,257-row embedding), 1/20 wide
    with kept_runs() as run:                      # fails the test unless the run ended ok
        run(nodes="2", workload=gpt2, optimizer="adamw:weight_decay=0.1", lr="0.001", steps="4", eval_every="2",
            batch_size="4", compressor="powersgd", results_dir=str(tmp_path / "g"))
    r = json.loads(gctestbed("report", str(tmp_path / "g"), "--target-loss", "100", "--json", timeout=300).stdout)
    (row,) = r["time_to_accuracy"][0]["rows"]
    assert row["evaluations"] == 2 and row["steps"] == 2 and "adamw" in r["time_to_accuracy"][0]["group"]
