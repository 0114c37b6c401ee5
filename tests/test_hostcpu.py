"""The host's CPU over a run's steps (gctestbed.hostcpu): a /proc/stat line read by hand, a golden
case worked out by hand from the kernel's rule (busy = everything but idle and iowait), the
thresholds at their edges, the kernel's own counters against a load this test makes (every core
spun), and a long run's bounded samples judged as the short one's."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from gctestbed import hostcpu


def _sampled(monkeypatch, rows, active=lambda i: True):
    """A Sampler fed ``rows`` (t, user, system, irq, idle, steal) as if read from the kernel."""
    it = iter(rows)
    monkeypatch.setattr(hostcpu, "read", lambda: list(next(it)))
    sampler = hostcpu.Sampler()
    for i in range(len(rows)):
        sampler.tick(active=active(i))
    return sampler


def test_a_proc_stat_line_is_read_by_the_kernels_columns():
    # user nice system idle iowait irq softirq steal guest guest_nice (proc(5)); guest is inside user already
    line = "cpu  1000 20 300 5000 40 6 70 8 900 10"
    assert hostcpu.parse(line) == [1020, 300, 76, 5040, 8]
    assert hostcpu.parse("cpu  1 2 3 4") == [3, 3, 0, 4, 0]          # an old kernel's four columns
    sample = hostcpu.read()
    assert len(sample) == 6 and abs(sample[0] - time.time()) < 5 and all(v >= 0 for v in sample[1:])


def test_the_window_s_shares_and_saturated_time_as_worked_out_by_hand(monkeypatch):
    # 2 cores at 100 ticks/s: 200 ticks a second. Columns: t, user, system, irq, idle, steal (cumulative)
    rows = [(10.0, 0, 0, 0, 0, 0),
            (11.0, 100, 50, 46, 4, 0),        # 196 of 200 busy: 98 %, saturated
            (12.0, 150, 70, 56, 124, 0),      # 80 of 200 busy: 40 %
            (14.0, 300, 200, 170, 130, 0),    # 394 of 400 busy: 98.5 %, saturated
            (20.0, 300, 200, 170, 1330, 0)]   # idle, and outside the window
    got = hostcpu.over(_sampled(monkeypatch, rows).record(), 10.0, 14.0)
    # over 10-14 s: 800 ticks, 130 idle; user 300, system 200, irq 170; saturated 1 s + 2 s of 4 s
    assert got == pytest.approx({"window_s": 4.0, "busy": 670 / 800, "user": 300 / 800, "system": 200 / 800,
                                 "irq": 170 / 800, "steal": 0.0, "saturated_share": 0.75})
    # a window between samples takes each interval it cuts for the part inside (planted: read between the
    # samples around it, 10-12 s): 10.5-11.5 s is half of 10-11 s (user 50, system 25, irq 23, idle 2,
    # saturated 0.5 s) and half of 11-12 s (user 25, system 10, irq 5, idle 60, not saturated)
    short = hostcpu.over(_sampled(monkeypatch, rows).record(), 10.5, 11.5)
    assert short == pytest.approx({"window_s": 1.0, "busy": 138 / 200, "user": 75 / 200, "system": 35 / 200,
                                   "irq": 28 / 200, "steal": 0.0, "saturated_share": 0.5})
    # a window reaching past the samples is cut to them: 9-16 s reads 10-14 s and a third of 14-20 s
    wide = hostcpu.over(_sampled(monkeypatch, rows).record(), 9.0, 16.0)
    assert wide == pytest.approx({"window_s": 6.0, "busy": 670 / 1200, "user": 300 / 1200, "system": 200 / 1200,
                                  "irq": 170 / 1200, "steal": 0.0, "saturated_share": 0.5})
    assert hostcpu.over(_sampled(monkeypatch, rows).record(), 21.0, 22.0) is None     # past the last sample
    assert hostcpu.over(_sampled(monkeypatch, rows).record(), 0.0, 12.0) is None      # 2 s seen of 12: too little
    assert hostcpu.over(None, 0, 1) is None
    # polls before the steps began are not kept but the last of them, and their saturated seconds count
    late = _sampled(monkeypatch, rows, active=lambda i: i >= 2).record()
    assert [s[0] for s in late["samples"]] == [11.0, 12.0, 14.0, 20.0] and late["samples"][0][-1] == 1.0
    # samples stored before saturated_s was a column (e09d7bf) give no figure rather than a different one
    old = {"fields": list(hostcpu.FIELDS[:6]), "samples": [s[:6] for s in _sampled(monkeypatch, rows).record()["samples"]]}
    assert hostcpu.over(old, 10.0, 14.0) is None


@pytest.mark.parametrize("idle, saturated", [(9, True), (11, False)])    # 95.5 % and 94.5 % busy
def test_an_interval_is_saturated_from_95_percent_busy(monkeypatch, idle, saturated):
    rows = [(0.0, 0, 0, 0, 0, 0), (1.0, 191 - (idle - 9), 0, 0, idle, 0)]     # 200 ticks in all
    got = hostcpu.over(_sampled(monkeypatch, rows).record(), 0.0, 1.0)
    assert got["saturated_share"] == (1.0 if saturated else 0.0), got


def test_a_long_run_keeps_at_most_the_bound_and_judges_saturation_as_a_short_one(monkeypatch):
    """Polls 0.25 s apart, saturated and not in turn: half the time saturated, however many samples
    the store keeps (planted: judged between the kept samples after thinning, a long run read 0 %)."""
    rows, ticks = [], [0, 0, 0, 0, 0]
    for i in range(3 * hostcpu.MAX_SAMPLES + 7):
        rows.append((i * 0.25, *ticks))
        busy = 50 if i % 2 == 0 else 20            # 50 ticks a poll on 2 cores: 100 % or 40 %
        ticks = [ticks[0] + busy, ticks[1], ticks[2], ticks[3] + 50 - busy, 0]
    samples = _sampled(monkeypatch, rows).record()["samples"]
    assert len(samples) <= hostcpu.MAX_SAMPLES and samples[0][0] == 0.0 and samples[-1][0] == rows[-1][0]
    assert [s[0] for s in samples] == sorted(s[0] for s in samples)
    got = hostcpu.over({"fields": list(hostcpu.FIELDS), "samples": samples}, 0.0, rows[-1][0])
    assert got["saturated_share"] == pytest.approx(0.5, abs=0.01) and got["busy"] == pytest.approx(0.7, abs=0.01)


def _spin(until):
    while time.time() < until:
        pass


def test_the_kernel_counts_every_core_spun_as_saturated():
    """A load this test knows: one busy loop per core for 2 s. The kernel's counters, read as a
    run reads them, must call the host saturated for most of it."""
    cores = os.cpu_count()
    assert len(os.sched_getaffinity(0)) == cores, "this test fills every core of the host: run it where it may use them all"
    sampler, until = hostcpu.Sampler(), time.time() + 2.0
    procs = [multiprocessing.get_context("fork").Process(target=_spin, args=(until,)) for _ in range(cores)]
    for p in procs:
        p.start()
    try:
        start = time.time() + 0.3              # the loops running on every core
        while time.time() < until:
            sampler.tick(active=True)
            time.sleep(0.1)
    finally:
        for p in procs:
            p.join(5)
    got = hostcpu.over(sampler.record(), start, until - 0.1)
    assert got is not None and got["busy"] >= 0.9 and got["saturated_share"] >= 0.5, got
    assert got["user"] >= 0.8, got             # the loops run in user mode
