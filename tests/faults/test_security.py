"""No shell is ever built from user input: the package runs argv lists and speaks netlink."""

from __future__ import annotations

import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gctestbed"


def test_no_shell_true_or_os_system_in_the_package():
    hits = [f"{p.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
            for p in sorted(PACKAGE.rglob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"shell\s*=\s*True|os\.system\s*\(|os\.popen\s*\(", line)]
    assert hits == []


def test_the_scan_would_see_one():
    assert re.search(r"shell\s*=\s*True", "subprocess.run(cmd, shell=True)")
