"""A CPU node's phases carry the thread CPU seconds they took, and a spinning replay counts them.

The independent clock is the kernel's: a thread that sleeps is charged no CPU time, and a thread
that shares one core with another busy thread gets about half of it. So a phase that sleeps must
come back with wall time but little CPU time, and a replay that spins recorded CPU seconds must
take longer by the wall clock when its core is shared, where one that spins wall time does not.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gctestbed.compress import hook
from gctestbed.compress.base import Compressor, Payload
from gctestbed.spec import UserError
from gctestbed.workloads.replay import ReplayModel, ReplayOptions, cpu_clock
from test_trace import _tiny_trace


def _burn(seconds: float) -> None:
    """Take ``seconds`` of this thread's CPU (the kernel's count)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class SleepThenBurn(Compressor):
    """Sends the bucket as it is; its encode sleeps 40 ms then burns 20 ms of CPU, its decode sleeps
    30 ms then burns 10 ms."""

    name = "sleep-then-burn"

    def encode(self, grad, bucket):
        time.sleep(0.04)
        _burn(0.02)
        return Payload(reduce=[grad])

    def decode(self, tensors, meta, bucket, numel):
        time.sleep(0.03)
        _burn(0.01)
        return tensors[0]


class SleepyLinear(torch.nn.Linear):
    """A linear layer whose forward sleeps 50 ms (wall time that is no CPU time), then burns 20 ms."""

    def forward(self, x):
        time.sleep(0.05)
        _burn(0.02)
        return super().forward(x)


def _steps(threads: int = 1, steps: int = 2) -> list[dict]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = DDP(SleepyLinear(64, 64), bucket_cap_mb=25)
        state = hook.install(model, SleepThenBurn())
        out = []
        for _ in range(steps):
            model(torch.randn(4, 64)).sum().backward()
            out.append(state.take_step_stats())
        return out
    finally:
        torch.set_num_threads(before)


def test_the_hook_records_each_phases_thread_cpu_apart_from_its_wall_time(single_rank_group):
    """Each phase sleeps (no CPU) and burns a known CPU time: forward 50 ms and 20 ms, encode 40 and
    20, decode 30 and 10. Planted: CPU seconds taken from the wall clock -> the sleeps count as CPU
    and the upper bounds fail; a phase's CPU time left at 0 -> the lower bounds fail."""
    for stats in _steps():
        ex, = stats["exchanges"]
        assert ex["ready_s"] >= 0.07 and 0.018 <= ex["ready_cpu_s"] < ex["ready_s"] - 0.04, ex
        assert ex["encode_s"] >= 0.06 and 0.018 <= ex["encode_cpu_s"] <= 0.035, ex
        assert ex["decode_s"] >= 0.04 and 0.009 <= ex["decode_cpu_s"] <= 0.025, ex


def test_with_more_than_one_intra_op_thread_no_cpu_time_is_claimed(single_rank_group):
    """The pool's other threads do work the timing thread's clock does not see: null, not an undercount."""
    ex, = _steps(threads=2, steps=1)[0]["exchanges"]
    assert ex["encode_s"] >= 0.06 and (ex["ready_cpu_s"], ex["encode_cpu_s"], ex["decode_cpu_s"]) == (None, None, None)


@pytest.mark.parametrize("cpu", [True, False])
def test_a_spinning_replay_counts_cpu_seconds_or_wall_seconds_as_told(cpu):
    """A parameter recorded ready 100 ms into the step, and 80 ms of sleep between forward and
    backward (wall time, no CPU): on the CPU clock the hand-over still needs 100 ms of the thread's
    CPU (about 180 ms from forward by the wall clock); on the wall clock it comes at 100 ms.
    Planted: the CPU clock as the wall clock -> the first case hands over at about 100 ms."""
    model = ReplayModel([("module.w", [4])], [{"module.w": 0.1}] * 2, {"module.w": 0}, "spin", 1.0, seed=0, cpu=cpu)
    t, c = time.perf_counter(), time.thread_time()
    out = model(torch.zeros(1))
    time.sleep(0.08)
    out.sum().backward()
    took, spent = time.perf_counter() - t, time.thread_time() - c
    if cpu:
        assert took >= 0.17 and spent >= 0.095, (took, spent)
    else:
        assert 0.095 <= took < 0.15 and spent < 0.06, (took, spent)


