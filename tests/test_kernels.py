"""Native kernels against the pure-torch reference, bit for bit where the format is exact.

Each method runs as training runs it: three ranks' compressors, several steps (memories carry
over), every payload compared, then the decompressed sum of the three payloads, with and without
the bucket buffer as output. Edge cases: sizes that are not multiples of the packing width, sizes
that take the multi-threaded path, empty tensors, non-contiguous input, NaN and Inf, half and
bfloat16 gradients. QSGD's norms are sums whose order differs between the two, so they are
compared to float rounding and the codes are compared given the same norms.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gctestbed import compress, kernels
from gctestbed.compress import bitpack
from gctestbed.compress.base import Bucket, Payload
from gctestbed.compress.memory import Memory
from gctestbed.compress.quantize import _width, qsgd_levels, uniform24

pytestmark = pytest.mark.compiler

RANKS = 3
SIZES = [1, 15, 16, 17, 33, 1000, 70_001]      # 70,001: above the kernels' multi-thread cut-off
METHODS = ["twobit:threshold=0.001", "onebit:scale=0.001", "signsgd", "signum", "efsignsgd", "threshold:tau=0.001",
           "topk:ratio=0.05", "dgc:warmup_epochs=1,steps_per_epoch=2,min_numel=8", "dgc:fp16_values=true,min_numel=8,warmup_epochs=0",
           "variance", "variance:estimate=microbatch", "hybrid", "hybrid:estimate=microbatch"]


@pytest.fixture(scope="module")
def ops():
    return kernels.build()


class Stats:
    """Squares for variance as SampleStats gathers them (estimate=microbatch), and per-sample means
    a little off the step's gradient (estimate=sample, the default, centres on them)."""

    def __init__(self, grad: torch.Tensor, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.squares = (grad * RANKS) ** 2 / 4 + torch.rand(grad.numel(), generator=gen) * 1e-6
        self.means = grad * RANKS * (1 + 0.1 * torch.rand(grad.numel(), generator=gen))   # per sample: off the step's

    def take(self, params):
        return self.squares

    def take_means(self, params):
        return self.means

    def cuda(self) -> "Stats":
        """The same statistics on the GPU (what SampleStats holds for a model there)."""
        other = object.__new__(Stats)
        other.squares, other.means = self.squares.cuda(), self.means.cuda()
        return other


def identical(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")


def memories(c) -> dict[str, torch.Tensor]:
    """Every parameter's state in every memory of a compressor (and of the method error feedback wraps)."""
    out = {}
    for owner in (c, getattr(c, "inner", c)):
        for name, memory in vars(owner).items():
            if isinstance(memory, Memory):
                out.update({f"{name}[{pid}]": t for pid, t in memory.parts().items()})
    return out


def gradients(n: int, step: int, special: bool = False) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * n + step)
    grads = [torch.randn(n, generator=gen) * 1e-3 for _ in range(RANKS)]
    for g in grads:                                      # exactly on the thresholds: >= against >
        if n >= 16:
            g[7], g[9], g[11] = 1e-3, -1e-3, 0.0
    if special and n >= 8:
        for g in grads:
            g[1], g[3], g[5], g[n - 1] = float("nan"), float("inf"), float("-inf"), float("nan")
    return grads


def run_both(method: str, n: int, steps: int = 3, special: bool = False, shapes=None, transform=lambda g: g):
    """Every payload, memory and decompressed sum of ``steps`` steps, reference against native."""
    name, options = compress.resolve(method)
    sides = {mode: [compress.create(name, options, kernels=mode) for _ in range(RANKS)] for mode in ("torch", "native")}
    shapes = shapes or [torch.Size([n])]
    for step in range(steps):
        grads = gradients(n, step, special)
        payloads = {}
        for mode, comps in sides.items():
            payloads[mode] = []
            for rank, (c, g) in enumerate(zip(comps, grads)):
                if c.needs_own_loop():
                    c.sample_stats = Stats(g, step * 10 + rank)
                bucket = Bucket(key=0, shapes=shapes, step=step, rank=rank, world=RANKS)
                payloads[mode].append(c.encode(transform(g.clone()) if mode == "native" else g.clone(), bucket))
        for rank in range(RANKS):
            ref, nat = payloads["torch"][rank], payloads["native"][rank]
            for i, (a, b) in enumerate(zip(ref.reduce + ref.gather, nat.reduce + nat.gather)):
                identical(b, a, f"{method} n={n} step {step} rank {rank} payload tensor {i}")
            ref_mem, nat_mem = memories(sides["torch"][rank]), memories(sides["native"][rank])
            assert ref_mem.keys() == nat_mem.keys()
            for key in ref_mem:
                identical(nat_mem[key], ref_mem[key], f"{method} n={n} step {step} rank {rank} {key}")
        bucket = Bucket(key=0, shapes=shapes, step=step, rank=0, world=RANKS)
        outs = {}
        for mode, comps in sides.items():
            mine = payloads[mode][0]
            gathered = [p.gather for p in payloads[mode]]
            full = Payload(reduce=[sum(p.reduce[i] for p in payloads[mode]) for i in range(len(mine.reduce))],
                           gather=mine.gather, meta=mine.meta, gathered=gathered)
            outs[mode] = comps[0].decompress(full, bucket, n)
            if mode == "native":
                buffer = torch.full((n,), 7.0)
                into = comps[0].decompress(full, bucket, n, out=buffer)
                identical(into, outs[mode], f"{method} n={n} step {step}: decompress into a buffer")
        identical(outs["native"], outs["torch"], f"{method} n={n} step {step}: decompressed sum")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n", SIZES)
def test_native_matches_reference(ops, method, n):
    run_both(method, n)


DECODERS = ["twobit:threshold=0.001", "onebit:scale=0.001", "signsgd", "threshold:tau=0.001", "variance:estimate=microbatch", "topk:ratio=0.05",
            "qsgd:levels=1", "qsgd", "qsgd:levels=100,bucket_size=40"]


def decoded_sums(method: str, p: int, n: int, offset: int = 0, shuffle: bool = False) -> dict[str, torch.Tensor]:
    """The sum of p ranks' payloads, decoded by the reference and by the native kernels, written
    into a buffer ``offset`` elements into a larger one (unaligned output); with ``shuffle`` each
    sparse payload's entries are put out of order (the decoders' scattering path)."""
    name, options = compress.resolve(method)
    comps = {mode: compress.create(name, options, kernels=mode) for mode in ("torch", "native")}
    payloads = []
    for rank, g in enumerate(torch.randn(p, n, generator=torch.Generator().manual_seed(p * n)) * 1e-3):
        c = compress.create(name, options, kernels="torch")
        if c.needs_own_loop():
            c.sample_stats = Stats(g, rank)
        payloads.append(c.encode(g, Bucket(key=0, shapes=[torch.Size([n])], step=5, rank=rank, world=p)).gather)
    if shuffle:
        for tensors in payloads:
            order = torch.randperm(tensors[0].numel(), generator=torch.Generator().manual_seed(1))
            if name == "variance":
                codes = bitpack.unpack(tensors[1], 4, tensors[0].numel())[order]
                tensors[1] = bitpack.pack(codes, 4)
                tensors[0] = tensors[0][order]
            elif name == "topk":
                tensors[0], tensors[1] = tensors[0][order], tensors[1][order]
            else:
                tensors[0] = tensors[0][order]
    bucket = Bucket(key=0, shapes=[torch.Size([n])], step=5, world=p)
    full = Payload(gather=payloads[0], gathered=payloads)
    outs = {}
    for mode, c in comps.items():
        buffer = torch.full((n + offset,), 7.0)[offset:]
        result = c.decompress(full, bucket, n, out=buffer if mode == "native" else None)
        outs[mode] = result
    return outs


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8, 9, 17])
@pytest.mark.parametrize("method", DECODERS)
def test_decoders_sum_any_number_of_payloads_exactly(ops, method, p):
    """Every decoder's vectorised paths (payload loops unrolled up to 8, bit-sliced votes) against
    the reference, at sizes around its 16- and 512-element groups, into aligned and unaligned output."""
    for n, offset in ((1, 0), (15, 0), (16, 0), (17, 3), (511, 0), (1030, 5), (70_001, 0), (70_001, 1)):
        outs = decoded_sums(method, p, n, offset)
        identical(outs["native"], outs["torch"], f"{method} p={p} n={n} offset={offset}")


