"""run, sweep, report, show, clean, compressors and verify: the commands that train and read the store."""

from __future__ import annotations

import json
import os
import sys

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .. import flags, interrupts, results, runner, tracefile
from .. import trace as trace_
from .. import sweep as sweep_
from .. import verify as verify_
from ..spec import KERNEL_MODES, LAUNCHERS, SpecError, UserError, format_duration, format_rate, parse_rate

from . import console, main
from .options import calibration_options, cpus_option, dilate_option, network_options, training_options
from .render import bench_report, compressors_table, print_report, print_summary, verify_table


@main.command(context_settings={"allow_interspersed_args": False})
@network_options
@calibration_options
@training_options
@click.option("--launcher", type=click.Choice(LAUNCHERS), default=flags.DEFAULTS["launcher"], show_default=True,
              help="netns: nodes are network namespaces on this host; docker: containers of the gctestbed-node "
                   "image ('gctestbed image build'), shaped the same way.")
@click.option("--fault", "faults", multiple=True, metavar="FAULT",
              help="Break a node's link mid-run, counted from the first step (repeatable): "
                   "link-down:node=1,at=10s,for=2s takes both ends of its cable down; "
                   "loss:node=0,pct=5,at=5s[,for=3s] drops that share of its packets each way.")
@cpus_option
@click.option("--replay", default=None, metavar="TRACE[,OPTIONS]",
              help="Replay a trace ('gctestbed trace record') instead of running a model: its compute (and with codec=recorded "
                   "its payloads) replayed, everything on the wire real. TRACE[,compute=sleep|spin][,codec=real|recorded]"
                   "[,scale=K]; the workload replay:trace=TRACE,... (docs/replay.md).")
@dilate_option
@click.option("--record-trace", default=None, metavar="FILE",
              help="When the run ends well, write its trace to FILE (as 'gctestbed trace record' would; .gz compresses).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(nodes, bw, bw_down, latency, jitter, loss, latency_impl, topology_file, calibrate, accept_miss, compressor,
        kernel_mode, workload, mode, launcher, steps, batch_size, optimizer, lr, comm, eval_every, seed, bucket_cap_mb,
        timeout, faults, cpus_per_node, dilate, results_dir, command, replay, record_trace):
    """Train once on N shaped nodes and record every step.

    With '-- CMD ...' every node runs your own DDP program instead of a built-in workload, with
    torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...); calling gctestbed.install(ddp_model)
    in it installs --compressor and records each step (see docs/guide.md).
    """
    summary = early = None
    try:
        with runner.early_start(launcher, command, results_dir) as early:     # the fork server imports while the flags are read
            spec = flags.build_spec(nodes=nodes, bw=bw, bw_down=bw_down, latency=latency, jitter=jitter, loss=loss,
                                    latency_impl=latency_impl, topology_file=topology_file, compressor=compressor,
                                    workload=workload, steps=steps, batch_size=batch_size, optimizer=optimizer, lr=lr,
                                    comm=comm, eval_every=eval_every, seed=seed,
                                    bucket_cap_mb=bucket_cap_mb, timeout=timeout, results_dir=results_dir, calibrate=calibrate,
                                    accept_miss=accept_miss, kernels=kernel_mode, mode=mode, command=list(command),
                                    launcher=launcher, faults=faults, cpus_per_node=cpus_per_node, replay=replay, dilate=dilate)
            why = trace_.untraceable(spec) if record_trace else None
            if why:
                raise SpecError(f"--record-trace cannot trace this run, because {why}: leave it out.")
            console.print(f"[bold]gctestbed[/] {spec.nodes} {spec.launcher} nodes, {format_rate(spec.link.bw_bps)}, "
                          f"latency {format_duration(spec.link.latency_s)}, compressor {spec.compressor}, "
                          f"{'command ' + ' '.join(spec.command) if spec.command else 'workload ' + spec.workload}, {spec.mode}"
                          + (f", dilated x{spec.dilate:g}" if spec.dilate != 1 else ""))
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                          TextColumn("{task.fields[info]}"), console=console, transient=False) as bar:
                task = bar.add_task("rank 0", total=spec.steps, info="starting nodes")

                def progress(done: int, total: int, row: dict) -> None:
                    loss_text = f"loss {row['loss']:.4f}  " if row["loss"] is not None else ""
                    bar.update(task, completed=done, info=f"{loss_text}step {row['step_s'] / spec.dilate:.3f}s")

                summary = runner.run(spec, progress, lambda text: bar.update(task, info=text), early=early)
    except interrupts.Interrupted as e:     # Ctrl-C or SIGTERM (early_start's and runner.run's signals_raise): while the
        #                                 flags were read (the early start undone), in the run, or as it ended
        if summary is not None:
            console.print(f"interrupted after run {summary.run_id} ended; it is recorded as {summary.status}")
        elif e.run_id is None and early is not None and early.taken:   # as runner.run returned
            console.print(f"interrupted as run {early.state.run_id} ended ('gctestbed show {early.state.run_id}' says how)")
        else:
            console.print(f"interrupted: run {e.run_id} torn down and recorded as failed" if e.run_id
                          else "interrupted before the run started: nothing was left behind")
        sys.exit(130)
    print_summary(summary)
    if summary.status != "ok":
        click.echo(f"gctestbed: run {summary.run_id} failed: {summary.error}", err=True)
        sys.exit(1)
    if record_trace:
        _save_trace(spec.results_dir, summary.run_id, record_trace)


