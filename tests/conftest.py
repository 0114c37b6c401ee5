"""Shared fixtures: markers that skip with a reason, and a ledger that always tears down."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest

# Test ledgers live on tmpfs like the product's, under one directory per pytest process (pid and
# start time), not in pytest's temporary directories (which pytest deletes after three sessions).
# A session killed mid-test (SIGKILL, a restarted machine session) leaves what its tests created
# recorded there, and the next session undoes it before it starts.
TEST_LEDGERS = Path("/run/gctestbed-tests")


def _session_dir() -> Path:
    me = psutil.Process()
    return TEST_LEDGERS / f"{me.pid}-{me.create_time():.0f}"


def pytest_sessionstart(session):
    """gctestbed's sources byte-compiled; the ledgers of test sessions whose process is gone undone."""
    _compile_gctestbed()
    if not TEST_LEDGERS.is_dir():
        return
    from gctestbed.launch.state import load
    for directory in TEST_LEDGERS.iterdir():
        pid, _, started = directory.name.partition("-")
        try:
            if abs(psutil.Process(int(pid)).create_time() - float(started)) < 1.0:
                continue                          # a session still running
        except (psutil.Error, ValueError):
            pass
        for path in directory.rglob("*.json"):
            load(str(path)).undo()
        shutil.rmtree(directory, ignore_errors=True)


def _compile_gctestbed() -> None:
    """Write gctestbed's bytecode once for the session. These machines set PYTHONDONTWRITEBYTECODE,
    and an editable install leaves no bytecode, so every node's worker and every command the tests
    start compiled gctestbed's sources again (some 0.3 to 0.5 s of CPU each, hundreds of times a
    session); Python reads what is written here, and compiles a source changed since in memory."""
    import compileall
    import gctestbed
    compileall.compile_dir(os.path.dirname(gctestbed.__file__), quiet=2)   # a read-only tree: compiled in memory, as before


def pytest_sessionfinish(session, exitstatus):
    """This session's ledger directory, once its tests have undone and removed their own."""
    with contextlib.suppress(OSError):
        _session_dir().rmdir()


def _missing(marker: str) -> str | None:
    """Why tests with ``marker`` cannot run here, or None."""
    if marker == "root" and os.geteuid() != 0:
        return "needs root to create network namespaces and qdiscs"
    if marker == "compiler" and shutil.which(os.environ.get("CXX", "c++")) is None:
        return "needs a C++ compiler (apt-get install g++) to build the native kernels"
    if marker == "nvcc" and shutil.which("nvcc") is None:
        return "needs nvcc (the CUDA toolkit) to compile the CUDA kernels"
    if marker == "docker":
        try:
            import docker
            docker.from_env().ping()
        except Exception as e:  # noqa: BLE001
            return f"needs a running Docker engine (apt-get install docker.io; dockerd &): {type(e).__name__}"
    if marker == "compose" and shutil.which("docker-compose") is None:
        return "needs docker-compose (apt-get install docker-compose) to validate compose files"
    if marker == "browser" and not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")):
        return "needs Chromium (apt-get install chromium) to open the report"
    if marker == "slurm" and not all(shutil.which(p) for p in ("slurmctld", "slurmd", "srun", "munged")):
        return "needs Slurm and munge (apt-get install slurmctld slurmd slurm-client munge)"
    if marker == "iperf3" and shutil.which("iperf3") is None:
        return "needs iperf3 (apt-get install iperf3)"
    if marker == "rps":
        release = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", os.uname().release).groups())
        if release < (6, 3):
            return f"needs Linux 6.3 or later for receive steering per namespace (net.core.rps_default_mask); this is {os.uname().release}"
    if marker == "sklearn" and importlib.util.find_spec("sklearn") is None:
        return "needs scikit-learn (pip install -e '.[test]')"
    if marker == "cgroup":
        from gctestbed.launch import cpushare
        if cpushare.hierarchy() is None:
            return "needs the cgroup cpu controller (cgroup v1's cpu hierarchy or cgroup v2 with cpu enabled)"
    if marker == "cgroup_v2":
        from gctestbed.launch import cpushare
        if cpushare.hierarchy() is None or cpushare.hierarchy()[0] != "v2":
            return ("this kernel offers no cgroup v2 cpu controller: it is bound to cgroup v1's cpu hierarchy "
                    "(/proc/cgroups), which a kernel gives to one hierarchy only, so --cpus-per-node uses v1 here")
    if marker == "cgroup_v1":
        from gctestbed.launch import cpushare
        if cpushare.hierarchy() is None or cpushare.hierarchy()[0] != "v1":
            return "this kernel mounts no cgroup v1 cpu hierarchy (--cpus-per-node uses cgroup v2 here)"
    if marker == "cuda":
        import torch
        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
    return None


