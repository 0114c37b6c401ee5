"""Native code of gctestbed, built on first use with torch.utils.cpp_extension (ninja) and cached.

Sources ship inside the package (``gctestbed/native/``), so an installed gctestbed builds them as
a source tree does. Each build directory is named for the sources' content, and the build reads a
copy of them kept there: cpp_extension rebuilds whenever the sources' paths change, so without the
copy every checkout, clone or installed wheel of the same sources would build them again (about
30 s here). Concurrent builds of the same target wait for each other on cpp_extension's lock.

Two kinds of native code: standalone programs (the delay line) and the compressor kernels,
which register ``torch.ops.gctestbed.*`` (native/bindings.cpp). The kernels choose CPU or CUDA
code by the tensors' device; CUDA code is built when torch sees a GPU and nvcc is present.
Where no compiler is found the compressors fall back to their pure-torch reference, saying so
once per process.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from .spec import KERNEL_MODES, UserError

SOURCE_DIR = Path(__file__).resolve().parent / "native"


def build_dir() -> Path:
    return Path(os.environ.get("GCTESTBED_BUILD_DIR", Path.home() / ".cache" / "gctestbed" / "build"))


def _ninja_on_path() -> None:
    """cpp_extension runs ``ninja`` from PATH; the PyPI wheel's binary may not be on it."""
    if shutil.which("ninja"):
        return
    try:
        import ninja
    except ImportError:
        raise UserError("building native code needs ninja: pip install ninja (or apt-get install ninja-build).") from None
    os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"


def _check_sources(name: str, paths: list[Path]) -> None:
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise UserError(f"the sources of {name} are missing ({', '.join(missing)}): reinstall gctestbed (pip install --force-reinstall gctestbed): its package data is incomplete.")


SOURCE_SUFFIXES = (".cpp", ".h", ".cu", ".cuh")


def staged(name: str, relative: list[str], cpu: bool) -> tuple[Path, list[Path]]:
    """The build directory of ``name`` for the native sources' content (and, with ``cpu``, this
    CPU's features: -march=native), and the paths of ``relative`` (under native/) in the copy of
    every source kept there, so one content is built once whichever copy of gctestbed asks."""
    import hashlib
    files = sorted(p for p in SOURCE_DIR.rglob("*") if p.suffix in SOURCE_SUFFIXES)
    contents = {p.relative_to(SOURCE_DIR).as_posix(): p.read_bytes() for p in files}
    digest = hashlib.sha1()
    for rel, data in contents.items():
        digest.update(rel.encode() + b"\0" + hashlib.sha1(data).digest())
    directory = build_dir() / "-".join([name, *([cpu_signature()] if cpu else []), digest.hexdigest()[:12]])
    for rel, data in contents.items():
        target = directory / "src" / rel
        if not target.exists() or target.read_bytes() != data:     # unchanged copies keep their times: no rebuild
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, target)
    return directory, [directory / "src" / r for r in relative]


def _check_compiler(name: str) -> None:
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        raise UserError(f"building {name} needs a C++ compiler: install g++ (apt-get install g++).")
    _ninja_on_path()


def _first_error(log: str) -> str:
    """The compiler's first error line of a failed build's log (the whole log is long)."""
    lines = log.splitlines()
    return next((line.strip() for line in lines if "error:" in line), lines[0] if lines else "unknown error")


def executable(name: str, sources: list[str]) -> str:
    """Path of the standalone program ``name`` built from ``sources`` (relative to native/)."""
    _check_sources(name, [SOURCE_DIR / s for s in sources])
    _check_compiler(name)
    from torch.utils import cpp_extension

    directory, paths = staged(name, sources, cpu=False)
    try:
        return cpp_extension.load(name=name, sources=[str(p) for p in paths], build_directory=str(directory),
                                  extra_cflags=["-O2", "-std=c++17"], extra_ldflags=["-Wl,--as-needed"],
                                  is_python_module=False, is_standalone=True, verbose=False)
    except RuntimeError as e:
        raise UserError(f"building {name} failed: {_first_error(str(e))}") from None