@pytest.mark.parametrize("method", ["threshold:tau=0.001", "variance:estimate=microbatch", "topk:ratio=0.05"])
def test_sparse_decoders_take_payloads_out_of_order(ops, method):
    """gctestbed's encoders send indices ascending and the decoders sum block by block; entries in
    any other order are found out and summed by scattering, with the same result."""
    for n in (1000, 70_001):
        outs = decoded_sums(method, 3, n, shuffle=True)
        identical(outs["native"], outs["torch"], f"{method} shuffled n={n}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ordered", [True, False])
def test_scatter_add_sums_values_of_every_dtype_in_payload_order(ops, dtype, ordered):
    n, gen = 70_001, torch.Generator().manual_seed(9)
    indices, values = [], []
    for q in range(5):
        idx = torch.randperm(n, generator=gen)[:3000]
        indices.append((idx.sort().values if ordered else idx).to(torch.int32))
        values.append((torch.randn(3000, generator=gen) * 10 ** -q).to(dtype))
    expected = torch.zeros(n)
    for idx, v in zip(indices, values):          # the reference's order: payload by payload
        step = torch.zeros(n)
        step[idx.long()] = v.float()
        expected += step
    identical(ops.scatter_add(indices, values, n), expected, f"scatter_add {dtype} ordered={ordered}")


