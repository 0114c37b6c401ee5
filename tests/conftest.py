"""Shared fixtures: markers that skip with a reason, and a ledger that always tears down."""

from __future__ import annotations

import os

import pytest


def _can_make_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces and qdiscs"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _can_make_namespaces()
    if reason is None:
        return
    if os.environ.get("GCTESTBED_REQUIRE_PRIVILEGED"):
        raise pytest.UsageError(f"GCTESTBED_REQUIRE_PRIVILEGED is set but the root tests cannot run: {reason}")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """A private ledger directory, so tests never see or clean a user's live runs."""
    directory = tmp_path / "state"
    monkeypatch.setenv("GCTESTBED_STATE_DIR", str(directory))
    return directory


@pytest.fixture
def ledger(state_dir):
    """A run ledger whose objects are all removed after the test, pass or fail."""
    from gctestbed.launch.state import RunState

    state = RunState.create()
    yield state
    problems = state.undo()
    assert not problems, problems
