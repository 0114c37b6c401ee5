"""The soak's machinery: a short soak runs its scenarios and finds nothing left; a run that does
leave something behind is reported (the hour-long soak itself is not run in CI)."""

from __future__ import annotations

import json

import pytest

from gctestbed.bench import soak
from gctestbed.net import namespaces
from helpers import gctestbed

pytestmark = [pytest.mark.root]


@pytest.mark.slow
def test_a_short_soak_ends_as_expected_and_leaves_nothing(tmp_path, state_dir):
    result = gctestbed("bench", "soak", "--minutes", "0.3", "--seed", "3", "--results", str(tmp_path), "--json",
                       timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    report = json.loads(result.stdout)
    assert report["runs"] >= 1 and report["leaks"] == [] and report["unexpected"] == []
    assert all(r["as_expected"] and r["left"] == [] for r in report["rows"])
    assert json.loads((tmp_path / "soak.json").read_text())["runs"] == report["runs"]


def test_a_run_that_leaves_a_namespace_is_reported(tmp_path, state_dir, monkeypatch):
    name = "gct-soakleak-n0"

    def leaky(scenario, launcher, nodes, rng, results_dir):
        if not namespaces.exists(name):
            namespaces.create(name)
        return {"scenario": scenario.name, "run_id": "soakleak", "as_expected": True, "steps_recorded": 0}

    monkeypatch.setattr(soak, "_one", leaky)
    try:
        report = soak.run(0.001, str(tmp_path), 0, ["netns"], lambda text: None)
    finally:
        namespaces.remove(name)
    assert f"run soakleak ({report['rows'][0]['scenario']}): namespaces {name}" in report["leaks"]
    assert f"at the end: namespaces {name}" in report["leaks"]
