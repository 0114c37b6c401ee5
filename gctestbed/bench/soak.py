"""The soak: short runs, one after another for as long as asked, each with a random fault, and a
census after each that nothing of it is left — namespaces, processes, ledgers, containers, and
the soak's own file descriptors.

Every run goes through the real command line (``python -m gctestbed.cli run``) so signals reach
it as they would from a user, and the faults are the ones users meet: a link that drops for a
moment or for good, a lossy link, a worker killed or stopped, Ctrl-C, gctestbed itself killed
(then ``gctestbed clean``). Each scenario states the outcome it must have; anything else, and
anything left behind, is reported and fails the soak.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import psutil

from .. import results, runner
from ..launch import image
from ..launch import state as ledger
from ..spec import LAUNCHERS, LinkSpec, RunSpec, SpecError

WORKLOAD = "mlp:width=512,depth=2,input_dim=512"
TIMEOUT = "5s"


@dataclass
class Scenario:
    name: str
    flags: Callable[[random.Random, int], list[str]]     # extra run flags, given the rng and node count
    act: str = ""                  # what the soak does mid-run: kill-worker | stop-worker | ctrl-c | kill-cli
    expect: str = "ok"             # the store's status the run must end with
    steps: int = 40


SCENARIOS = [
    Scenario("clean run", lambda r, n: []),
    Scenario("link down 1-2 s", lambda r, n: ["--fault", f"link-down:node={r.randrange(n)},at=1s,for={r.choice([1, 2])}s"]),
    Scenario("link down for good", lambda r, n: ["--fault", f"link-down:node={r.randrange(n)},at=1s,for=600s"],
             expect="failed", steps=100000),
    Scenario("lossy link", lambda r, n: ["--fault", f"loss:node={r.randrange(n)},pct={r.choice([1, 3, 5])},at=1s"]),
    Scenario("worker SIGKILL", lambda r, n: [], act="kill-worker", expect="failed", steps=100000),
    Scenario("worker SIGSTOP", lambda r, n: [], act="stop-worker", expect="failed", steps=100000),
    Scenario("Ctrl-C", lambda r, n: [], act="ctrl-c", expect="failed", steps=100000),
    Scenario("gctestbed kill -9, then clean", lambda r, n: [], act="kill-cli", expect="failed", steps=100000),
]


def open_fds() -> int:
    return psutil.Process().num_fds()


def run(minutes: float, results_dir: str, seed: int, launchers: list[str], phase: Callable[[str], None]) -> dict:
    """Soak for ``minutes``; return every run's outcome, the leaks found, and the totals."""
    rng = random.Random(seed)
    os.makedirs(results_dir, exist_ok=True)
    boxes = "docker" in launchers
    before, fds_before = ledger.census(containers=boxes), open_fds()
    deadline = time.monotonic() + minutes * 60
    rows, leaks = [], []
    while time.monotonic() < deadline:
        scenario, launcher, nodes = rng.choice(SCENARIOS), rng.choice(launchers), rng.choice([2, 2, 3])
        phase(f"soak: run {len(rows) + 1}, {scenario.name} ({launcher}, {nodes} nodes), "
              f"{max(0, deadline - time.monotonic()) / 60:.0f} min left")
        row = _one(scenario, launcher, nodes, rng, results_dir)
        after = ledger.census(f"gct-{row['run_id']}-" if row["run_id"] else "gct-", boxes)
        left = [f"{kind} {item}" for kind, items in after.items() for item in items]
        row["left"] = left
        leaks += [f"run {row['run_id']} ({scenario.name}): {x}" for x in left]
        rows.append(row)
    end, fds_after = ledger.census(containers=boxes), open_fds()
    for kind in end:
        for item in sorted(set(end[kind]) - set(before[kind])):
            leaks.append(f"at the end: {kind} {item}")
    if fds_after > fds_before:
        leaks.append(f"the soak's own open files grew from {fds_before} to {fds_after}")
    by = {}
    for r in rows:
        s = by.setdefault(r["scenario"], {"scenario": r["scenario"], "runs": 0, "as_expected": 0, "steps": 0})
        s["runs"] += 1
        s["as_expected"] += r["as_expected"]
        s["steps"] += r["steps_recorded"]
    return {"minutes": minutes, "seed": seed, "launchers": launchers, "runs": len(rows),
            "unexpected": [r for r in rows if not r["as_expected"]], "leaks": leaks,
            "fds_before": fds_before, "fds_after": fds_after, "scenarios": list(by.values()), "rows": rows}


