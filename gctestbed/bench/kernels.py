"""``gctestbed bench kernels``: each compressor kernel, native against its pure-torch reference.

Both sides run what training runs: a compressor created with ``kernels="native"`` and one with
``kernels="torch"``, on the same synthetic gradient (normal, sd 1e-3). Encoders include their
residual memory where the method has one, zeroed (untimed) before each call so every call sees
the same density; decoders sum ``payloads`` ranks' payloads into a preallocated buffer, as the
hook does into DDP's bucket. Effective GB/s counts the bytes a kernel must move (inputs read
once, outputs written once) and is set against this machine's copy bandwidth: torch's ``copy_``
of a buffer of the same size, timed before each timed call of the kernel (a shared host's memory
bandwidth drifts; a figure set against copies taken minutes earlier drifts with it). Selection
kernels are also timed against ``torch.topk``.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable

import torch

from .. import compress, kernels
from ..compress.base import Bucket, Payload, seeded
from ..compress.dgc import sample_sizes, sampled_threshold_select
from ..compress.memory import Memory
from ..timing import now

SD = 1e-3


def _once(device: torch.device, fn: Callable[[], object]) -> float:
    """Seconds of one call of ``fn``, the device's queued work included."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = now()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return now() - start


def timer(device: torch.device, reps: int):
    """The best of ``reps`` timed calls of a function, after one untimed (the device's queued work
    included): this bench's timer, and scripts/gpu-check's selection profile's."""
    def best(fn: Callable[[], object], setup: Callable[[], object] = lambda: None) -> float:
        setup()
        fn()                                              # warm-up: first-touch, caches, lazy init
        times = []
        for _ in range(reps):
            setup()                                       # untimed: e.g. memories back to zero
            times.append(_once(device, fn))
        return min(times)
    return best


def _beside_copy(device: torch.device, n: int, reps: int):
    """Like ``timer``, but each timed call is preceded by a timed copy of n float32: (best seconds
    of the call, best copy bandwidth around it). A shared host's memory bandwidth drifts over
    seconds; a kernel's share of the copy bandwidth is taken against the copies timed beside it."""
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)

    def best(fn: Callable[[], object], setup: Callable[[], object] = lambda: None) -> tuple[float, float]:
        setup()
        fn()                                              # warm-up
        calls, copies = [], []
        for _ in range(reps):
            copies.append(_once(device, lambda: dst.copy_(src)))
            setup()
            calls.append(_once(device, fn))
        return min(calls), 8 * n / min(copies)
    return best


class _MicroBatches:
    """SampleStats stand-in for variance (estimate=microbatch): squares of m = 4 micro-batch gradients that scatter
    around the gradient (sd 40x its own): a few per cent of the elements are sent."""

    def __init__(self, grad: torch.Tensor, world: int, m: int = 4):
        gen = torch.Generator().manual_seed(1)
        raw = grad * world
        parts = [raw + torch.randn(grad.numel(), generator=gen).to(grad.device) * 40 * SD for _ in range(m)]
        mean = sum(parts) / m
        self.squares = sum((p - mean + raw) ** 2 for p in parts) / m ** 2

    def take(self, params) -> torch.Tensor:
        return self.squares


def _pair(name: str, options: str = ""):
    text = f"{name}:{options}" if options else name
    method, opts = compress.resolve(text)
    return compress.create(method, opts, kernels="torch"), compress.create(method, opts, kernels="native")


def _reset(c) -> None:
    """Zero a compressor's memories (residual, r and v), so every timed call sees the same state."""
    for owner in (c, getattr(c, "inner", c)):
        for memory in vars(owner).values():
            if isinstance(memory, Memory):
                memory.zero_()


