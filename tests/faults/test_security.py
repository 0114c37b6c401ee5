"""No shell is ever built from user input: the package runs argv lists and speaks netlink."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gctestbed"
SHELL_COMMANDS = {"tc", "ip", "sh", "bash"}      # traffic control goes through pyroute2, never a command line


def shell_uses(root: pathlib.Path) -> list[str]:
    """Every call under ``root`` that hands a shell a string or runs tc/ip as a program: os.system,
    os.popen, any call with shell=True, and a subprocess call whose argv starts with a shell
    command."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            shell = any(k.arg == "shell" and not (isinstance(k.value, ast.Constant) and k.value.value in (False, None))
                        for k in node.keywords)
            argv0 = node.args[0].elts[0] if node.args and isinstance(node.args[0], (ast.List, ast.Tuple)) \
                and node.args[0].elts else None
            runs_tc = owner == "subprocess" and isinstance(argv0, ast.Constant) and argv0.value in SHELL_COMMANDS
            if shell or runs_tc or (owner == "os" and name in ("system", "popen")):
                hits.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)[:120]}")
    return hits


def test_no_shell_in_the_package():
    assert shell_uses(PACKAGE) == []


def test_the_scan_finds_each_kind_planted(tmp_path):
    """The same scan on a planted module: it must see every form the package must not contain."""
    (tmp_path / "bad.py").write_text(
        "import os, subprocess\n"
        "os.system('tc qdisc show')\n"
        "os.popen('ls')\n"
        "subprocess.run(cmd, shell=True)\n"
        "subprocess.Popen(['tc', 'qdisc', 'add'])\n"
        "subprocess.check_call(('ip', 'link'), shell=flag)\n"
        "subprocess.run(['iperf3', '-c', host], shell=False)\n")       # fine: an argv list, no shell
    assert [h.split(":")[1] for h in shell_uses(tmp_path)] == ["2", "3", "4", "5", "6"]