# -march=native: the build directory is named for this CPU's features, so a cached build never runs
# on a CPU without them. No FMA contraction: results stay bit-exact with torch's reference; the
# other two flags only drop floating-point exception flags and errno, so loops with floor vectorise.
CFLAGS = ["-O3", "-std=c++17", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-trapping-math", "-fno-math-errno"]
CUDA_FLAGS = ["-O3", "-std=c++17", "--fmad=false", "-lineinfo"]

_ops: Any = None
_with_cuda = False                     # whether the loaded build has its CUDA half
_failure: str | None = None


def cuda_build_possible() -> bool:
    """Whether the kernels are built with their CUDA half: torch sees a GPU and nvcc is installed."""
    import torch
    from torch.utils import cpp_extension
    return torch.cuda.is_available() and cpp_extension.CUDA_HOME is not None


def cpu_signature() -> str:
    """A short hash of this CPU's model and instruction-set flags (the native build targets them)."""
    import hashlib
    import platform
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        text = "".join(next((l for l in lines if l.startswith(key)), "") for key in ("model name", "flags"))
    except OSError:
        text = ""
    return hashlib.sha1(f"{platform.machine()}{text}".encode()).hexdigest()[:10]


def sources(cuda: bool) -> list[Path]:
    """The compressor kernels' sources: the binding, every CPU file and, for CUDA builds, every .cu file."""
    found = [SOURCE_DIR / "bindings.cpp", *sorted((SOURCE_DIR / "cpu").glob("*.cpp"))]
    return found + (sorted((SOURCE_DIR / "cuda").glob("*.cu")) if cuda else [])


def build(verbose: bool = False) -> Any:
    """Build (or load the cached build of) the compressor kernels; ``torch.ops.gctestbed``."""
    global _ops, _with_cuda
    if _ops is not None:
        return _ops
    cuda = cuda_build_possible()
    name = ("gctestbed_ops_cuda" if cuda else "gctestbed_ops")
    _check_sources(name, sources(cuda))
    _check_compiler(name)
    import torch
    from torch.utils import cpp_extension

    directory, paths = staged(name, [p.relative_to(SOURCE_DIR).as_posix() for p in sources(cuda)], cpu=True)
    try:
        cpp_extension.load(name=name, sources=[str(p) for p in paths], build_directory=str(directory),
                           extra_cflags=CFLAGS + (["-DGCTESTBED_WITH_CUDA"] if cuda else []), extra_ldflags=["-fopenmp"],
                           extra_cuda_cflags=CUDA_FLAGS, is_python_module=False, verbose=verbose)
    except RuntimeError as e:
        raise UserError(f"building {name} failed: {_first_error(str(e))}") from None
    _ops, _with_cuda = torch.ops.gctestbed, cuda
    return _ops


def load(mode: str = "native") -> Any:
    """The kernels for ``mode``: ``torch.ops.gctestbed`` for native, None for the torch reference.

    native falls back to None, with one warning per process, when the kernels cannot be built.
    """
    global _failure
    if mode not in KERNEL_MODES:
        raise UserError(f"--kernels must be one of {', '.join(KERNEL_MODES)}, got {mode!r}.")
    if mode == "torch":
        return None
    if _failure is None:
        try:
            return build()
        except UserError as e:
            _failure = str(e)
            print(f"gctestbed: native kernels unavailable, compressors use their pure-torch reference: {_failure}",
                  file=sys.stderr)
    return None


def supports(ops: Any, tensor: Any) -> bool:
    """Whether the built kernels run on ``tensor``'s device."""
    return ops is not None and (tensor.device.type == "cpu" or (tensor.is_cuda and _with_cuda))


def built_for() -> str:
    """What the loaded build runs on, for messages."""
    return "CPU and CUDA" if _with_cuda else "CPU"