def _save_trace(results_dir: str, run_id: str, path: str) -> None:
    """The trace of finished run ``run_id`` written to ``path`` (as 'gctestbed trace record' would)."""
    conn = results.connect(results_dir, create=False)
    try:
        tracefile.save(trace_.extract(conn, run_id), path)
    finally:
        conn.close()
    console.print(f"trace of run {run_id} -> {path}")


def _axis_values(axis: str, given: tuple[str, ...]) -> list[str]:
    """Values of one sweep axis as typed: repeatable flags, each a list (';' between compressors
    or workloads, whose options contain commas; ',' elsewhere)."""
    sep = ";" if axis in ("compressor", "workload", "optimizer", "comm") else ","
    return [v.strip() for g in given for v in g.split(sep) if v.strip()]


@main.command()
@click.option("--preset", type=click.Choice(sorted(sweep_.PRESETS)), default=None,
              help="quick: the FC-heavy mlp on 2 nodes, 5 methods x 5 bandwidths x 2 modes (about 3 minutes on "
                   "2 cores); paper: every workload and the main methods on 2 and 4 nodes (hours). Axes given as "
                   "flags replace the preset's.")
@click.option("--bw", multiple=True, help="Bandwidths, comma-separated or repeated (tc units: mbit = bits/s).")
@click.option("--latency", multiple=True, help="One-way latencies, e.g. 0,1ms,10ms.")
@click.option("--compressor", multiple=True, help="Methods, separated by ';' or repeated: 'none;dgc:ratio=0.01;fp16'.")
@click.option("--nodes", multiple=True, help="Node counts, e.g. 2,4.")
@click.option("--workload", multiple=True, help="Workloads, separated by ';' or repeated: 'mlp;cnn:width=16'.")
@click.option("--replay", default=None, metavar="TRACE[,OPTIONS]",
              help="Every cell replays this trace (the workload axis; as for run). With codec=real each method runs on "
                   "the trace's compute; with codec=recorded the trace's own method is replayed.")
@click.option("--batch-size", multiple=True, help="Samples per node per step, e.g. 32,128.")
@click.option("--mode", multiple=True, help="Timing modes: overlap, serial or both (overlap,serial).")
@click.option("--optimizer", multiple=True, help="Optimizers, separated by ';' or repeated: 'sgd;adam:beta2=0.98'.")
@click.option("--comm", multiple=True, help="Schemes, separated by ';' or repeated: 'allreduce;ps:servers=2;localsgd:period=4'.")
@click.option("--steps", type=int, default=None, help="Training steps per cell (preset's, else 8).")
@click.option("--repeat", type=int, default=None, help="Runs per cell (preset's, else 1).")
@click.option("--bucket-cap-mb", default=None, help="DDP bucket size in MB (preset's, else 25).")
@click.option("--kernels", "kernel_mode", type=click.Choice(KERNEL_MODES), default=flags.DEFAULTS["kernels"],
              show_default=True, help="Compressor kernels, as for run.")
