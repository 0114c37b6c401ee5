"""The measured cells of a store, one row per run, with the figures analysis needs.

A row is a finished run: its sweep parameters (or, for runs outside a sweep, the same read from
its RunSpec), its medians per step (step time is the slowest rank's, as in ``show``; local SGD and
DiLoCo, which exchange only every H steps, are compared by their means over whole periods), and rank
0's loss curve against cumulative wall time, and its held-out evaluations (``--eval-every``). A
*group* is what a speedup compares within: same workload, nodes, latency, batch size, timing mode
and optimizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .. import results
from ..spec import RunSpec, UserError

GROUP = ("workload", "nodes", "latency_s", "batch_size", "mode", "optimizer")
# what makes two runs the same cell, but for the dilation (model.CELL adds it)
SAME_CELL = ("workload", "compressor", "nodes", "bw_bps", "latency_s", "batch_size", "mode", "optimizer", "comm",
             "servers")
# a replayed cell whose emulated step is more than this much slower than the same cell's more dilated
# run's was paced by work the dilation does not stretch (dilation_test)
DILATION_TOLERANCE = 0.05


@dataclass
class Row:
    run_id: str
    sweep: str | None
    repeat: int
    workload: str           # as typed, with options
    compressor: str         # as typed in the sweep, with options (outside a sweep: the name), and " over COMM"
                            # when the workers did not meet over the ring: a method's label
    method: str             # the compressor's registry name
    nodes: int
    bw_bps: int
    latency_s: float
    batch_size: int
    mode: str
    step_s: float
    compute_s: float | None
    optim_s: float | None
    encode_s: float | None
    decode_s: float | None
    comm_s: float | None
    payload_bytes: float | None
    gather_bytes: float | None
    expected_tx_bytes: float | None
    reduce_calls: float | None
    gather_calls: float | None
    buckets: float | None
    tail_tx_bytes: float | None
    busbw_fraction: float | None
    final_loss: float | None
    losses: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    optimizer: str = "sgd"
    eval_accuracy: float | None = None
    eval_loss: float | None = None
    eval_samples: int | None = None
    wire_bytes: float | None = None         # the kernel's interface counters: bytes a node sent per step (the
                                            # mean where not every step sends: RunSummary.per_step_stat)
    evals: list[dict] = field(default_factory=list)     # {step, loss, accuracy, samples}, in step order
    step_times: list[float] = field(default_factory=list)   # every complete step's time (slowest rank), step 0 left out
    phases: list[dict] = field(default_factory=list)        # rank 0's encode_s, comm_s, decode_s per step
    comm: str = "allreduce"                 # how the workers met: allreduce | ps | localsgd | diloco
    servers: int = 0                        # parameter servers: how many, and per step (medians) the busiest
    server_push_bytes: float | None = None  # server's pushes in, its pulls out, its summing time, and the
    server_pull_bytes: float | None = None  # pulls one worker receives from all servers together
    server_sum_s: float | None = None
    pull_rx_bytes: float | None = None
    averaged_share: float | None = None     # local SGD, DiLoCo: the share of steps that averaged (step_s,
                                            # expected_tx_bytes and reduce_calls are then means over periods)
    dilate: float = 1.0                     # --dilate K: every time here is already in emulated units (host / K)
    run_s: float | None = None              # the run from its start to its end, as the store keeps them (host seconds)
    seed: int = 0                           # the run's seed (a sweep's repeat k: its seed + k)
    device: str = "cpu"                     # what computed the gradients: cpu | cuda
    host_bound: bool | None = None          # a replay the host, not the link, may have paced by its counters (show's
                                            # HOST-BOUND: RunSummary.host_bound or host_behind); None for real runs
    first_ready_s: float | None = None      # when a step's first bucket was ready (RunSummary.median_first_ready_s)
    dilation_excess: float | None = None    # emulated step over the same cell's at its highest dilation, - 1
    dilated_from: float | None = None       # (dilation_test); None where the cell ran at one K only
    dilation_paced: bool | None = None      # dilation_excess over DILATION_TOLERANCE; None where not tested
    replayed_as: str | None = None          # a replay's trace (its path) and options but the scale, as JSON: what
                                            # the same cell at another K shares (dilation_test); None for real runs
    cpus_per_node: float = 0.0              # --cpus-per-node (0: no cap)

    @property
    def group(self) -> tuple:
        return tuple(getattr(self, k) for k in GROUP)

    @property
    def paced(self) -> bool | None:
        """Whether the host may have paced this run, by either test (the report's HOST-BOUND): its
        counters (``host_bound``) or the dilation test (``dilation_paced``); None where neither judged."""
        flags = [f for f in (self.host_bound, self.dilation_paced) if f is not None]
        return any(flags) if flags else None


def group_label(group: tuple) -> str:
    workload, nodes, latency_s, batch, mode, optimizer = group
    from ..spec import format_duration
    return (f"{workload}, {nodes} nodes, latency {format_duration(latency_s)}, batch {batch}, {mode}"
            + ("" if optimizer == "sgd" else f", {optimizer}"))


def load(results_dir: str, sweep: str | None = None) -> list[Row]:
    """Every finished cell of ``sweep`` (or of all sweeps); a store without sweeps gives its ok runs."""
    conn = results.connect(results_dir, create=False)
    cells = results.sweep_runs(conn, sweep)
    if sweep and not cells:
        names = results.sweep_names(conn)
        raise UserError(f"sweep '{sweep}' has no finished cells in {results_dir}"
                                + (f"; it has: {', '.join(names)}." if names else "."))
    if cells:
        pairs = [(c["run_id"], c["sweep"], c["repeat"], json.loads(c["cell"])) for c in cells]
    else:
        pairs = [(run_id, None, 0, None) for run_id in results.ok_run_ids(conn)]
    rows = []
    for run_id, sweep_name, repeat, params in pairs:
        run = results.find_run(conn, run_id)
        s = results.summarize(conn, run)
        spec = RunSpec.from_json(run["spec"])
        if s.median_step_s is None or spec.command:
            continue
        losses, wall = results.curve(conn, run_id)
        wall = [results.emulated_s(spec, w) for w in wall]         # a dilated run's in emulated seconds, as s's
        mean = s.amortised or {}
        busiest = {f: max((v[f"median_{f}"] or 0 for v in s.servers), default=None) for f in ("push_bytes", "pull_bytes", "sum_s")}
        rows.append(Row(
            run_id=run_id, sweep=sweep_name, repeat=repeat,
            workload=f"replay of {s.replayed}" if s.replayed else params["workload"] if params else spec.workload,
            compressor=_label(method_label(spec, params),
                              params.get("comm", "allreduce") if params else _comm(spec)), method=spec.compressor,
            nodes=spec.nodes, bw_bps=spec.link.bw_bps, latency_s=spec.link.latency_s, batch_size=spec.batch_size,
            mode=spec.mode, step_s=mean.get("step_s", s.median_step_s), compute_s=s.median_compute_s,
            optim_s=s.median_optim_s, encode_s=s.median_encode_s, decode_s=s.median_decode_s, comm_s=s.median_comm_s,
            payload_bytes=s.payload_bytes_per_step, gather_bytes=s.gather_bytes_per_step,
            expected_tx_bytes=mean.get("expected_tx_bytes", s.expected_tx_bytes_per_step),
            reduce_calls=mean.get("reduce_calls", s.reduce_calls_per_step),
            gather_calls=s.gather_calls_per_step, buckets=s.buckets_per_step,
            tail_tx_bytes=s.tail_tx_bytes_per_step, busbw_fraction=s.busbw_fraction_of_link,
            final_loss=_tail_mean(losses), losses=losses, wall=wall,
            optimizer=params.get("optimizer", spec.optimizer) if params else spec.optimizer,
            eval_accuracy=s.eval_accuracy, eval_loss=s.eval_loss, eval_samples=s.eval_samples,
            wire_bytes=s.wire_bytes_per_step, evals=results.evaluations(conn, run_id),
            step_times=_step_times(wall), phases=results.emulated(spec, results.phases(conn, run_id)),
            comm=spec.comm, servers=spec.servers, server_push_bytes=busiest["push_bytes"],
            server_pull_bytes=busiest["pull_bytes"], server_sum_s=busiest["sum_s"],
            pull_rx_bytes=sum(v["median_pull_bytes"] or 0 for v in s.servers) / spec.nodes if s.servers else None,
            averaged_share=mean.get("averaged_share"), dilate=spec.dilate, seed=spec.seed,
            device=spec.device, run_s=run["finished_at"] - run["created_at"] if run["finished_at"] else None,
            host_bound=None if s.host_bound is None and s.host_behind is None else bool(s.host_bound or s.host_behind),
            first_ready_s=s.median_first_ready_s, replayed_as=_replayed_as(spec), cpus_per_node=spec.cpus_per_node))
    conn.close()
    return rows


def dilation_test(rows: list[Row]) -> list[Row]:
    """The dilation test, where a store holds the same replayed cell at several dilations K: a
    replay that nothing on this host paced reads the same emulated step at any K, since everything
    it replays and shapes stretches with K; work the dilation does not stretch (Gloo's and the
    kernel's CPU work on a step's critical path, on this host) weighs 1/K of it in emulated time, so
    a cell that reads slower at a lower K carried some. Each run's median step against the median
    over the runs at its cell's highest K: ``dilation_excess``, and ``dilation_paced`` where it is
    over DILATION_TOLERANCE. Independent of the host's counters (``host_bound`` is left as they
    say): it caught cells whose cores had idle time (docs/replay.md, "The HOST-BOUND rule against
    the dilation test")."""
    import dataclasses
    import statistics
    cells: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.workload.startswith("replay of "):
            cells.setdefault(undilated_cell(r), []).append(r)
    highest = top_dilation(rows)
    out = []
    for r in rows:
        twins = cells.get(undilated_cell(r), []) if r.workload.startswith("replay of ") else []
        top = highest[undilated_cell(r)] if twins else r.dilate
        if top == r.dilate:
            out.append(r)
            continue
        excess = r.step_s / statistics.median(t.step_s for t in twins if t.dilate == top) - 1
        out.append(dataclasses.replace(r, dilation_excess=excess, dilated_from=top,
                                       dilation_paced=excess > DILATION_TOLERANCE))
    return out


def undilated_workload(r: Row) -> str:
    """What a cell ran whatever its dilation: a replay's trace file and options but the scale, which
    --dilate sets to K (a row made without ``replayed_as`` by its label, the scale taken out); any
    other workload as it is. Cells dilated by different K are one workload in emulated time."""
    if not r.workload.startswith("replay of "):
        return r.workload
    return r.replayed_as or r.workload.replace(f", scale={r.dilate:g}", "")


def top_dilation(rows: list[Row]) -> dict[tuple, float]:
    """Per cell whatever its dilation (``undilated_cell``), the highest K it was run at: the
    dilation test's reference, and the one K the held-out model predicts it at."""
    top: dict[tuple, float] = {}
    for r in rows:
        key = undilated_cell(r)
        top[key] = max(top.get(key, r.dilate), r.dilate)
    return top


def undilated_cell(r: Row) -> tuple:
    """The cell a run belongs to whatever its dilation (``undilated_workload``), the same cell
    otherwise, on the same device and CPU cap."""
    return (undilated_workload(r), *(getattr(r, k) for k in SAME_CELL[1:]), r.device, r.cpus_per_node)


def _replayed_as(spec: RunSpec) -> str | None:
    if spec.workload != "replay":
        return None
    # the trace's path is absolute already (flags._trace)
    return json.dumps({k: v for k, v in spec.workload_options.items() if k != "scale"}, sort_keys=True, default=str)


TAIL = 3


def method_label(spec: RunSpec, params: dict | None) -> str:
    """The method as a sweep's cell typed it (outside a sweep: its name), except a replay of a
    trace's own payloads (codec=recorded), which ran the trace's method whatever the sweep's
    compressor axis said: its name with every option, so two traces of one method apart."""
    if spec.workload == "replay" and spec.workload_options.get("codec") == "recorded":
        options = ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in sorted(spec.compressor_options.items()))
        return f"{spec.compressor}:{options}" if options else spec.compressor
    return params["compressor"] if params else spec.compressor


