"""The host's CPU over a run's steps (gctestbed.hostcpu): a golden case worked out by hand from
/proc/stat's rule (busy = everything but idle and iowait), the kernel's own counters against a
load this test makes (every core spun), and the bound on what a long run stores."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from gctestbed import hostcpu


def _record(rows):
    return {"fields": list(hostcpu.FIELDS), "samples": [list(r) for r in rows]}


def test_the_window_s_shares_and_saturated_time_as_worked_out_by_hand():
    # 2 cores at 100 ticks/s: 200 ticks a second. Columns: t, user, system, irq, idle, steal (cumulative)
    rows = [(10.0, 0, 0, 0, 0, 0),
            (11.0, 100, 50, 46, 4, 0),        # 196 of 200 busy: 98 %, saturated
            (12.0, 150, 70, 56, 124, 0),      # 80 of 200 busy: 40 %
            (14.0, 300, 200, 170, 130, 0),    # 394 of 400 busy: 98.5 %, saturated
            (20.0, 0, 0, 0, 0, 0)]            # outside the window: left out
    got = hostcpu.over(_record(rows), 10.0, 14.0)
    # over 10-14 s: 800 ticks, 130 idle; user 300, system 200, irq 170; saturated 1 s + 2 s of 4 s
    assert got == pytest.approx({"window_s": 4.0, "busy": 670 / 800, "user": 300 / 800, "system": 200 / 800,
                                 "irq": 170 / 800, "steal": 0.0, "saturated_share": 0.75})
    assert hostcpu.over(_record(rows), 10.5, 11.5) is None      # one sample inside: no figure
    assert hostcpu.over(None, 0, 1) is None


def test_a_long_run_keeps_at_most_the_bound_first_and_last_included():
    sampler = hostcpu.Sampler()
    sampler.tick(active=False)                # the sample just before the steps began is kept
    before = sampler._before
    for _ in range(3 * hostcpu.MAX_SAMPLES + 7):
        sampler.tick(active=True)
    samples = sampler.record()["samples"]
    assert len(samples) <= hostcpu.MAX_SAMPLES and samples[0] == [round(v, 3) for v in before]
    assert [s[0] for s in samples] == sorted(s[0] for s in samples)
    assert samples[-1] == [round(v, 3) for v in sampler.samples[-1]]


def _spin(until):
    while time.time() < until:
        pass


def test_the_kernel_counts_every_core_spun_as_saturated():
    """A load this test knows: one busy loop per core for 2 s. The kernel's counters, read as a
    run reads them, must call the host saturated for most of it."""
    sampler, until = hostcpu.Sampler(), time.time() + 2.0
    procs = [multiprocessing.get_context("fork").Process(target=_spin, args=(until,)) for _ in range(os.cpu_count())]
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
