"""README opens with the two commands, and CI runs the second one verbatim."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_starts_with_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    head = readme.split("---")[0]
    commands = re.findall(r"```sh\n(.+?)\n```", head, flags=re.S)
    assert len(commands) == 2
    run_cmd, test_cmd = commands
    assert "gctestbed run" in run_cmd and "pytest" in test_cmd
    assert test_cmd in (ROOT / ".ci" / "run").read_text()