def _label(compressor: str, comm: str) -> str:
    """A method's label: the compressor as typed, and how the workers met when not over the ring
    (so a report compares ring, parameter servers and local SGD / DiLoCo against one baseline)."""
    return compressor if comm == "allreduce" else f"{compressor} over {comm}"


def _comm(spec: RunSpec) -> str:
    """``--comm`` of a run outside a sweep, with the option that tells its runs apart."""
    o = spec.comm_options
    if spec.comm == "ps":
        return f"ps:servers={o['servers']},pull={o['pull']},place={o.get('place', 'balanced')}"
    if spec.comm == "localsgd":
        return f"localsgd:period={o['period']}"
    if spec.comm == "diloco":
        return f"diloco:inner={o['inner']}"
    return spec.comm


def _tail_mean(losses: list[float | None]) -> float | None:
    tail = [v for v in losses[-TAIL:] if v is not None]
    return sum(tail) / len(tail) if tail else None


def _step_times(wall: list[float]) -> list[float]:
    times = [b - a for a, b in zip([0.0] + wall[:-1], wall)]
    return times[1:] or times


def time_to(row: Row, accuracy: float | None = None, loss: float | None = None) -> tuple[int, float] | None:
    """(steps, seconds of training) until the held-out accuracy first reaches ``accuracy`` (or its
    loss first falls to ``loss``); None if it never did. Seconds are the steps' own times (slowest
    rank), evaluations left out."""
    for e in row.evals:
        hit = (accuracy is not None and e["accuracy"] is not None and e["accuracy"] >= accuracy) or \
              (loss is not None and e["loss"] is not None and e["loss"] <= loss)
        if hit:
            steps = e["step"]
            return steps, (row.wall[steps - 1] if 0 < steps <= len(row.wall) else 0.0)
    return None