MARKERS = ("root", "compiler", "nvcc", "docker", "compose", "browser", "slurm", "iperf3", "sklearn", "cgroup",
           "cgroup_v1", "cgroup_v2", "cuda", "rps")

# Set by CI (.ci/run): a test that CI must run and cannot is an error, not a skip.
REQUIRE_ENV = "GCTESTBED_REQUIRE_PRIVILEGED"

# Markers CI must satisfy: under REQUIRE_ENV their skips are an error. Not among them: a GPU (CI has
# none; the CUDA tests run where one is lent) and one cgroup version by name (a kernel gives the cpu
# controller to v1 or to v2, never both; ``cgroup`` requires that it has one, and the test of the
# version this kernel does not offer skips with that reason).
REQUIRED_IN_CI = ("root", "compiler", "nvcc", "docker", "compose", "browser", "slurm", "iperf3", "sklearn", "cgroup",
                  "rps")


def pytest_collection_modifyitems(config, items):
    for marker in MARKERS:
        if not any(marker in item.keywords for item in items):
            continue
        reason = _missing(marker)
        if reason is None:
            continue
        if marker in REQUIRED_IN_CI and os.environ.get(REQUIRE_ENV):
            raise pytest.UsageError(f"{REQUIRE_ENV} is set (CI) but the {marker} tests cannot run: {reason}")
        for item in items:
            if marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@contextlib.contextmanager
def ledgers(fallback: Path):
    """A private ledger directory under this session's (``fallback`` where that cannot be made:
    not root, so nothing made needs a ledger there), everything its ledgers still hold undone
    and the directory removed at the end."""
    try:
        _session_dir().mkdir(parents=True, exist_ok=True)
        directory = Path(tempfile.mkdtemp(prefix="state-", dir=_session_dir()))
    except PermissionError:
        directory = fallback
    try:
        yield directory
    finally:
        from gctestbed.launch.state import load_all
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("GCTESTBED_STATE_DIR", str(directory))
            for st in load_all():
                st.undo()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """A private ledger directory, so tests never see or clean a user's live runs. Whatever a
    test's runs still hold when it ends (a run cut short by a timeout, a failed assertion) is
    undone from these ledgers, so nothing outlives the test."""
    with ledgers(tmp_path / "state") as directory:
        monkeypatch.setenv("GCTESTBED_STATE_DIR", str(directory))
        yield directory


@pytest.fixture(scope="module")
def module_state_dir(tmp_path_factory):
    """The same for what a module's tests share (a run recorded once): passed to its commands
    as GCTESTBED_STATE_DIR, undone at the module's end."""
    with ledgers(tmp_path_factory.mktemp("state")) as directory:
        yield directory


@pytest.fixture(scope="module")
def module_ledgers(module_state_dir):
    """GCTESTBED_STATE_DIR set to the module's ledger directory while the module runs, for runs it
    shares between its tests (a test's own state_dir still takes over within that test)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GCTESTBED_STATE_DIR", str(module_state_dir))
        yield module_state_dir


@pytest.fixture(scope="module")
def kept(module_ledgers):
    """helpers.kept_runs' ``run`` for a whole module: one kept network and fork server for all its
    runs (as a sweep's cells; a run with another world or topology gets a network of its own, the
    fork server kept), so the module pays their start (some 7 s) once. For tests of what a run
    computes and sends, not of a lone run's own start or teardown. Their ledgers are the module's,
    undone at its end: a test that runs on it takes no state_dir, whose end would undo a network
    rebuilt there under the next test."""
    from helpers import kept_runs
    with kept_runs() as run:
        yield run


@pytest.fixture
def ledger(state_dir):
    """A run ledger whose objects are all removed after the test, pass or fail."""
    from gctestbed.launch.state import RunState

    state = RunState.create()
    yield state
    problems = state.undo()
    assert not problems, problems


@pytest.fixture
def single_rank_group(tmp_path):
    """A one-rank Gloo process group, for hooks and averaging without a network."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