@click.option("--launcher", type=click.Choice(LAUNCHERS + ("slurm",)), default=flags.DEFAULTS["launcher"], show_default=True,
              help="Where the nodes run, as for run; slurm: each cell one srun step across that many hosts of an "
                   "allocation, each host running 'gctestbed node' (docs/clusters.md).")
@click.option("--partition", default=None, help="--launcher slurm: the partition to allocate the hosts in.")
@click.option("--dev", default="eth0", show_default=True,
              help="--launcher slurm: each host's interface to shape with the cell's link (and to pin Gloo/NCCL to).")
@click.option("--lr", default=flags.DEFAULTS["lr"], show_default=True, help="The optimizer's learning rate.")
@click.option("--eval-every", default=flags.DEFAULTS["eval_every"], show_default=True,
              help="Evaluate every N steps, for time to accuracy (0: after the last step only).")
@click.option("--seed", default=flags.DEFAULTS["seed"], show_default=True,
              help="Seed of model and data of the first repeat; repeat k runs with seed + k (every method of a repeat "
                   "shares its seed).")
@click.option("--calibrate", type=click.Choice(sweep_.CALIBRATE), default="first", show_default=True,
              help="Calibrate links: at the first cell of each link setting, before every cell, or never.")
@click.option("--accept-miss", is_flag=True, help="Train even when calibration misses.")
@click.option("--name", default=None, help="Sweep name (default: derived from the grid, so the same command resumes).")
@click.option("--retry-failed", is_flag=True, help="Run failed cells again (interrupted ones always are).")
@click.option("--dry-run", is_flag=True, help="List the cells still to run and exit.")
@click.option("--fresh-nodes", is_flag=True,
              help="Build every cell's network and start an interpreter per node (default: cells that fit keep the "
                   "network, re-shaped, and fork workers from one pre-imported server).")
@cpus_option
@dilate_option
@click.option("--record-traces", "trace_dir", default=None, metavar="DIR",
              help="Write each cell's trace, when it ends well, to DIR/<method>-<run id>.json.gz: several methods "
                   "recorded on the same model in one command (--compressor 'none;dgc;twobit').")
