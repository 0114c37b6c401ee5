"""Native code of gctestbed, built on first use with torch.utils.cpp_extension (ninja) and cached.

Sources live in the top-level ``kernels/`` folder of the source tree. A build is redone only
when a source changes (cpp_extension hashes them), and concurrent builds of the same target
wait for each other on cpp_extension's lock.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .spec import UserError

SOURCE_DIR = Path(__file__).resolve().parent.parent / "kernels"


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


def executable(name: str, sources: list[str]) -> str:
    """Path of the standalone program ``name`` built from ``sources`` (relative to kernels/)."""
    paths = [SOURCE_DIR / s for s in sources]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise UserError(f"the sources of {name} are missing ({', '.join(missing)}): install gctestbed from its source tree (pip install -e .).")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        raise UserError(f"building {name} needs a C++ compiler: install g++ (apt-get install g++).")
    _ninja_on_path()
    from torch.utils import cpp_extension

    directory = build_dir() / name
    directory.mkdir(parents=True, exist_ok=True)
    try:
        return cpp_extension.load(name=name, sources=[str(p) for p in paths], build_directory=str(directory),
                                  extra_cflags=["-O2", "-std=c++17"], extra_ldflags=["-Wl,--as-needed"],
                                  is_python_module=False, is_standalone=True, verbose=False)
    except RuntimeError as e:
        raise UserError(f"building {name} failed ({str(e).splitlines()[0]}); see the compiler output above.") from None
