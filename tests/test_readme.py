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


def apt_packages(text: str) -> list[str]:
    """The packages of the one ``apt-get install`` command in ``text`` (backslash continuations joined)."""
    commands = [c for c in text.replace("\\\n", " ").splitlines() if re.match(r"\s*apt-get\s+install\b", c)]
    assert len(commands) == 1, commands
    words = commands[0].split()
    return [w for w in words[words.index("install") + 1:] if not w.startswith("-")]


def test_readme_lists_the_packages_ci_installs():
    """README's install list is .ci/run's apt-get install, package for package."""
    readme = (ROOT / "README.md").read_text()
    blocks = [b for b in re.findall(r"```sh\n(.+?)\n```", readme, flags=re.S) if "apt-get" in b]
    ci = apt_packages((ROOT / ".ci" / "run").read_text())
    assert {"iperf3", "slurmctld", "slurmd", "munge"} <= set(ci)        # the parser found the real list
    assert apt_packages("\n".join(blocks)) == ci