@click.option("--results", "results_dir", default=flags.DEFAULTS["results_dir"], show_default=True, help="Results directory (one SQLite store).")
def sweep(preset, steps, repeat, bucket_cap_mb, kernel_mode, launcher, partition, dev, lr, eval_every, seed, calibrate, accept_miss, name, retry_failed, dry_run,
          fresh_nodes, cpus_per_node, dilate, results_dir, replay, trace_dir, **axes):
    """Run a grid of cells (bandwidth x latency x compressor x nodes x workload x batch size x mode x optimizer x comm),
    resumably: Ctrl-C stops it cleanly, and the same command goes on where it stopped."""
    shared = dict(kernels=kernel_mode, launcher=launcher, lr=lr, eval_every=eval_every, seed=seed, calibrate=calibrate,
                  accept_miss=accept_miss, cpus_per_node=str(cpus_per_node), dilate=str(dilate), results_dir=results_dir, keep=not fresh_nodes,
                  partition=partition, dev=dev)
    grid = sweep_.from_preset(preset, **shared) if preset else sweep_.Grid(
        axes={axis: [flags.DEFAULTS[axis]] for axis in sweep_.AXES}, **shared)
    if replay:
        if axes["workload"]:
            raise SpecError("--replay TRACE is the workload of every cell: leave out --workload.")
        axes["workload"] = (flags.replay_workload(replay),)
    for axis, given in axes.items():
        if given:
            grid.axes[axis] = _axis_values(axis, given)
    grid.steps = steps if steps is not None else grid.steps
    grid.repeat = repeat if repeat is not None else grid.repeat
    grid.bucket_cap_mb = bucket_cap_mb if bucket_cap_mb is not None else grid.bucket_cap_mb
    name = name or grid.default_name()
    cells = sweep_.plan(grid)
    left = sweep_.todo(cells, name, results_dir, retry_failed)
    why = next((w for w in map(trace_.untraceable, (c.spec for c in cells)) if w), None) if trace_dir else None
    if why:
        raise SpecError(f"--record-traces cannot trace this sweep's cells, because {why}: leave it out.")
    console.print(f"[bold]sweep {name}[/]: {len(cells)} cells, {len(cells) - len(left)} already done, "
                  f"{len(left)} to run ({results_dir})")
    if dry_run:
        for c in left:
            click.echo(f"{c.repeat}  {c.key}")
        return
    if trace_dir:
        os.makedirs(trace_dir, exist_ok=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  TextColumn("{task.fields[info]}"), console=console) as bar:
        task = bar.add_task(name, total=len(cells), completed=len(cells) - len(left), info="")

        def started(cell):
            bar.update(task, info=_cell_label(cell))

        fixed = []

        def done(cell, summary):
            bar.update(task, advance=1)
            if summary.phases:
                fixed.append(summary.phases["fixed_s"])
                p = summary.phases
                console.print(f"{escape(_cell_label(cell))}: {p['total_s']:.1f} s = steps {p['steps_s']:.1f} s + calibration "
                              f"{p.get('calibrate_s', 0.0):.1f} s + fixed cost {p['fixed_s']:.1f} s")
            if summary.status != "ok":
                console.print(f"cell {escape(cell.key)} failed: {escape(summary.error or '')}")
            elif trace_dir:
                try:
                    _save_trace(results_dir, summary.run_id,
                                os.path.join(trace_dir, f"{cell.spec.compressor}-{summary.run_id}.json.gz"))
                except UserError as e:     # the cell stays done; the sweep goes on
                    console.print(f"no trace of run {summary.run_id}: {escape(str(e))} ('gctestbed trace record "
                                  f"{summary.run_id}' writes it once that is fixed)")

        try:
            counts = sweep_.run(grid, name, left, started, done)
        except (interrupts.Interrupted, KeyboardInterrupt):
            console.print(f"interrupted: the current cell was torn down; run the same command again to resume {name}")
            sys.exit(130)
    click.echo(f"sweep {name}: {counts['ok']} ok, {counts['failed']} failed; "
               f"report with: gctestbed report {results_dir} --sweep {name}")
    if fixed:
        fixed.sort()
        click.echo(f"fixed cost per cell (wall time beyond its steps and calibration): median {fixed[len(fixed) // 2]:.1f} s, "
                   f"from {fixed[0]:.1f} to {fixed[-1]:.1f} s over {len(fixed)} cells"
                   + (f", and {counts['kept_teardown_s']:.1f} s to remove the kept network at the end"
                      if counts.get("kept_teardown_s") is not None else ""))


def _cell_label(cell) -> str:
    p = cell.params
    dilated = f" x{p['dilate']}" if "dilate" in p else ""
    return f"{p['compressor']} @ {p['bw']} {p['mode']}{dilated}, {p['nodes']} nodes (repeat {cell.repeat + 1})"


@main.command()
@click.argument("results_dir", default=flags.DEFAULTS["results_dir"], required=False)
@click.option("--out", default=None, help="Where to write the PNGs, report.html, cells.csv and report.json "
                                          "(default: RESULTS/report).")
@click.option("--sweep", "sweep_name", default=None, help="Only this sweep's cells (default: every sweep in the store).")
@click.option("--baseline", type=click.Choice(["none", "fp16", "bf16"]), default="none", show_default=True,
              help="What speedups and break-even compare against: plain fp32 DDP, or the half-precision all-reduce "
                   "many already run.")
@click.option("--target-accuracy", type=float, default=None,
              help="Time to accuracy: until the held-out accuracy reaches this (default: 99 %% of the baseline's final).")
@click.option("--target-loss", type=float, default=None, help="Time to accuracy by held-out loss instead.")
@click.option("--fit-nodes", default=None, metavar="N,N",
              help="Fit the model on these node counts only and report its error on the others (e.g. 2,4).")