WITHOUT_AVX512 = """
import sys, torch
from torch.utils import cpp_extension
from gctestbed import kernels
cpp_extension.load(name="gctestbed_ops", sources=[str(p) for p in kernels.sources(False)], build_directory=sys.argv[1],
                   extra_cflags=kernels.CFLAGS + ["-mno-avx512f"], extra_ldflags=["-fopenmp"], is_python_module=False)
kernels._ops = torch.ops.gctestbed
sys.path.insert(0, sys.argv[2])
import test_kernels as t
for method in t.DECODERS:
    for p in (1, 3, 9):
        for n, offset in ((17, 3), (1030, 5), (70_001, 1)):
            outs = t.decoded_sums(method, p, n, offset)
            t.identical(outs["native"], outs["torch"], f"{method} p={p} n={n} offset={offset} without AVX-512")
for method in ("threshold:tau=0.001", "variance:estimate=microbatch", "topk:ratio=0.05"):
    outs = t.decoded_sums(method, 3, 70_001, shuffle=True)
    t.identical(outs["native"], outs["torch"], f"{method} shuffled without AVX-512")
for method in t.METHODS:
    t.run_both(method, 70_001, steps=2)
print("bit-exact without AVX-512")
"""


def test_kernels_without_avx512_are_exact_too(tmp_path):
    """The kernels' portable paths (no AVX-512: AVX2 streaming stores, scalar lookups and votes),
    built here with -mno-avx512f in a process of their own, against the reference."""
    if "avx512f" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no AVX-512: the main build already runs the portable paths")
    done = subprocess.run([sys.executable, "-c", WITHOUT_AVX512, str(tmp_path), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "bit-exact without AVX-512" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("method", ["twobit:threshold=0.001", "onebit:scale=0.001", "signsgd", "threshold:tau=0.001",
                                    "dgc:warmup_epochs=0,min_numel=8", "efsignsgd"])
def test_nan_and_inf_behave_as_the_reference(ops, method):
    """Documented behaviour, the same in both: NaN is never sent and stays in the residual; Inf is
    sent as the largest code and stays Inf in the residual; a NaN sign packs as -1."""
    run_both(method, 1000, special=True)


def test_multi_tensor_dgc_bucket(ops):
    """DGC per tensor: a sparsified matrix, a dense vector, another matrix."""
    run_both("dgc:warmup_epochs=1,steps_per_epoch=2,min_numel=64", 64 * 30 + 30 + 20 * 40,
             shapes=[torch.Size([64, 30]), torch.Size([30]), torch.Size([20, 40])], steps=4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method", ["twobit:threshold=0.001", "onebit:scale=0.001", "signsgd", "threshold:tau=0.001"])
def test_half_gradients_are_read_as_float(ops, method, dtype):
    """The native kernels accept fp16/bf16 gradients and read them as float32; the reference is
    given the same values already converted."""
    name, options = compress.resolve(method)
    for n in (17, 70_001):
        g = gradients(n, 0)[0].to(dtype)
        ref, nat = compress.create(name, options, "torch"), compress.create(name, options, "native")
        bucket = Bucket(key=0, shapes=[torch.Size([n])])
        for a, b in zip(ref.encode(g.float(), bucket).gather, nat.encode(g, bucket).gather):
            identical(b, a, f"{method} {dtype}")


def test_non_contiguous_gradient(ops):
    run_both("twobit:threshold=0.001", 5000, transform=lambda g: torch.stack([g, g]).t()[:, 0])
    run_both("threshold:tau=0.001", 5000, transform=lambda g: torch.stack([g, g]).t()[:, 1])
    run_both("signsgd", 5000, transform=lambda g: torch.stack([g, g]).t()[:, 0])


def test_empty_tensors(ops):
    e, r = torch.zeros(0), torch.zeros(0)
    assert ops.twobit_encode(e, r, 0.1).numel() == 0
    assert ops.onebit_encode(e, r, 0.0, 0.1).numel() == 0
    assert ops.sign_pack(e).numel() == 0
    assert ops.threshold_encode(e, r, 0.1).numel() == 0
    assert ops.select_above(e, 0.1).numel() == 0
    none = torch.zeros(0, dtype=torch.int32)
    for decoded in (ops.twobit_decode([none, none], 0, 0.1), ops.onebit_decode([none], 0, 0.1),
                    ops.sign_vote([none], 0, 0.1), ops.threshold_decode([none], 0, 0.1),
                    ops.scatter_add([none], [torch.zeros(0)], 0), ops.sign_unpack(none, 0, 1.0)):
        assert decoded.numel() == 0 and decoded.dtype == torch.float32
    words, norms = ops.qsgd_encode(e, 7, 512, 4, 1)
    assert words.numel() == 0 and norms.numel() == 0
    idx, codes, scale = ops.variance_encode(e, e, r, torch.zeros(0), 1.0, 0.999, 0.0, 4, 2, False)
    assert idx.numel() == codes.numel() == 0 and float(scale) == 0.0
    assert ops.threshold_decode([torch.zeros(0, dtype=torch.int32)], 5, 0.1).tolist() == [0.0] * 5


@pytest.mark.parametrize("levels,n", [(7, 1000), (1, 33), (3, 70_001), (127, 4099)])
def test_qsgd_codes_given_the_same_norms(ops, levels, n):
    """Norms agree to float rounding; given the native norms, the reference draws the same
    numbers from the counter hash and makes the same codes; decoding is exact."""
    d, key = 512, 0xDEADBEEF
    g = gradients(n, 0)[0]
    words, norms = ops.qsgd_encode(g, levels, d, _width(levels), key)
    chunks = torch.zeros((n + d - 1) // d * d)
    chunks[:n] = g
    chunks = chunks.view(-1, d)
    torch.testing.assert_close(norms, chunks.norm(dim=1), rtol=2e-6, atol=0)
    codes = qsgd_levels(chunks, norms, levels, uniform24(key, chunks.numel())).reshape(-1)[:n]
    identical(words, bitpack.pack(codes, _width(levels)), "qsgd codes")
    name, options = compress.resolve(f"qsgd:levels={levels}")
    ref, nat = compress.create(name, options, "torch"), compress.create(name, options, "native")
    bucket = Bucket(key=0, shapes=[torch.Size([n])])
    other = ops.qsgd_encode(g * 2, levels, d, _width(levels), key + 1)
    full = Payload(gather=[words, norms], gathered=[[words, norms], list(other)])
    identical(nat.decompress(full, bucket, n), ref.decompress(full, bucket, n), "qsgd decoded sum")


def test_qsgd_noise_is_uniform_and_matches_the_hash():
    u = uniform24(12345, 200_000)
    assert 0 <= float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.002
    assert not torch.equal(uniform24(1, 1000), uniform24(2, 1000))


def test_qsgd_nonfinite_chunk_decodes_to_nan(ops):
    """A chunk holding NaN or Inf is not silently made finite: it decodes to NaN, in both paths."""
    g = gradients(1024, 0)[0]
    g[700] = float("inf")
    for mode in ("torch", "native"):
        c = compress.create("qsgd", compress.resolve("qsgd")[1], mode)
        bucket = Bucket(key=0, shapes=[torch.Size([1024])])
        p = c.encode(g, bucket)
        out = c.decompress(Payload(gather=p.gather, gathered=[p.gather]), bucket, 1024)
        assert torch.isnan(out[512:]).all() and torch.isfinite(out[:512]).all(), mode


def test_dgc_selection_without_sorting_matches_reference(ops):
    from gctestbed.compress.dgc import sampled_threshold_select
    smooth = gradients(200_000, 0)[0]
    levels = torch.randint(-6, 7, (200_000,), generator=torch.Generator().manual_seed(5)).float() * 1e-3
    trimmed = 0
    for g in (smooth, levels):                          # levels: thousands of ties at every threshold
        for density in (0.001, 0.01, 0.05, 0.25):
            a = sampled_threshold_select(g, density, 0.01, torch.Generator().manual_seed(3))
            b = sampled_threshold_select(g, density, 0.01, torch.Generator().manual_seed(3), ops)
            identical(b, a, f"dgc selection at {density}")
            assert torch.all(b[1:] > b[:-1]), "indices are ascending"
            k = max(1, int(density * g.numel() + 0.999))
            trimmed += b.numel() == k and int((g.abs() >= g.abs()[b].min()).sum()) > 1.3 * k
    assert trimmed, "some case went through the exact trim with ties"


def test_bad_input_is_refused_with_a_message(ops):
    g = torch.randn(100)
    with pytest.raises(RuntimeError, match="residual must be a contiguous float32"):
        ops.twobit_encode(g, torch.zeros(100, dtype=torch.float64), 0.1)
    with pytest.raises(RuntimeError, match="residual must be"):
        ops.threshold_encode(g, torch.zeros(99), 0.1)
    with pytest.raises(RuntimeError, match="fall outside"):
        ops.scatter_add([torch.tensor([5, 100], dtype=torch.int32)], [torch.ones(2)], 100)
    with pytest.raises(RuntimeError, match="fall outside"):
        ops.threshold_decode([torch.tensor([3, 200], dtype=torch.int32)], 100, 0.1)
    with pytest.raises(RuntimeError, match="fewer than the"):
        ops.twobit_decode([torch.zeros(3, dtype=torch.int32)], 100, 0.1)
    with pytest.raises(RuntimeError, match="out must be"):
        ops.onebit_decode([torch.zeros(4, dtype=torch.int32)], 100, 0.1, torch.zeros(50))
    with pytest.raises(RuntimeError, match="sample indices fall outside"):
        ops.dgc_select(g, torch.tensor([0, 100]), 1, 1)
    with pytest.raises(RuntimeError, match="levels do not fit"):
        ops.qsgd_encode(g, 7, 512, 2, 0)


def test_only_methods_with_kernels_load_them(ops):
    for name in ("none", "fp16", "powersgd", "randomk", "terngrad"):
        assert compress.create(name, compress.resolve(name)[1], kernels="native").ops is None, name
    for name in ("twobit", "threshold", "dgc", "signsgd", "efsignsgd", "variance", "qsgd", "topk"):
        assert compress.create(name, compress.resolve(name)[1], kernels="native").ops is ops, name


def test_no_compiler_falls_back_with_one_warning(tmp_path):
    code = ("from gctestbed import compress\n"
            "a = compress.create('twobit', {'threshold': 0.001}, kernels='native')\n"
            "b = compress.create('signsgd', {'scale': 0.001}, kernels='native')\n"
            "import torch\n"
            "from gctestbed.compress.base import Bucket\n"
            "a.encode(torch.randn(100), Bucket(key=0, shapes=[torch.Size([100])]))\n"
            "print(a.ops is None and b.ops is None)\n")
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "GCTESTBED_BUILD_DIR": str(tmp_path / "build")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    warnings = [line for line in done.stderr.splitlines() if "native kernels unavailable" in line]
    assert len(warnings) == 1, done.stderr
    assert "install g++" in warnings[0]


def test_the_same_sources_elsewhere_load_the_build_there_is(ops, tmp_path, monkeypatch):
    """The kernels' build is named for the sources' content, not their place: the same sources
    copied elsewhere (another checkout, a CI clone, an installed wheel) load the build there is,
    and nothing is compiled or linked again (no new build directory; the library's modification
    time, which the file system keeps, is unchanged); one byte changed names another build
    directory."""
    name = "gctestbed_ops_cuda" if kernels._with_cuda else "gctestbed_ops"
    directory, _ = kernels.staged(name, [], cpu=True)
    library = directory / f"{name}.so"
    before, builds = library.stat().st_mtime_ns, sorted(p.name for p in directory.parent.iterdir())
    copy = tmp_path / "native"
    shutil.copytree(kernels.SOURCE_DIR, copy)
    code = ("import sys; from pathlib import Path; from gctestbed import kernels\n"
            "kernels.SOURCE_DIR = Path(sys.argv[1]); kernels.build(); print('loaded')")
    done = subprocess.run([sys.executable, "-c", code, str(copy)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr[-2000:]
    # no build of its own beside this one (planted: the key taken from the sources' place, which
    # built the copy into a new directory and left this library alone), and this one not rebuilt
    assert sorted(p.name for p in directory.parent.iterdir()) == builds
    assert library.stat().st_mtime_ns == before
    header = copy / "cpu" / "common.h"
    header.write_text(header.read_text() + "\n// one more line\n")
    monkeypatch.setattr(kernels, "SOURCE_DIR", copy)
    monkeypatch.setenv("GCTESTBED_BUILD_DIR", str(tmp_path / "build"))     # its copy is written there, not in the cache
    assert kernels.staged(name, [], cpu=True)[0].name != directory.name


def test_kernels_build_and_bench_commands(ops):
    built = subprocess.run([sys.executable, "-m", "gctestbed", "kernels", "build"], capture_output=True, text=True,
                           timeout=600)
    assert built.returncode == 0 and "native kernels ready" in built.stdout, built.stderr
    bench = subprocess.run([sys.executable, "-m", "gctestbed", "bench", "kernels", "--size", "40000", "--json"],
                           capture_output=True, text=True, timeout=600)
    assert bench.returncode == 0, bench.stderr
    report = json.loads(bench.stdout)
    assert report["copy_gbps"] > 0 and report["size"] == 40000
    names = [r["kernel"] for r in report["rows"]]
    for expected in ("twobit encode+residual", "sign pack", "threshold select+residual", "variance criterion+4-bit",
                     "qsgd quantise+pack", "dgc sampled select 0.1%"):
        assert expected in names
    for row in report["rows"]:
        assert row["native_ms"] > 0 and row["reference_ms"] > 0 and row["pct_copy"] > 0
    assert "vs_topk" in report["rows"][-1]
    if not torch.cuda.is_available():
        refused = subprocess.run([sys.executable, "-m", "gctestbed", "bench", "kernels", "--device", "cuda"],
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "needs a GPU" in refused.stderr and "Traceback" not in refused.stderr


CUDA_SOURCES = sorted((kernels.SOURCE_DIR / "cuda").glob("*.cu"))


@pytest.fixture(scope="module")
def nvcc_builds(tmp_path_factory):
    """Every .cu file handed to nvcc, and bindings.cpp with its CUDA path to the C++ compiler, all
    at once, as many at a time as this host has cores (each compile is one process on one core:
    one after another they took 50 s here). ``bindings.cpp``: bindings.cpp with
    GCTESTBED_WITH_CUDA, against torch's headers and CUDA's. The CPU wheel of torch lacks one
    generated header of c10/cuda (build macros); a one-line stand-in supplies it."""
    from concurrent.futures import ThreadPoolExecutor
    from torch.utils import cpp_extension
    out = tmp_path_factory.mktemp("nvcc")
    stub = out / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    cuda_home = cpp_extension.CUDA_HOME or "/usr/local/cuda"
    binding = [os.environ.get("CXX", "c++"), "-std=c++17", "-fsyntax-only", "-DGCTESTBED_WITH_CUDA", f"-I{out}"]
    binding += [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{Path(cuda_home) / 'include'}"]
    commands = {"bindings.cpp": binding + [str(kernels.SOURCE_DIR / "bindings.cpp")]}
    commands |= {source.name: ["nvcc", "-std=c++17", "-O3", "--fmad=false", "-arch=sm_90", "-c", str(source),
                               "-o", str(out / f"{source.stem}.o")] for source in CUDA_SOURCES}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        yield {name: pool.submit(subprocess.run, args, capture_output=True, text=True, timeout=600)
               for name, args in commands.items()}


@pytest.mark.nvcc
@pytest.mark.parametrize("source", CUDA_SOURCES, ids=lambda p: p.name)
def test_cuda_source_compiles(source, nvcc_builds):
    """Every .cu file builds with nvcc (no GPU needed), so CUDA code that does not build never lands."""
    done = nvcc_builds[source.name].result()
    assert done.returncode == 0, done.stderr


@pytest.mark.nvcc
def test_binding_compiles_with_its_cuda_path(nvcc_builds):
    """bindings.cpp with GCTESTBED_WITH_CUDA against torch's headers and CUDA's (see nvcc_builds)."""
    done = nvcc_builds["bindings.cpp"].result()
    assert done.returncode == 0, done.stderr


@pytest.mark.cuda
def test_cuda_kernels_match_cpu(ops):
    """On a GPU: every method's native CUDA path against the reference on the CPU."""
    if not (torch.cuda.is_available() and kernels.cuda_build_possible()):
        pytest.skip("needs a GPU and nvcc")
    for method in METHODS:
        name, options = compress.resolve(method)
        for n in (17, 70_001):
            cpu_c = compress.create(name, options, "torch")
            gpu_c = compress.create(name, options, "native")
            g = gradients(n, 0)[0]
            if cpu_c.needs_own_loop():
                cpu_c.sample_stats = Stats(g, 0)
                gpu_c.sample_stats = Stats(g, 0).cuda()
            bucket = Bucket(key=0, shapes=[torch.Size([n])], world=RANKS)
            a, b = cpu_c.encode(g, bucket), gpu_c.encode(g.cuda(), bucket)
            for i, (x, y) in enumerate(zip(a.reduce + a.gather, b.reduce + b.gather)):
                identical(y.cpu(), x, f"{method} n={n} CUDA payload {i}")
            out_a = cpu_c.decompress(Payload(reduce=a.reduce, gather=a.gather, meta=a.meta, gathered=[a.gather] * 2), bucket, n)
            out_b = gpu_c.decompress(Payload(reduce=b.reduce, gather=b.gather, meta=b.meta, gathered=[b.gather] * 2), bucket, n)
            identical(out_b.cpu(), out_a, f"{method} n={n} CUDA decompressed")
