"""The interactive testbed: up, exec, ls, down — and nothing left behind."""

from __future__ import annotations

import json

import pytest

from helpers import gctestbed, leftovers

pytestmark = pytest.mark.root


def test_up_exec_ls_down_leaves_nothing(state_dir):
    proc = gctestbed("up", "--nodes", "2", "--bw", "100mbit", "--latency", "2ms")
    assert proc.returncode == 0, proc.stderr
    name = proc.stdout.strip()
    run_id = name.removeprefix("gct-")
    try:
        listed = json.loads(gctestbed("ls", "--json").stdout)
        assert [(r["name"], r["kind"], r["nodes"]) for r in listed] == [(name, "cluster", 2)]
        env = gctestbed("exec", name, "1", "--", "python", "-c",
                        "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_ADDR'])")
        assert env.returncode == 0 and env.stdout.split() == ["1", "2", listed[0]["subnet"].replace("0/24", "1")]
        assert gctestbed("exec", name, "0", "--", "sh", "-c", "exit 7").returncode == 7
        missing = gctestbed("exec", name, "5", "--", "true")
        assert missing.returncode == 2 and "no node '5'" in missing.stderr
        # a program in one node reaches the other across the shaped, delayed link
        reach = gctestbed("exec", name, "0", "--", "python", "-c", (
            "import socket,time; s=socket.socket(); s.settimeout(5); t=time.perf_counter();"
            "s.connect_ex(('%s', 9)); print(time.perf_counter()-t)") % listed[0]["subnet"].replace("0/24", "2"))
        assert reach.returncode == 0 and 0.004 <= float(reach.stdout) < 0.02     # one round trip of 2 x 2 ms
        assert gctestbed("clean").stdout.strip() == "nothing to clean"          # clean leaves clusters to 'down'
        assert leftovers(run_id) != []
    finally:
        down = gctestbed("down", name)
    assert down.returncode == 0, down.stderr
    assert leftovers(run_id) == []
    assert gctestbed("down", name).returncode == 2
