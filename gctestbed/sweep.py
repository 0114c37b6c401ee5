"""A sweep: the same training run over a grid of bandwidth, latency, compressor, nodes, workload,
batch size and timing mode, each cell repeated, every cell a normal run in the results store.

A sweep has a name (by default derived from its grid, so typing the same command again resumes
it). Each cell's fate is kept in the store's ``sweep_cells`` table: a finished cell (ok, or
failed: a real failure is a result) is never run again; a cell that was interrupted (Ctrl-C, or
its sweep process died) is run again from the start, and its partial run stays in the store marked
failed. Repeats are the outermost loop, so a cell's repeats are spread over the sweep's duration
and slow drifts of the host do not line up with one method.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import secrets
from dataclasses import asdict, dataclass, field
from typing import Callable

from . import flags, interrupts, results, runner
from .launch import slurm
from .launch import state as ledger
from .launch.kept import KeptNetwork
from .session import resolve
from .spec import RunSpec, SpecError
from .timing import Laps

AXES = ("workload", "batch_size", "nodes", "latency", "bw", "compressor", "mode", "optimizer", "comm")
# a grid may leave these out (one value, the default), and then its cells keep the keys they had before the axis
OPTIONAL_AXES = {"optimizer": flags.DEFAULTS["optimizer"], "comm": flags.DEFAULTS["comm"]}
CALIBRATE = ("first", "all", "none")

# tuned where a method's default is tied to a gradient scale or to a long run (see docs/compressors.md):
# DGC without its warm-up and PowerSGD from the first step, so a short run times the compressed steady state
TWOBIT = "twobit:threshold=0.1"
DGC = "dgc:ratio=0.001,warmup_epochs=0"
POWERSGD = "powersgd:rank=4,start_iter=0"

PRESETS: dict[str, dict] = {
    # the FC-heavy mlp (3.2 M parameters, 12.6 MB of gradient, 4 DDP buckets of 5 MiB at most) on 2 nodes;
    # 2 min 49 s on 2 cores (docs/performance.md; 50mbit and 10 steps, as before, took 6 min 42 s)
    "quick": {"axes": {"workload": ["mlp:width=1024,depth=3"], "batch_size": ["512"], "nodes": ["2"],
                       "latency": ["0"], "bw": ["100mbit", "200mbit", "500mbit", "1gbit", "2gbit"],
                       "compressor": ["none", "fp16", TWOBIT, DGC, POWERSGD], "mode": ["overlap", "serial"]},
              "steps": 8, "repeat": 1, "bucket_cap_mb": "5"},
    # every workload and the main families, 2 and 4 nodes, with and without latency: hours; resumable
    "paper": {"axes": {"workload": ["mlp", "cnn", "lstm", "transformer"], "batch_size": ["64"], "nodes": ["2", "4"],
                       "latency": ["0", "5ms"],
                       "bw": ["10mbit", "25mbit", "50mbit", "100mbit", "250mbit", "500mbit", "1gbit", "2gbit"],
                       "compressor": ["none", "fp16", POWERSGD, "topk", DGC, TWOBIT, "qsgd", "terngrad", "efsignsgd"],
                       "mode": ["overlap", "serial"]},
              "steps": 20, "repeat": 3},
}


@dataclass
class Grid:
    """The axes (each a list of values as typed) and what every cell shares."""

    axes: dict[str, list[str]]
    steps: int = 8
    repeat: int = 1
    lr: str = flags.DEFAULTS["lr"]
    eval_every: str = flags.DEFAULTS["eval_every"]
    seed: str = flags.DEFAULTS["seed"]
    bucket_cap_mb: str = flags.DEFAULTS["bucket_cap_mb"]
    timeout: str = flags.DEFAULTS["timeout"]
    kernels: str = flags.DEFAULTS["kernels"]
    launcher: str = flags.DEFAULTS["launcher"]
    device: str = flags.DEFAULTS["device"]         # cuda: one GPU per node, NCCL (the backend follows)
    cpus_per_node: str = flags.DEFAULTS["cpus_per_node"]   # every cell's nodes held to this many CPUs
    dilate: str = flags.DEFAULTS["dilate"]                 # every cell's time dilation (a replay's); several,
                                                           # comma-separated: every cell at each K (report's dilation test)
    calibrate: str = "first"        # first: once per link setting in each invocation; all; none
    # keep each network (re-shaped in place) for the cells that fit it and fork every worker from one
    # fork server; False: every cell builds its own network and every node starts a fresh interpreter
    keep: bool = True
    partition: str | None = None    # --launcher slurm: the partition to allocate hosts in (Slurm's default: None)
    dev: str = "eth0"               # --launcher slurm: each host's interface to shape, and to pin Gloo/NCCL to
    accept_miss: bool = False
    results_dir: str = flags.DEFAULTS["results_dir"]

    def default_name(self) -> str:
        """The same grid always gets the same name, so the same command resumes."""
        shared = {k: v for k, v in asdict(self).items() if k not in ("results_dir", "calibrate", "accept_miss", "launcher", "keep", "partition", "dev")}
        # what grids made before these existed did not have, left out at its default: their names stay
        shared["axes"] = {k: v for k, v in shared["axes"].items() if not _only_default(k, v)}
        shared["dilate"] = ",".join(_dilations(shared["dilate"]))
        for key in ("eval_every", "device", "cpus_per_node", "dilate"):       # added later: at their defaults, names stay as they were
            if shared[key] == flags.DEFAULTS[key]:
                del shared[key]
        return "sweep-" + hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()[:10]


@dataclass
class Cell:
    params: dict[str, str]
    repeat: int
    spec: RunSpec
    key: str = field(init=False)

    def __post_init__(self):
        self.key = json.dumps(self.params, sort_keys=True)

    @property
    def link(self) -> tuple:
        """What calibration measures: the nodes and the links as shaped (a dilated cell's rate / K)."""
        return (self.spec.nodes, self.spec.link.bw_bps, self.spec.link.latency_s, self.spec.dilate)


def _number(text) -> bool:
    try:
        float(text)
        return True
    except (TypeError, ValueError):
        return False


def _dilations(dilate) -> list[str]:
    """--dilate's K, each once, in increasing order and written as numbers are (128, not 128.0), so
    the same K in another order or spelling names the same sweep and the same cells; a K that is
    not a number is left as typed, for build_spec to refuse."""
    ks = {_k(k) if _number(k) else k.strip() for k in str(dilate).split(",")}
    return sorted(ks, key=lambda k: (not _number(k), float(k) if _number(k) else 0.0, k))


def _k(text: str) -> str:
    """A K written exactly, without a trailing '.0' (4, 4.5, 1234567): the way single-K grids were named."""
    k = repr(float(text))
    return k[:-2] if k.endswith(".0") else k


def _only_default(axis: str, values: list[str]) -> bool:
    return axis in OPTIONAL_AXES and values == [OPTIONAL_AXES[axis]]


def from_preset(name: str, **shared) -> Grid:
    if name not in PRESETS:
        raise SpecError(f"unknown preset '{name}'; available: {', '.join(PRESETS)}.")
    p = PRESETS[name]
    return Grid(axes={k: list(v) for k, v in p["axes"].items()}, steps=p["steps"], repeat=p["repeat"],
                bucket_cap_mb=p.get("bucket_cap_mb", flags.DEFAULTS["bucket_cap_mb"]), **shared)


def repeat_seed(seed: str, repeat: int) -> str:
    """Repeat k of a sweep runs with seed + k: its repeats are independent runs (another model
    initialisation and data order), while the methods within one repeat share a seed, so they can
    be compared pair by pair. The seed is the run's, recorded with it."""
    return str(int(seed) + repeat) if str(seed).strip().lstrip("-").isdigit() else seed     # a bad one: build_spec says so


def plan(grid: Grid) -> list[Cell]:
    """Every cell with its RunSpec, checked before anything runs (a typo fails the sweep at once)."""
    if grid.repeat < 1 or grid.steps < 1:
        raise SpecError("--repeat and --steps must be at least 1.")
    if grid.calibrate not in CALIBRATE:
        raise SpecError(f"--calibrate must be one of {', '.join(CALIBRATE)}.")
    if grid.launcher == "slurm" and flags.build_spec(cpus_per_node=grid.cpus_per_node).cpus_per_node:
        raise SpecError("--cpus-per-node shares one host's cores among its nodes; with --launcher slurm every node is "
                        "a host of its own: leave it out.")
    if grid.launcher == "slurm" and not (_number(grid.dilate) and float(grid.dilate) == 1):
        raise SpecError("--dilate shapes links on this host's network; with --launcher slurm each host shapes its own "
                        "NIC undilated: leave it out.")
    axes = {**{k: [v] for k, v in OPTIONAL_AXES.items()}, **grid.axes}
    for axis in AXES:
        if not axes.get(axis):
            raise SpecError(f"the sweep has no value for {axis}.")
    dilations = _dilations(grid.dilate)
    if len(dilations) < len(str(grid.dilate).split(",")):
        raise SpecError(f"--dilate {grid.dilate} names one K twice; give each K once.")
    cells = []
    for repeat in range(grid.repeat):
        for values, dilate in itertools.product(itertools.product(*(axes[a] for a in AXES)), dilations):
            params = dict(zip(AXES, values))
            for k in OPTIONAL_AXES:
                if _only_default(k, grid.axes.get(k, [OPTIONAL_AXES[k]])):
                    params.pop(k)               # the cell's key as before the axis existed
            if len(dilations) > 1:
                params["dilate"] = dilate       # one K: the cell's key as before several could be given
            spec = flags.build_spec(nodes=params["nodes"], bw=params["bw"], latency=params["latency"],
                                    compressor=params["compressor"], workload=params["workload"], steps=str(grid.steps),
                                    batch_size=params["batch_size"], lr=grid.lr, seed=repeat_seed(grid.seed, repeat),
                                    optimizer=params.get("optimizer", OPTIONAL_AXES["optimizer"]),
                                    comm=params.get("comm", OPTIONAL_AXES["comm"]),
                                    eval_every=grid.eval_every,
                                    bucket_cap_mb=grid.bucket_cap_mb, timeout=grid.timeout, results_dir=grid.results_dir,
                                    calibrate=grid.calibrate != "none", accept_miss=grid.accept_miss,
                                    kernels=grid.kernels, mode=params["mode"],
                                    launcher="netns" if grid.launcher == "slurm" else grid.launcher,   # as 'node' has it
                                    device=grid.device, backend="nccl" if grid.device == "cuda" else "gloo",
                                    cpus_per_node=grid.cpus_per_node, dilate=dilate)
            cells.append(Cell(params, repeat, spec))
    return cells


# what a sweep gives every cell beside its axes: a finished cell whose run was made with other values
# (a sweep resumed under the same name with more steps, as a claims experiment made longer) is run again.
# Not the kernels: a run stores the ones it could use (the torch reference for a method without native ones)
SETTINGS = ("steps", "lr", "seed", "eval_every", "bucket_cap_mb", "device", "cpus_per_node", "dilate")


def standing(cells: list[Cell], name: str, conn, settings: tuple[str, ...] = SETTINGS) -> dict[tuple[str, int], str]:
    """(cell key, repeat) -> run id, for the cells of ``cells`` that sweep ``name`` finished with
    the ``settings`` it now gives them: what a resumed sweep keeps (a cell finished with other steps
    stands for nothing, and is run again), and what the claims judge reads."""
    runs = {(r["cell"], r["repeat"]): r["run_id"] for r in results.sweep_runs(conn, name)}
    out = {}
    for c in cells:
        run_id = runs.get((c.key, c.repeat))
        spec = results.spec_of(conn, run_id) if run_id else None
        if spec is None:                # its run is not in this store (copied out, removed): kept as it was
            if run_id:
                out[(c.key, c.repeat)] = run_id
            continue
        made = RunSpec.from_json(spec)
        if all(getattr(made, k) == getattr(c.spec, k) for k in settings):
            out[(c.key, c.repeat)] = run_id
    return out


def todo(cells: list[Cell], name: str, results_dir: str, retry_failed: bool = False) -> list[Cell]:
    """The cells still to run: never started, interrupted, (with ``retry_failed``) failed, or
    finished with other settings than the sweep now gives them (``SETTINGS``)."""
    conn = results.connect(results_dir)
    rerun = {None, "running", "interrupted"} | ({"failed"} if retry_failed else set())
    kept = standing(cells, name, conn)
    left = [c for c in cells if (status := results.cell_status(conn, name, c.key, c.repeat)) in rerun
            or (status == "ok" and (c.key, c.repeat) not in kept)]
    conn.close()
    return left


def run(grid: Grid, name: str, cells: list[Cell], on_start: Callable[[Cell], None] = lambda c: None,
        on_done: Callable[[Cell, results.RunSummary], None] = lambda c, s: None) -> dict[str, float]:
    """Run ``cells`` of sweep ``name`` in order, each on the network of the cells before it where
    it fits (``grid.keep``, launch/kept.py). Ctrl-C (interrupts.Interrupted or KeyboardInterrupt)
    marks the current cell interrupted and propagates; the store stays resumable. What the cells
    shared and could not remove is an error where the cells raised none, and a note on the error
    where they did (as launch.kept.kept_for)."""
    conn = results.connect(grid.results_dir)
    kept = KeptNetwork() if grid.keep and grid.launcher != "slurm" else None
    hosts = _Hosts(grid, cells) if grid.launcher == "slurm" else None
    calibrated: set[tuple] = set()
    counts = {"ok": 0, "failed": 0}
    current: Cell | None = None
    try:
        for cell in cells:
            current = cell
            measure = grid.calibrate == "all" or (grid.calibrate == "first" and cell.link not in calibrated)
            results.mark_cell(conn, name, cell.key, cell.repeat, "running")
            on_start(cell)
            if hosts is not None:
                with interrupts.signals_raise():        # as a run's: Ctrl-C and SIGTERM stop the step, even where
                    summary = hosts.run(cell, measure)          # the sweep was started with SIGINT ignored
            else:
                summary = runner.run(cell.spec.replace(calibrate=measure), kept=kept, fresh=not grid.keep)
            if measure and not summary.calibration_missed:
                calibrated.add(cell.link)          # a link that missed is measured again at its next cell
            results.mark_cell(conn, name, cell.key, cell.repeat, summary.status, summary.run_id)
            counts[summary.status] += 1
            current = None
            on_done(cell, summary)
    except BaseException as e:
        try:
            if current is not None and isinstance(e, (interrupts.Interrupted, KeyboardInterrupt)):
                results.mark_cell(conn, name, current.key, current.repeat, "interrupted", getattr(e, "run_id", None))
        finally:
            try:
                problems = _release(conn, kept, hosts, counts)
            except Exception as failed:                 # a cleanup that raised: the cell's error stays the one told
                problems = [f"the cleanup itself failed ({type(failed).__name__}: {failed})"]
            if problems:                                # told beside the error, not instead of it
                e.add_note(LEFT + "; ".join(problems))
        raise
    if problems := _release(conn, kept, hosts, counts):
        raise RuntimeError(LEFT + "; ".join(problems))
    return counts


LEFT = "what the sweep kept (its network, fork server or Slurm allocation) could not all be removed (run 'gctestbed clean'): "


def _release(conn, kept: KeptNetwork | None, hosts: _Hosts | None, counts: dict) -> list[str]:
    """Close the store and what the cells shared; what could not be removed."""
    conn.close()
    laps = Laps()
    problems = (kept.close() if kept is not None else []) + (hosts.close() if hosts is not None else [])
    if kept is not None:
        counts["kept_teardown_s"] = laps.lap()
    return problems


class _Hosts:
    """The Slurm allocation a sweep's cells run on (launch/slurm.py), obtained at its first cell."""

    def __init__(self, grid: Grid, cells: list[Cell]):
        self.grid = grid
        self.size = max((c.spec.world for c in cells), default=0)
        self.state: ledger.RunState | None = None
        self.alloc: slurm.Allocation | None = None

    def run(self, cell: Cell, calibrate: bool) -> results.RunSummary:
        if self.alloc is None:
            self.state = ledger.RunState.create(results_db=results.db_path(self.grid.results_dir))
            self.state.update(meta={"kind": "slurm allocation"})
            self.alloc = slurm.Allocation.obtain(self.size, self.grid.partition, self.state)
        spec = resolve(cell.spec.replace(calibrate=calibrate), secrets.token_hex(3))
        return slurm.run_cell(spec, node_args(cell, self.grid, calibrate), self.alloc, self.grid.dev)

    def close(self) -> list[str]:
        return self.state.undo() if self.state is not None else []


def node_args(cell: Cell, grid: Grid, calibrate: bool) -> list[str]:
    """The cell as 'gctestbed node' flags (the values as typed, so each host parses what the sweep did)."""
    p = cell.params
    args = ["--bw", p["bw"], "--latency", p["latency"], "--compressor", p["compressor"], "--workload", p["workload"],
            "--batch-size", p["batch_size"], "--mode", p["mode"], "--optimizer", p.get("optimizer", OPTIONAL_AXES["optimizer"]),
            "--comm", p.get("comm", OPTIONAL_AXES["comm"]), "--steps", str(grid.steps), "--lr", grid.lr,
            "--eval-every", grid.eval_every, "--seed", str(cell.spec.seed), "--bucket-cap-mb", grid.bucket_cap_mb,
            "--timeout", grid.timeout, "--kernels", grid.kernels, "--device", grid.device,
            "--backend", "nccl" if grid.device == "cuda" else "gloo", "--calibrate" if calibrate else "--no-calibrate"]
    return args + (["--accept-miss"] if grid.accept_miss else [])