def _cases(n: int, payloads: int, device: torch.device):
    """(kernel, bytes moved, reference fn, native fn, setup fn, topk fn or None) per kernel."""
    g = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(device) * SD
    p = payloads
    bucket = Bucket(key=0, shapes=[torch.Size([n])], step=1000, world=p)
    out = torch.empty(n, device=device)
    stats = _MicroBatches(g, p)
    words2, words1 = 4 * math.ceil(n / 16), 4 * math.ceil(n / 32)
    tau3 = 3 * SD

    def setup_stats(c):
        getattr(c, "inner", c).sample_stats = stats

    def encode_case(kernel, name, options, nbytes, needs_stats=False):
        ref, nat = _pair(name, options)
        if needs_stats:
            setup_stats(ref), setup_stats(nat)
        return (kernel, nbytes, lambda: ref.encode(g, bucket), lambda: nat.encode(g, bucket),
                lambda: (_reset(ref), _reset(nat)), None)

    def decode_case(kernel, name, options, needs_stats=False):
        ref, nat = _pair(name, options)
        if needs_stats:
            setup_stats(ref), setup_stats(nat)
        payload = nat.encode(g, bucket)
        gathered = Payload(gather=payload.gather, meta=payload.meta, gathered=[payload.gather] * p)
        nbytes = p * payload.nbytes + 4 * n
        return (kernel, nbytes, lambda: ref.decompress(gathered, bucket, n, out),
                lambda: nat.decompress(gathered, bucket, n, out), lambda: None, None)

    cases = [
        encode_case("twobit encode+residual", "twobit", f"threshold={tau3}", 12 * n + words2),
        decode_case(f"twobit decode x{p}", "twobit", f"threshold={tau3}"),
        encode_case("onebit encode+residual", "onebit", f"scale={SD}", 12 * n + words1),
        decode_case(f"onebit decode x{p}", "onebit", f"scale={SD}"),
        encode_case("sign pack", "signsgd", "", 4 * n + words1),
        decode_case(f"sign majority vote x{p}", "signsgd", ""),
        encode_case("threshold select+residual", "threshold", f"tau={tau3}", 12 * n),
        decode_case(f"threshold scatter x{p}", "threshold", f"tau={tau3}"),
        encode_case("variance criterion+4-bit", "variance", "estimate=microbatch", 24 * n, needs_stats=True),
        decode_case(f"variance decode x{p}", "variance", "estimate=microbatch", needs_stats=True),
        encode_case("qsgd quantise+pack", "qsgd", "", 4 * n + 4 * math.ceil(n / 8)),
        decode_case(f"qsgd decode x{p}", "qsgd", ""),
        decode_case(f"sparse scatter-add x{p} (topk 1%)", "topk", "ratio=0.01"),
    ]
    density = 0.001
    k = sample_sizes(n, density, 0.01)[0]
    ops = kernels.load("native")
    select = lambda o: lambda: sampled_threshold_select(g, density, 0.01, seeded(0, 0, 0, 0), o)   # noqa: E731
    cases.append(("dgc sampled select 0.1%", 4 * n, select(None), select(ops), lambda: None,
                  lambda: torch.topk(g.abs(), k, sorted=False)))
    return cases


def run(size: int, device: str, payloads: int = 4, on_phase: Callable[[str], None] = lambda text: None) -> dict:
    """Time every kernel; a report with the machine, the copy bandwidth and one row per kernel."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        from ..spec import UserError
        raise UserError("--device cuda needs a GPU that torch can see; this machine has none.")
    ops = kernels.load("native")
    if ops is None or not kernels.supports(ops, torch.empty(0, device=dev)):
        from ..spec import UserError
        raise UserError(f"no native kernels for {device} here (see the message above); nothing to compare.")
    fast, slow = _beside_copy(dev, size, 5), timer(dev, 2)
    rows = []
    for name, nbytes, ref_fn, nat_fn, setup, topk_fn in _cases(size, payloads, dev):
        on_phase(name)
        (native_s, copy_bps), reference_s = fast(nat_fn, setup), slow(ref_fn, setup)
        row = {"kernel": name, "native_ms": native_s * 1e3, "reference_ms": reference_s * 1e3,
               "speedup": reference_s / native_s, "bytes": nbytes, "gbps": nbytes / native_s / 1e9,
               "copy_gbps": copy_bps / 1e9, "pct_copy": 100 * nbytes / native_s / copy_bps}
        if topk_fn is not None:
            topk_s = slow(topk_fn)
            row.update(topk_ms=topk_s * 1e3, vs_topk=topk_s / native_s)
        rows.append(row)
    return {"machine": machine(dev), "device": device, "size": size, "payloads": payloads,
            "threads": torch.get_num_threads(), "copy_gbps": statistics.median(r["copy_gbps"] for r in rows), "rows": rows}


def machine(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor())
    import os
    return f"{model}, {os.cpu_count()} cores"