@click.option("--json", "as_json", is_flag=True, help="Print report.json instead of the tables.")
def report(results_dir, out, sweep_name, baseline, target_accuracy, target_loss, fit_nodes, as_json):
    """Break-even bandwidths, time to accuracy, the fitted performance model and pictures from a results store."""
    from ..analysis import report as report_
    out = out or os.path.join(results_dir, "report")
    fit_on = set(flags.node_counts("--fit-nodes", fit_nodes)) if fit_nodes else None
    with console.status("analysing and drawing"):
        r = report_.build(results_dir, out, sweep_name, baseline, target_accuracy, target_loss, fit_on)
    if as_json:
        click.echo(json.dumps(r, indent=2, default=str))
        return
    print_report(r)
    click.echo(f"report: {os.path.join(out, 'report.html')} ({len(r['pictures'])} pictures, cells.csv, report.json)")


@main.command()
@click.argument("run_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--all", "show_all", is_flag=True, help="Summarise every stored run.")
@click.option("--results", "results_dir", default=flags.DEFAULTS["results_dir"], show_default=True, help="Results directory.")
def show(run_id, as_json, show_all, results_dir):
    """Summarise a run (the latest when RUN_ID is omitted; a prefix of the id is enough)."""
    conn = results.connect(results_dir, create=False)
    rows = [results.find_run(conn, r["run_id"]) for r in results.list_runs(conn)] if show_all else [results.find_run(conn, run_id)]
    summaries = [results.summarize(conn, r) for r in rows]
    if as_json:
        click.echo(json.dumps([s.to_dict() for s in summaries] if show_all else summaries[0].to_dict(), indent=2))
    else:
        for s in summaries:
            print_summary(s)


@main.command()
def clean():
    """Remove namespaces, links, qdiscs and processes left by runs whose gctestbed process died."""
    run_ids, problems = runner.clean()
    for run_id in run_ids:
        click.echo(f"cleaned run {run_id}")
    if not run_ids:
        click.echo("nothing to clean")
    if problems:
        click.echo("could not remove: " + "; ".join(problems), err=True)
        sys.exit(1)


@main.command(name="compressors")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def compressors_(as_json):
    """List every compression method: collective, options with defaults, paper."""
    from .. import compress
    rows = compress.registry.describe()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    Console().print(compressors_table(rows))


@main.command(name="verify")
@click.option("--compressor", multiple=True,
              help="Methods to check, separated by ';' or repeated, with options if wanted (default: all 17).")
@click.option("--nodes", default=2, show_default=True, help="Nodes of the job.")
@click.option("--bw", default="1gbit", show_default=True, help="Link rate of every node (tc units: mbit = bits/s).")
@click.option("--steps", default=verify_.STEPS, show_default=True, help="Training steps per method (the first two are not judged); a method whose contract has phases "
                   "(DGC's warm-up, PowerSGD's dense start) runs as many as judging every phase needs.")
@click.option("--comm", default="allreduce", show_default=True,
              help="How the workers meet, as for run: allreduce, or ps[:servers=K,pull=dense|compressed,place=mxnet|balanced] to judge the "
                   "pushes and the servers' links too (methods a server cannot sum are left out of the default list).")
@click.option("--results", "results_dir", default="results/verify", show_default=True, help="Results directory.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
def verify(compressor, nodes, bw, steps, comm, results_dir, as_json):
    """Check every method against its paper's contract on a small shaped job beside 'none': exchanges
    per step, rounds and collectives, elements chosen, payload terms, and the interface counters,
    in every phase of a method's schedule (options not typed are set so that each phase is
    reached; the table lists the steps judged in each). Exits 1 when any method breaks its contract."""
    if comm.split(":")[0] not in ("allreduce", "ps"):
        raise SpecError(f"verify judges the ring or parameter servers (--comm allreduce or ps), not '{comm}'.")
    if nodes < 2 or steps < 4:
        raise SpecError("--nodes must be at least 2 and --steps at least 4 (the first two steps are not judged).")
    methods = verify_.methods_from(compressor, comm, steps)
    parse_rate(bw)
    report = bench_report("verify", lambda phase: verify_.run(methods, nodes, bw, steps, results_dir,
                                                             lambda m: phase(f"verify: {m}"), comm),
                           verify_table, as_json, width=140)
    if not report["ok"]:
        rows = report["methods"] + ([report["none"]] if report["none"] not in report["methods"] else [])
        broken = [r["method"] for r in rows if not r["ok"]]
        click.echo(f"gctestbed: {len(broken)} method(s) broke their contract: {', '.join(broken)}", err=True)
        sys.exit(1)