SHARED_CORE = textwrap.dedent("""
    import os, threading, time, torch
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})     # this thread and those it starts: one core
    torch.set_num_threads(1)
    from gctestbed.timing import Waiter
    stop = threading.Event()
    def hog():
        a = torch.rand(256, 256)
        while not stop.is_set():
            torch.mm(a, a)
    busy = threading.Thread(target=hog)
    busy.start()
    time.sleep(0.05)
    out = []
    for cpu in (True, False):
        t, c = time.perf_counter(), time.thread_time()
        Waiter(spin=True, cpu=cpu).wait(0.3)
        out.append((time.perf_counter() - t, time.thread_time() - c))
    stop.set()
    busy.join()                 # not left inside torch.mm at exit (a C++ abort)
    print(out)
""")


def test_on_a_shared_core_a_cpu_wait_takes_longer_than_its_seconds_and_a_wall_wait_does_not():
    """One core, a second thread busy on it: waiting 300 ms of the thread's CPU takes about twice
    that by the wall clock (the kernel shares the core), waiting 300 ms of wall time takes 300 ms
    and gets about half of it as CPU. Planted: the CPU clock as the wall clock -> the CPU wait
    reads 300 ms."""
    done = subprocess.run([sys.executable, "-c", SHARED_CORE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (cpu_wall, cpu_spent), (wall_wall, wall_spent) = eval(done.stdout)
    assert cpu_spent >= 0.29 and cpu_wall >= 0.45, (cpu_wall, cpu_spent)
    assert 0.29 <= wall_wall < 0.4 and wall_spent < 0.25, (wall_wall, wall_spent)


def _trace(**bucket) -> dict:
    b = {"bucket": 0, "layout": 0, "ready_s": 0.1, "encode_s": 0.01, "decode_s": 0.01, **bucket}
    return {"ranks": [{"rank": 0, "steps": [{"step": 0, "optim_s": 0.01, "optim_cpu_s": 0.01, "buckets": [b]}]}]}


def test_the_clock_is_cpu_only_for_a_spin_over_a_trace_with_every_cpu_time_it_waits():
    full = _trace(ready_cpu_s=0.08, encode_cpu_s=0.01, decode_cpu_s=0.01)
    assert cpu_clock(ReplayOptions(trace="t", compute="spin"), full)
    assert not cpu_clock(ReplayOptions(trace="t", compute="sleep"), full)
    assert not cpu_clock(ReplayOptions(trace="t", compute="spin", clock="wall"), full)
    ready_only = _trace(ready_cpu_s=0.08)               # a codec run for real needs no encode CPU time
    assert cpu_clock(ReplayOptions(trace="t", compute="spin"), ready_only)
    assert not cpu_clock(ReplayOptions(trace="t", compute="spin", codec="recorded"), ready_only)
    with pytest.raises(UserError, match="encode_cpu_s, decode_cpu_s"):
        cpu_clock(ReplayOptions(trace="t", compute="spin", codec="recorded", clock="cpu"), ready_only)
    with pytest.raises(UserError, match="ready_cpu_s"):
        cpu_clock(ReplayOptions(trace="t", compute="spin", clock="cpu"), _trace())      # a GPU's, or older
    with pytest.raises(ValueError, match="compute=spin"):
        ReplayOptions(trace="t", compute="sleep", clock="cpu")


def _trace_with_cpu_times(path, cpu: bool = True) -> str:
    """test_trace's hand-made trace of a twobit run (one rank, two steps, one bucket; ready 10 ms,
    encode and decode 1 ms of wall time) with an optimizer time of 10 ms and, with ``cpu``, CPU
    times far from those: ready 120 ms of CPU, encode 60, decode 1, the optimizer 80. Without
    ``cpu``, no CPU times (a GPU's trace, or an older one)."""
    from gctestbed import tracefile
    trace = tracefile.load(_tiny_trace(path))
    for step in trace["ranks"][0]["steps"]:
        step.update(optim_s=0.01, optim_cpu_s=0.08 if cpu else None)
        if cpu:
            step["buckets"][0].update(ready_cpu_s=0.12, encode_cpu_s=0.06, decode_cpu_s=0.001)
    tracefile.save(trace, str(path))
    return str(path)


def _cpu_of(fn) -> float:
    c = time.thread_time()
    fn()
    return time.thread_time() - c


@pytest.mark.parametrize("clock", ["", "wall"])
def test_a_spinning_replay_of_a_cpu_trace_waits_its_cpu_times_from_the_trace(tmp_path, clock):
    """From the trace file through the options to the waits: by default (or clock=cpu) a spin takes
    the recorded CPU seconds of the compute (120 ms), the encode (60) and the optimizer (80), each
    counted by the kernel on the thread that waits; clock=wall takes the recorded wall times (10, 1,
    10 ms). Planted: schedule, the recorded codec or the recorded optimizer reading the wall times
    under the CPU clock -> the default case spins 10, 1 or 10 ms."""
    from gctestbed import flags, workloads
    from gctestbed.compress import create
    from gctestbed.compress.base import Bucket
    from gctestbed.compress.recorded import RecordedCodec
    path = _trace_with_cpu_times(tmp_path / "t.json")
    spec = flags.build_spec(replay=f"{path},compute=spin,codec=recorded,optim=recorded" + (f",clock={clock}" if clock else ""),
                            steps="2")
    work = workloads.build("replay", spec.workload_options, seed=0, rank=0, batch_size=16)
    compute = _cpu_of(lambda: work.model(torch.zeros(1)).sum().backward())
    codec = RecordedCodec(create("twobit", {"threshold": 0.5}), **work.codec)
    encode = _cpu_of(lambda: codec.encode(torch.zeros(10), Bucket(key=0, shapes=[torch.Size([10])], step=0, world=1)))
    optim = _cpu_of(work.optimizer(torch.optim.SGD(work.model.parameters(), lr=0.1)).step)
    if clock == "":
        assert compute >= 0.115 and encode >= 0.058 and optim >= 0.078, (compute, encode, optim)
    else:
        assert compute < 0.06 and encode < 0.03 and optim < 0.04, (compute, encode, optim)


def test_a_cpu_clock_is_refused_before_the_run_where_it_cannot_count(tmp_path):
    """In one sentence when the spec is built, not in the nodes: a trace without the CPU times, or a
    spin on a GPU (backward on another thread than forward); left out, the clock the spin resolves
    to (the wall clock on a GPU or without CPU times) is written into the spec."""
    from gctestbed import flags
    from gctestbed.spec import SpecError
    without = _trace_with_cpu_times(tmp_path / "without.json", cpu=False)
    with pytest.raises(SpecError, match="lacks ready_cpu_s"):
        flags.build_spec(replay=f"{without},compute=spin,clock=cpu", steps="2")
    # the clock the spin resolved to is written into the run's spec
    assert flags.build_spec(replay=f"{without},compute=spin", steps="2").workload_options["clock"] == "wall"
    path = _trace_with_cpu_times(tmp_path / "t.json")
    assert flags.build_spec(replay=f"{path},compute=spin", steps="2").workload_options["clock"] == "cpu"
    assert flags.build_spec(replay=f"{path},compute=spin,clock=wall", steps="2").workload_options["clock"] == "wall"
    with pytest.raises(SpecError, match="on a GPU"):
        flags.build_spec(replay=f"{path},compute=spin,clock=cpu", steps="2", device="cuda", backend="gloo")
    on_gpu = flags.build_spec(replay=f"{path},compute=spin", steps="2", device="cuda", backend="gloo")
    assert on_gpu.workload_options["clock"] == "wall"
