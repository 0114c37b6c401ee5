"""One run, start to finish: ledger, cluster, one worker per node, supervision, status, teardown.

The runner never prints; it reports progress through a callback so the CLI decides how to show
it. Whatever happens — success, a dead node, Ctrl-C, an exception — the cluster is torn down
from its ledger and the run's status and error are written to the store.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import psutil

from . import hostcpu, results
from .interrupts import Interrupted, raise_deferred, signals_ignored, signals_raise
from .launch import nodeenv
from .launch import state as ledger
from .launch.faultplan import FaultPlan
from .launch.forkserver import Server, ServerLost
from .launch.kept import KeptNetwork
from .launch import netns
from .launch.netns import NetnsCluster
from .launch.protocol import Launcher, Node, exit_text
from .session import Session, log_ends, log_lines, read_text, resolve
from .spec import SPEC_ENV, RunSpec, UserError, format_duration
from .timing import Laps

Progress = Callable[[int, int, dict], None]
Phase = Callable[[str], None]
POLL_S = 0.25
STALL_GRACE_S = 30      # beyond --timeout: no step from any node this long stops the run
HUNG_GRACE_S = 3.0      # after a collective timed out, how long the other nodes get to fail too


@dataclass
class Early:
    """A run's ledger and fork server, started by the command line before it reads the flags
    (which imports torch), so the server imports on the other core meanwhile; ``run`` takes both
    over (``taken``), and ``early_start`` removes them if it never did."""

    state: ledger.RunState
    server: Server
    taken: bool = False


def forks_workers(launcher: type[Launcher], command: tuple | list, device: str) -> bool:
    """Whether a run's nodes are forked from a fork server (``netns.forks_workers``) by a launcher
    of that class (the server is NetnsCluster's)."""
    return launcher is NetnsCluster and netns.forks_workers(command, device)


@contextlib.contextmanager
def early_start(launcher: str, command: tuple | list, results_dir: str) -> Iterator[Early | None]:
    """An ``Early`` where the run forks its nodes (``forks_workers``), else None; None too where
    ``run`` would refuse before building anything: a user without root, a results directory that
    cannot be written (looked at, not created: a store full, locked or damaged is still found by
    ``run``, and then the early start is undone). SIGINT and SIGTERM raise Interrupted meanwhile
    (``signals_raise``), so a command stopped while it reads its flags undoes it. (Tried on 28
    November without holding back a signal inside an import: torch's C init swallowed it there
    and the run went ahead.)"""
    cls = launcher_class(launcher)
    # the device is not read yet: a CUDA run stops the early server at its start
    if not forks_workers(cls, command, "cpu") or not _host_fits(cls) or not _writable(results_dir):
        yield None
        return
    state = early = None
    try:
        with signals_raise():
            state = ledger.RunState.create()
            early = Early(state, Server(state))
            yield early
    finally:
        if state is not None and (early is None or not early.taken):
            with signals_ignored():
                state.undo()


def _host_fits(launcher: type[Launcher]) -> bool:
    """Whether the launcher's own check of this host (root, for namespaces) passes."""
    try:
        launcher.check_host()
    except UserError:
        return False
    return True


def _writable(directory: str) -> bool:
    """Whether ``directory``, or the nearest existing folder above it, can be written."""
    path = os.path.abspath(directory)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return os.access(path, os.W_OK)


def run(spec: RunSpec, on_progress: Progress | None = None, on_phase: Phase = lambda text: None,
        kept: KeptNetwork | None = None, early: Early | None = None, fresh: bool = False) -> results.RunSummary:
    """Run ``spec`` and return its summary (see results.summarize). Raises Interrupted (carrying
    the run id) on Ctrl-C. ``kept``: a sweep's network, used (and re-shaped, or rebuilt) where it
    takes the spec; the run then owns only its workers. ``early``: the ledger and fork server the
    command line started (``early_start``). ``fresh``: every node starts an interpreter of its own
    instead of being forked (what 'bench scale --fresh-nodes' and an unkept sweep measure)."""
    raise_deferred()
    launcher = cluster_class(spec)
    launcher.check_host()
    results.check_writable(spec.results_dir)        # a full, locked or damaged store stops us before anything is built
    if spec.backend == "nccl":
        import torch
        nodeenv.check_nccl(spec.nodes, torch.cuda.device_count())
    if early is not None:            # taken over (early.taken) first thing in the try below
        state = early.state
        state.update(results_db=results.db_path(spec.results_dir))
    else:
        state = ledger.RunState.create(results_db=results.db_path(spec.results_dir))
    lent = kept is not None and kept.takes(spec)
    session = None
    status, error = "failed", None
    cluster, finished, summary = None, False, None
    laps, phases = Laps(), {}         # where the run's wall time went (see results.RunSummary.phases)
    host = hostcpu.Sampler()          # the host's CPU while the steps go (the nodes run on this host)
    try:
        if early is not None:
            early.taken = True
        with signals_raise():
            server = None     # our worker on namespace nodes is forked by a fork server, which imports torch
            if forks_workers(launcher, spec.command, spec.device) and not lent and not fresh:   # once for every node
                server = early.server if early is not None else Server(state)   # first: it imports meanwhile
            elif early is not None:       # started before the flags were read (a CUDA run): its imports
                early.server.stop()       # would take the cores calibration measures with
            spec = resolve(spec, state.run_id, on_phase)
            if lent:
                cluster = kept.lend(spec, state)
            else:
                cluster = launcher(spec, state, server) if server is not None else launcher(spec, state)
            session = Session(spec)
            on_phase("building the network")
            nodes = cluster.up()
            recorder = session.start(cluster.launcher, cluster.describe())
            phases["build_s"] = laps.lap()
            if spec.calibrate and spec.world > 1:
                on_phase("calibrating links")
                error = session.calibrate(cluster.calibrate)
                phases["calibrate_s"] = laps.lap()
            if error is None:
                on_phase("starting nodes")
                procs = {}
                argv = spec.command or [sys.executable, "-m", "gctestbed.worker", session.spec_path]
                for node in nodes:
                    recorder.node(node.rank, name=node.name, address=node.address,
                                  role="server" if node.rank >= spec.nodes else "worker")
                    try:
                        procs[node.rank] = cluster.spawn(node, argv, session.log_path(f"node{node.rank}"),
                                                         {SPEC_ENV: session.spec_path})
                    except ServerLost as e:     # not the node's doing: the cell fails alone, the next forks anew
                        error = _stop_all(procs, nodes, recorder, spec, session.run_dir, cluster, node.rank,
                                          f"was never started: its fork server ended during the run ({e})")
                        break
                else:
                    error = _supervise(procs, nodes, recorder, spec, session.run_dir, on_progress, cluster, host)
                phases["nodes_s"] = laps.lap()
            status = "ok" if error is None else "failed"
        finished = True
    except Interrupted as e:
        status, error = "failed", f"interrupted by the user{_at_step(session.recorder if session else None, spec)}"
        e.run_id = state.run_id
        raise
    except BaseException as e:
        status, error = "failed", f"{type(e).__name__}: {e}"
        raise
    finally:
        with signals_ignored():
            stats = session.read_counters(cluster.final_counters) if session is not None else None   # before teardown
            problems = cluster.down() if cluster is not None else state.undo()
            phases["teardown_s"] = laps.lap()
            if problems:
                error = (error + "; " if error else "") + "teardown left: " + "; ".join(problems)
                status = "failed"
            if session is not None:
                try:
                    session.finish(status, error, stats, phases, host.record())
                except results.StoreError:       # disk full, locked: keep the outcome for 'gctestbed clean'
                    state.objects = []
                    state.update(meta={**state.meta, "outcome": {"status": status, "error": error}})
                    raise
                if finished:          # read here, where a signal cannot cut in: the caller gets what it ran
                    summary = session.summary()
    return summary


def cluster_class(spec: RunSpec) -> type[Launcher]:
    """The launcher a spec asks for."""
    return launcher_class(spec.launcher)


def launcher_class(name: str) -> type[Launcher]:
    """The launcher of a --launcher name."""
    if name == "docker":
        from .launch.docker import DockerCluster
        return DockerCluster
    return NetnsCluster


def _supervise(procs: dict, nodes: list[Node], recorder: results.Recorder, spec: RunSpec, run_dir: str,
               on_progress: Progress | None, cluster: Launcher, host: hostcpu.Sampler) -> str | None:
    """Wait for every worker, applying the run's faults on time, and sample the host's CPU once
    steps are recorded; on the first failure stop the rest and say which node failed and how. A
    node that hangs is named too: the others give up on it after the collective timeout, and a
    run of our worker in which no node records a step for longer than that (while steps remain)
    is stopped here."""
    plan = FaultPlan(spec.faults, cluster, recorder.fault)
    seen, recorded, quiet_since = -1, 0, time.monotonic()
    watch = not spec.command     # our own loop records every step; a user's program may pause as it likes
    try:
        while True:
            codes = {rank: p.poll() for rank, p in procs.items()}
            if any(code not in (None, 0) for code in codes.values()):
                lost = [(r, p.server) for r, p in procs.items() if getattr(p, "server_lost", False)]
                if lost:            # not the node's doing: its worker's fork server ended (killed) under it
                    (rank, server), *_ = lost
                    how = _lost_with(server.last_words())
                    return _stop_all(procs, nodes, recorder, spec, run_dir, cluster, rank, how) + plan.context()
                rank, how = _blame(procs, codes, run_dir, spec)
                return _stop_all(procs, nodes, recorder, spec, run_dir, cluster, rank, how) + plan.context()
            count = sum(results.steps_per_rank(recorder.conn, spec.run_id).values())
            if all(code == 0 for code in codes.values()):
                # after the last step's row, so the samples bracket it (however fast the steps were)
                host.tick(active=count > 0)
                for r in procs:
                    recorder.node(r, exit_code=0)
                return None
            if count != recorded:
                recorded, quiet_since = count, time.monotonic()
            elif watch and 0 < recorded < spec.nodes * spec.steps and \
                    time.monotonic() - quiet_since > spec.timeout_s + STALL_GRACE_S:
                rank = next(iter(_stopped(procs, codes)), None)
                rank = rank if rank is not None else _laggard(recorder, spec, procs)
                how = (f"stopped responding: no node recorded a step for {time.monotonic() - quiet_since:.0f} s "
                       f"(--timeout {format_duration(spec.timeout_s)} plus {STALL_GRACE_S} s)")
                return _stop_all(procs, nodes, recorder, spec, run_dir, cluster, rank, how) + plan.context()
            row = results.last_step(recorder.conn, spec.run_id, 0)
            plan.tick(training_started=row is not None)
            host.tick(active=count > 0)
            if on_progress and row is not None and row["step"] != seen:
                seen = row["step"]
                on_progress(seen + 1, spec.steps, dict(row))
            time.sleep(POLL_S)
    finally:
        plan.finish()


def _blame(procs: dict, codes: dict, run_dir: str, spec: RunSpec) -> tuple[int, str]:
    """The node that caused a failure, and how. Several nodes often fail within one poll, and the
    ones that only lost their peer (a collective timed out or its connection closed, or Gloo
    aborted after that) are consequences, not causes. A stopped node comes first, then one that
    said why it stopped (a "gctestbed: rank" line: bad gradients, a full store), then one killed by a
    signal, then one that failed on its own; a node that only gave up waiting is blamed last (also
    when it then crashed at exit: Gloo's threads can abort or segfault a process that lost its peer), and
    then a node still there, hung, once the others have had a moment to fail too, is named instead."""
    stopped = _stopped(procs, codes)
    if stopped:
        return stopped[0], "stopped responding (its process is stopped: SIGSTOP or a debugger)"
    tails = {r: read_text(os.path.join(run_dir, f"node{r}.log")).splitlines()[-30:] for r in codes}

    def standing(r: int) -> int:
        waited = any(k in line.lower() for line in tails[r] for k in _CONSEQUENCES)
        if _own_reason(tails[r]):
            return 0
        lost_peer = any("gradient exchange failed" in line for line in tails[r])
        if codes[r] < 0 and codes[r] != -signal.SIGABRT and not lost_peer:
            return 1
        return 4 if waited else 3 if codes[r] == -signal.SIGABRT else 2

    def best() -> int:
        return min((r for r, c in codes.items() if c not in (None, 0)), key=lambda r: (standing(r), r))
    first = best()
    if standing(first) >= 3:                 # a consequence: wait for the cause to show itself
        deadline = time.monotonic() + HUNG_GRACE_S
        while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
            time.sleep(POLL_S)
        codes.update({r: p.poll() for r, p in procs.items()})
        tails.update({r: read_text(os.path.join(run_dir, f"node{r}.log")).splitlines()[-30:] for r in codes})
        alive = [r for r, c in codes.items() if c is None]
        first = best()
        if alive and standing(first) >= 3:
            return alive[0], (f"stopped responding: node {first} gave up waiting for it "
                              f"(--timeout {format_duration(spec.timeout_s)})")
    return first, exit_text(codes[first])


# what a node's log says when it failed only because a peer went away or went quiet
_CONSEQUENCES = ("timed out", "timeout", "connection reset", "connection closed", "broken pipe",
                 "gradient exchange failed", "terminate called")


def _stopped(procs: dict, codes: dict) -> list[int]:
    """Ranks whose worker is still there but stopped (state T)."""
    out = []
    for rank, p in procs.items():
        if codes.get(rank) is None and p.pid > 0:     # docker's have 0
            with contextlib.suppress(psutil.Error):
                if psutil.Process(p.pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                    out.append(rank)
    return out


def _laggard(recorder: results.Recorder, spec: RunSpec, procs: dict) -> int:
    """The rank with the fewest recorded steps (the one the others wait for)."""
    counts = results.steps_per_rank(recorder.conn, spec.run_id)
    return min(procs, key=lambda r: (counts.get(r, 0), r))


def _stop_all(procs: dict, nodes: list[Node], recorder: results.Recorder, spec: RunSpec, run_dir: str,
              cluster: Launcher, rank: int, how: str) -> str:
    """Kill every worker still there, record exit codes, and say what happened to ``rank``."""
    for p in procs.values():
        if p.poll() is None:
            cluster.kill(p)
    for r, p in procs.items():
        recorder.node(r, exit_code=p.wait())
    last = results.last_step(recorder.conn, spec.run_id, rank)
    where = f"after step {last['step']}" if last else "before its first step"
    log = os.path.join(run_dir, f"node{rank}.log")
    who = spec.role(rank) + (f" (rank {rank}, {nodes[rank].name})" if rank >= spec.nodes else f" ({nodes[rank].name})")
    return f"{who} {how} {where}{_log_tail(log)}"


def _lost_with(last_words: str) -> str:
    """What a node lost with its fork server did, with how the server ended (Server.last_words)."""
    return f"lost its worker with the fork server, which ended during the run ({last_words})"


def _own_reason(lines: list[str]) -> str | None:
    """The line in which a node said why it stopped (bad gradients, a full store: "gctestbed: rank
    R ..."), if it did; not one that says only that its exchange with a peer failed, nor a warning
    such as the kernels' fallback. Other lines may follow it (a collective's
    threads reporting at exit), so the last line alone does not tell."""
    return next((line.strip() for line in reversed(lines) if line.startswith("gctestbed: rank ")
                 and "gradient exchange failed" not in line), None)


def _log_tail(path: str) -> str:
    lines = log_lines(path)
    reason = _own_reason(lines[-30:])
    if reason:
        return f"; its log says: {reason[:300]}"
    return f"; {log_ends(path, lines)}" if lines else ""


def _at_step(recorder: results.Recorder | None, spec: RunSpec) -> str:
    row = results.last_step(recorder.conn, spec.run_id, 0) if recorder else None
    return f" after step {row['step']}" if row else ""


def clean() -> tuple[list[str], list[str]]:
    """Remove what dead runs left; mark their runs failed in their stores. Returns (run ids, problems)."""
    cleaned, problems = ledger.clean_dead()
    for st in cleaned:
        if not (st.results_db and os.path.exists(st.results_db)):
            continue
        try:
            rec = results.Recorder(os.path.dirname(st.results_db), st.run_id)
            try:
                status = results.run_status(rec.conn, st.run_id)
                outcome = st.meta.get("outcome")
                if status == "running" and outcome:
                    rec.finish_run(outcome["status"], (outcome["error"] + "; " if outcome["error"] else "") +
                                   "recorded by 'gctestbed clean': the store could not be written when the run ended")
                elif status == "running":
                    rec.finish_run("failed", "its gctestbed process died; cleaned up by 'gctestbed clean'")
            finally:
                rec.close()
        except results.StoreError as e:          # still full or locked: keep the ledger for the next clean
            st.update(meta=st.meta)
            problems.append(f"run {st.run_id}: its outcome is not recorded yet ({e})")
    return [st.run_id for st in cleaned], problems
