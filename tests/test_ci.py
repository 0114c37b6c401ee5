"""CI must not skip what it is meant to run: under GCTESTBED_REQUIRE_PRIVILEGED (set by .ci/run) a
test whose requirement is missing is an error; elsewhere it skips with the reason, printed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# The only skips decided inside tests rather than by a conftest marker, and why CI need not run them.
ALLOWED_SKIPS = {
    ("test_kernels.py", 'pytest.skip("this CPU has no AVX-512'): "a CPU feature: without it the main build runs the "
                                                                 "portable paths, which every kernel test then checks",
    ("test_kernels.py", 'pytest.skip("needs a GPU and nvcc")'): "inside a test marked cuda: CI has no GPU",
}


def run_marked_test(tmp_path: Path, require: bool) -> subprocess.CompletedProcess:
    """pytest on one test marked iperf3, with the suite's conftest, on a PATH without iperf3."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    iperf3: needs iperf3\n")
    (tmp_path / "test_planted.py").write_text("import pytest\n\n\n@pytest.mark.iperf3\ndef test_needs_iperf3():\n    pass\n")
    (tmp_path / "bin").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "GCTESTBED_REQUIRE_PRIVILEGED"}
    env.update(PATH=str(tmp_path / "bin"), PYTHONPATH=os.pathsep.join(sys.path))
    if require:
        env["GCTESTBED_REQUIRE_PRIVILEGED"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-c", str(tmp_path / "pytest.ini"),
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_missing_requirement_skips_with_its_reason(tmp_path):
    done = run_marked_test(tmp_path, require=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SKIPPED [1]" in done.stdout and "needs iperf3 (apt-get install iperf3)" in done.stdout, done.stdout
    assert "1 skipped" in done.stdout


def test_a_missing_requirement_is_an_error_under_ci(tmp_path):
    done = run_marked_test(tmp_path, require=True)
    assert done.returncode != 0 and "skipped" not in done.stdout, done.stdout
    assert "GCTESTBED_REQUIRE_PRIVILEGED is set (CI) but the iperf3 tests cannot run: needs iperf3" in done.stdout + done.stderr


def test_no_test_skips_by_itself_unless_ci_need_not_run_it():
    """A skip decided in a test (skipif, pytest.skip, mark.skip, importorskip, xfail) escapes the CI check above; only
    the listed ones, which CI is not meant to run, may do that. The rest use a conftest marker."""
    found = set()
    for path in sorted(TESTS.glob("*.py")):
        if path.name in ("conftest.py", "test_ci.py"):
            continue
        for m in re.finditer(r"(pytest\.skip\(|mark\.skip\(|skipif\(|importorskip\(|xfail\().{0,40}", path.read_text()):
            key = next((k for k in ALLOWED_SKIPS if k[0] == path.name and m.group(0).startswith(k[1])), None)
            assert key is not None, f"{path.name}: {m.group(0)!r} skips by itself: give it a marker in conftest.py"
            found.add(key)
    assert found == set(ALLOWED_SKIPS)