def _one(scenario: Scenario, launcher: str, nodes: int, rng: random.Random, results_dir: str) -> dict:
    """One run of ``scenario``: start it, do its act, wait for it, and read what the store says."""
    argv = [sys.executable, "-m", "gctestbed.cli", "run", "--nodes", str(nodes), "--bw",
            rng.choice(["100mbit", "500mbit", "1gbit"]), "--workload", WORKLOAD, "--steps", str(scenario.steps),
            "--timeout", TIMEOUT, "--no-calibrate", "--launcher", launcher, "--results", results_dir,
            *scenario.flags(rng, nodes)]
    started = time.time()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    run_id, seen, note = None, 0, ""
    try:
        if scenario.act:
            run_id, seen = _wait_for_steps(results_dir, started, 2 + rng.randrange(4), proc)
            note = _act(scenario.act, run_id, rng)
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            note += " (the soak had to kill it after 300 s)"
        if scenario.act == "kill-cli":
            cleaned = subprocess.run([sys.executable, "-m", "gctestbed.cli", "clean"], capture_output=True, text=True,
                                     timeout=120)
            note += f"; clean exited {cleaned.returncode}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    conn = results.connect(results_dir)
    try:
        run = results.latest_run_since(conn, started)
        summary = results.summarize(conn, run) if run else None
        kept = results.steps_per_rank(conn, run["run_id"], rank=0).get(0, 0) if run else 0
    finally:
        conn.close()
    status = summary.status if summary else "never recorded"
    recorded = summary.steps_recorded if summary else 0
    expected_code = {"ok": 0, "failed": 1}[scenario.expect]
    if scenario.act == "ctrl-c":
        expected_code = 130
    if scenario.act == "kill-cli":
        expected_code = -signal.SIGKILL
    # nothing lost: every step rank 0 had recorded before the deed is still there (steps_recorded
    # counts steps every rank finished, and a node stopped between a step and its record lacks one)
    as_expected = status == scenario.expect and proc.returncode == expected_code and kept >= seen
    return {"scenario": scenario.name, "launcher": launcher, "nodes": nodes, "run_id": summary.run_id if summary else run_id,
            "exit_code": proc.returncode, "status": status, "steps_recorded": recorded, "rank0_steps_kept": kept,
            "steps_seen_before_act": seen,
            "error": summary.error if summary else (err or "").strip()[-300:], "note": note.strip("; "),
            "as_expected": as_expected}


def _wait_for_steps(results_dir: str, since: float, count: int, proc: subprocess.Popen) -> tuple[str | None, int]:
    """The run started after ``since`` once rank 0 has recorded ``count`` steps (or it ended)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.exists(results.db_path(results_dir)):
            conn = results.connect(results_dir)
            try:
                run = results.latest_run_since(conn, since)
                n = results.steps_per_rank(conn, run["run_id"], rank=0).get(0, 0) if run else 0
            finally:
                conn.close()
            if run and n >= count:
                return run["run_id"], n
        time.sleep(0.2)
    return None, 0


def _act(act: str, run_id: str | None, rng: random.Random) -> str:
    """Do the scenario's deed to run ``run_id``; say what was done."""
    if run_id is None:
        return "the run ended before the soak could act"
    st = next((s for s in ledger.load_all() if s.run_id == run_id), None)
    if st is None:
        return "no ledger to act on"
    if act in ("kill-worker", "stop-worker"):
        workers = [o for o in st.objects if o["kind"] == "process" and "-n" in o["name"]]
        victim = rng.choice(workers)
        os.kill(victim["pid"], signal.SIGKILL if act == "kill-worker" else signal.SIGSTOP)
        return f"{'SIGKILL' if act == 'kill-worker' else 'SIGSTOP'} to {victim['name']}"
    os.kill(st.owner_pid, signal.SIGINT if act == "ctrl-c" else signal.SIGKILL)
    return "SIGINT to gctestbed" if act == "ctrl-c" else "SIGKILL to gctestbed"


def check_launchers(text: str, minutes: float) -> list[str]:
    """The launchers ``--launchers`` names, each able to run here (refused now, not after an hour of
    failed runs), the docker node image included."""
    chosen = [x.strip() for x in text.split(",") if x.strip()]
    if not chosen or any(x not in LAUNCHERS for x in chosen) or minutes <= 0:
        raise SpecError(f"--launchers takes {', '.join(LAUNCHERS)} and --minutes a positive number.")
    for launcher in chosen:
        runner.cluster_class(RunSpec(nodes=1, link=LinkSpec(bw_bps=1), launcher=launcher)).check_host()
    if "docker" in chosen:
        image.needs_host_mounts(image.client(), image.tag(False))      # the node image must exist
    return chosen
