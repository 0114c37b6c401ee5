"""The gctestbed command line: parse, call, print. Nothing else lives here.

A mistake the user can fix prints one sentence and exits 2; a run that fails exits 1 with its
error; Ctrl-C tears the cluster down and exits 130.
"""

from __future__ import annotations

import json
import os
import sys
import time

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from . import compress, contracts, doctor, flags, results, runner, testbed
from . import sweep as sweep_
from . import verify as verify_
from .net import calibrate as calibration
from .spec import (KERNEL_MODES, LAUNCHERS, MAX_NODES, TIMING_MODES, Direction, LinkSpec, RunSpec, SpecError, UserError,
                   format_duration, format_rate, parse_duration, parse_percent, parse_rate)

console = Console(stderr=True)


class Cli(click.Group):
    """A group that turns UserError into one line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as e:
            click.echo(f"gctestbed: {e}", err=True)
            ctx.exit(2)
        except click.UsageError as e:        # click's own (a missing value, a bad choice): one line too
            where = e.ctx.command_path if e.ctx else "gctestbed"
            click.echo(f"gctestbed: {UserError(e.format_message().rstrip('.'))}; see '{where} --help'.", err=True)
            ctx.exit(2)


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gctestbed")
def main() -> None:
    """Measure whether gradient compression speeds up data-parallel training on a shaped network."""


def network_options(f):
    """The flags that describe the cluster's network, shared by run, up and calibrate."""
    for option in reversed(_NETWORK_OPTIONS):
        f = option(f)
    return f


_NETWORK_OPTIONS = [
    click.option("--nodes", default=flags.DEFAULTS["nodes"], show_default=True, help=f"Number of nodes, 1 to {MAX_NODES}."),
    click.option("--bw", default=flags.DEFAULTS["bw"], show_default=True,
                 help="Link rate of every node (upload, and download unless --bw-down), in tc's units: bit, kbit, "
                      "mbit, gbit, tbit are BITS per second; bps, kbps, mbps, gbps are BYTES per second "
                      "(so 100mbps = 800mbit)."),
    click.option("--bw-down", default=None, help="Download rate of every node, if it differs from --bw (same units)."),
    click.option("--latency", default=flags.DEFAULTS["latency"], show_default=True,
                 help="One-way delay between any two nodes, in us, ms or s: the round trip is twice this, however "
                      "the topology splits it across hops."),
    click.option("--jitter", default=flags.DEFAULTS["jitter"], show_default=True,
                 help="Random variation of that one-way delay (uniform, +/-), never reordering packets."),
    click.option("--loss", default=flags.DEFAULTS["loss"], show_default=True, help="Packet loss between two nodes, in percent (e.g. 0.5%)."),
    click.option("--latency-impl", type=click.Choice(["auto", "netem", "delayline"]), default=flags.DEFAULTS["latency_impl"],
                 show_default=True,
                 help="How delay, jitter and loss are made: the kernel's netem, or gctestbed's userspace delay line "
                      "on TAP devices (for kernels without netem); auto prefers netem."),
    click.option("--topology", "topology_file", default=None, metavar="FILE|NAME",
                 help="A topology TOML file, or the name of one shipped with gctestbed (two-racks, two-sites, "
                      "straggler, asymmetric, star4; see docs/topologies.md), which replaces --nodes/--bw/--latency/"
                      "--jitter/--loss; 'star' is the default network those flags describe."),
]


def training_options(f):
    """The flags that describe the training job, shared by run and node (same names, same defaults)."""
    for option in reversed(_TRAINING_OPTIONS):
        f = option(f)
    return f


_TRAINING_OPTIONS = [
    click.option("--compressor", default=flags.DEFAULTS["compressor"], show_default=True,
                 help="Method and options, e.g. fp16 or NAME:key=value,... ('gctestbed compressors' lists them)."),
    click.option("--kernels", "kernel_mode", type=click.Choice(KERNEL_MODES), default=flags.DEFAULTS["kernels"], show_default=True,
                 help="Compressor kernels: native C++/CUDA (built on first use; the torch reference where no compiler is found) or the pure-torch reference."),
    click.option("--workload", default=flags.DEFAULTS["workload"], show_default=True,
                 help="Built-in workload and options (mlp, cnn, lstm, transformer; e.g. mlp:width=512,depth=3), or your "
                      "own as pkg.module:function, called as function(rank, world, batch_size, seed) and returning "
                      "(model, batches, loss_fn[, evaluate])."),
    click.option("--mode", type=click.Choice(TIMING_MODES), default=flags.DEFAULTS["mode"], show_default=True,
                 help="overlap: communicate in DDP's hook during backward (production); serial: after backward, "
                      "compress, communicate, decompress, each phase timed."),
    click.option("--steps", default=flags.DEFAULTS["steps"], show_default=True, help="Training steps (with -- CMD: the steps expected, for progress)."),
    click.option("--batch-size", default=flags.DEFAULTS["batch_size"], show_default=True, help="Samples per node per step."),
    click.option("--lr", default=flags.DEFAULTS["lr"], show_default=True, help="SGD learning rate (momentum 0.9)."),
    click.option("--seed", default=flags.DEFAULTS["seed"], show_default=True, help="Seed of the model, the teacher and the data."),
    click.option("--bucket-cap-mb", default=flags.DEFAULTS["bucket_cap_mb"], show_default=True, help="DDP bucket size in MB."),
    click.option("--timeout", default=flags.DEFAULTS["timeout"], show_default=True,
                 help="Collective timeout: a node silent this long fails the run (and is named as hung)."),
    click.option("--results", "results_dir", default=flags.DEFAULTS["results_dir"], show_default=True, help="Results directory (one SQLite store)."),
]


@main.command(context_settings={"allow_interspersed_args": False})
@network_options
@click.option("--calibrate/--no-calibrate", default=True, show_default=True,
              help="Measure every link before training and stop if one misses its target by more than 10 %.")
@click.option("--accept-miss", is_flag=True, help="Train even when calibration misses (the run is marked as such).")
@training_options
@click.option("--launcher", type=click.Choice(LAUNCHERS), default=flags.DEFAULTS["launcher"], show_default=True,
              help="netns: nodes are network namespaces on this host; docker: containers of the gctestbed-node "
                   "image ('gctestbed image build'), shaped the same way.")
@click.option("--fault", "faults", multiple=True, metavar="FAULT",
              help="Break a node's link mid-run, counted from the first step (repeatable): "
                   "link-down:node=1,at=10s,for=2s takes both ends of its cable down; "
                   "loss:node=0,pct=5,at=5s[,for=3s] drops that share of its packets each way.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(nodes, bw, bw_down, latency, jitter, loss, latency_impl, topology_file, calibrate, accept_miss, compressor,
        kernel_mode, workload, mode, launcher, steps, batch_size, lr, seed, bucket_cap_mb, timeout, faults, results_dir,
        command):
    """Train once on N shaped nodes and record every step.

    With '-- CMD ...' every node runs your own DDP program instead of a built-in workload, with
    torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...); calling gctestbed.install(ddp_model)
    in it installs --compressor and records each step (see docs/guide.md).
    """
    spec = flags.build_spec(nodes=nodes, bw=bw, bw_down=bw_down, latency=latency, jitter=jitter, loss=loss,
                            latency_impl=latency_impl, topology_file=topology_file, compressor=compressor,
                            workload=workload, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                            bucket_cap_mb=bucket_cap_mb, timeout=timeout, results_dir=results_dir, calibrate=calibrate,
                            accept_miss=accept_miss, kernels=kernel_mode, mode=mode, command=list(command),
                            launcher=launcher, faults=faults)
    console.print(f"[bold]gctestbed[/] {spec.nodes} {spec.launcher} nodes, {format_rate(spec.link.bw_bps)}, "
                  f"latency {format_duration(spec.link.latency_s)}, compressor {spec.compressor}, "
                  f"{'command ' + ' '.join(spec.command) if spec.command else 'workload ' + spec.workload}, {spec.mode}")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  TextColumn("{task.fields[info]}"), console=console, transient=False) as bar:
        task = bar.add_task("rank 0", total=spec.steps, info="starting nodes")

        def progress(done: int, total: int, row: dict) -> None:
            loss_text = f"loss {row['loss']:.4f}  " if row["loss"] is not None else ""
            bar.update(task, completed=done, info=f"{loss_text}step {row['step_s']:.3f}s")

        try:
            summary = runner.run(spec, progress, lambda text: bar.update(task, info=text))
        except runner.Interrupted as e:
            console.print(f"interrupted: run {e.run_id} torn down and recorded as failed")
            sys.exit(130)
    _print_summary(summary)
    if summary["status"] != "ok":
        click.echo(f"gctestbed: run {summary['run_id']} failed: {summary['error']}", err=True)
        sys.exit(1)


def _axis_values(axis: str, given: tuple[str, ...]) -> list[str]:
    """Values of one sweep axis as typed: repeatable flags, each a list (';' between compressors
    or workloads, whose options contain commas; ',' elsewhere)."""
    sep = ";" if axis in ("compressor", "workload") else ","
    return [v.strip() for g in given for v in g.split(sep) if v.strip()]


@main.command()
@click.option("--preset", type=click.Choice(sorted(sweep_.PRESETS)), default=None,
              help="quick: the FC-heavy mlp on 2 nodes, 5 methods x 6 bandwidths x 2 modes (about 10 minutes on "
                   "2 cores); paper: every workload and the main methods on 2 and 4 nodes (hours). Axes given as "
                   "flags replace the preset's.")
@click.option("--bw", multiple=True, help="Bandwidths, comma-separated or repeated (tc units: mbit = bits/s).")
@click.option("--latency", multiple=True, help="One-way latencies, e.g. 0,1ms,10ms.")
@click.option("--compressor", multiple=True, help="Methods, separated by ';' or repeated: 'none;dgc:ratio=0.01;fp16'.")
@click.option("--nodes", multiple=True, help="Node counts, e.g. 2,4.")
@click.option("--workload", multiple=True, help="Workloads, separated by ';' or repeated: 'mlp;cnn:width=16'.")
@click.option("--batch-size", multiple=True, help="Samples per node per step, e.g. 32,128.")
@click.option("--mode", multiple=True, help="Timing modes: overlap, serial or both (overlap,serial).")
@click.option("--steps", type=int, default=None, help="Training steps per cell (preset's, else 8).")
@click.option("--repeat", type=int, default=None, help="Runs per cell (preset's, else 1).")
@click.option("--bucket-cap-mb", default=None, help="DDP bucket size in MB (preset's, else 25).")
@click.option("--kernels", "kernel_mode", type=click.Choice(KERNEL_MODES), default=flags.DEFAULTS["kernels"],
              show_default=True, help="Compressor kernels, as for run.")
@click.option("--launcher", type=click.Choice(LAUNCHERS), default=flags.DEFAULTS["launcher"], show_default=True,
              help="Where the nodes run, as for run.")
@click.option("--lr", default=flags.DEFAULTS["lr"], show_default=True, help="SGD learning rate.")
@click.option("--seed", default=flags.DEFAULTS["seed"], show_default=True, help="Seed of model and data.")
@click.option("--calibrate", type=click.Choice(sweep_.CALIBRATE), default="first", show_default=True,
              help="Calibrate links: at the first cell of each link setting, before every cell, or never.")
@click.option("--accept-miss", is_flag=True, help="Train even when calibration misses.")
@click.option("--name", default=None, help="Sweep name (default: derived from the grid, so the same command resumes).")
@click.option("--retry-failed", is_flag=True, help="Run failed cells again (interrupted ones always are).")
@click.option("--dry-run", is_flag=True, help="List the cells still to run and exit.")
@click.option("--results", "results_dir", default=flags.DEFAULTS["results_dir"], show_default=True, help="Results directory (one SQLite store).")
def sweep(preset, steps, repeat, bucket_cap_mb, kernel_mode, launcher, lr, seed, calibrate, accept_miss, name, retry_failed, dry_run,
          results_dir, **axes):
    """Run a grid of cells (bandwidth x latency x compressor x nodes x workload x batch size x mode),
    resumably: Ctrl-C stops it cleanly, and the same command goes on where it stopped."""
    shared = dict(kernels=kernel_mode, launcher=launcher, lr=lr, seed=seed, calibrate=calibrate, accept_miss=accept_miss,
                  results_dir=results_dir)
    grid = sweep_.from_preset(preset, **shared) if preset else sweep_.Grid(
        axes={axis: [flags.DEFAULTS[axis]] for axis in sweep_.AXES}, **shared)
    for axis, given in axes.items():
        if given:
            grid.axes[axis] = _axis_values(axis, given)
    grid.steps = steps if steps is not None else grid.steps
    grid.repeat = repeat if repeat is not None else grid.repeat
    grid.bucket_cap_mb = bucket_cap_mb if bucket_cap_mb is not None else grid.bucket_cap_mb
    name = name or grid.default_name()
    cells = sweep_.plan(grid)
    left = sweep_.todo(cells, name, results_dir, retry_failed)
    console.print(f"[bold]sweep {name}[/]: {len(cells)} cells, {len(cells) - len(left)} already done, "
                  f"{len(left)} to run ({results_dir})")
    if dry_run:
        for c in left:
            click.echo(f"{c.repeat}  {c.key}")
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  TextColumn("{task.fields[info]}"), console=console) as bar:
        task = bar.add_task(name, total=len(cells), completed=len(cells) - len(left), info="")

        def started(cell):
            p = cell.params
            bar.update(task, info=f"{p['compressor']} @ {p['bw']} {p['mode']} (repeat {cell.repeat + 1})")

        def done(cell, summary):
            bar.update(task, advance=1)
            if summary["status"] != "ok":
                console.print(f"cell {escape(cell.key)} failed: {escape(summary['error'] or '')}")

        try:
            counts = sweep_.run(grid, name, left, started, done)
        except (runner.Interrupted, KeyboardInterrupt):
            console.print(f"interrupted: the current cell was torn down; run the same command again to resume {name}")
            sys.exit(130)
    click.echo(f"sweep {name}: {counts['ok']} ok, {counts['failed']} failed; "
               f"report with: gctestbed report {results_dir} --sweep {name}")


@main.command()
@click.argument("results_dir", default=flags.DEFAULTS["results_dir"], required=False)
@click.option("--out", default=None, help="Where to write the PNGs, report.html, cells.csv and report.json "
                                          "(default: RESULTS/report).")
@click.option("--sweep", "sweep_name", default=None, help="Only this sweep's cells (default: every sweep in the store).")
@click.option("--json", "as_json", is_flag=True, help="Print report.json instead of the tables.")
def report(results_dir, out, sweep_name, as_json):
    """Break-even bandwidths, the fitted performance model and pictures from a results store."""
    from .analysis import report as report_
    out = out or os.path.join(results_dir, "report")
    with console.status("analysing and drawing"):
        r = report_.build(results_dir, out, sweep_name)
    if as_json:
        click.echo(json.dumps(r, indent=2, default=str))
        return
    terminal = Console(width=max(Console().width, 120))
    table = Table(title="break-even bandwidth (below it the method's steps are faster than none's)")
    for col in ("setting", "method", "break-even", "convergence"):
        table.add_column(col)
    for b in r["break_even"]:
        table.add_row(b["group"], b["compressor"], b["text"], "; ".join(b["flags"]) or "-")
    terminal.print(table)
    for group, best in r["best"].items():
        terminal.print(f"fastest, {group}: " + ", ".join(f"{report_.fmt_bw(b['bw_bps'])} {b['compressor']}" for b in best))
    if not r["model"]:
        terminal.print(report_.NO_MODEL)
    for variant, m in r["model"].items():
        terminal.print(f"model ({variant}): lambda {m['lambda']:.3f}, alpha {m['alpha_s'] * 1e6:.0f} us, eta {m['eta']:.3f}; "
                       f"median |error| {report_.pct(m['median_abs_error'])} over {m['predicted_cells']} predicted cells, "
                       f"{len(m['misses'])} off by more than 10 % (each with its reason in report.html)")
    if r["projection"] and r["projection"]["rows"]:
        proj = r["projection"]
        table = Table(title=f"projected break-even bandwidth: {proj['label']}")
        for col in ["setting", "method"] + [f"{p} nodes" for p in proj["nodes"]]:
            table.add_column(col)
        for row in proj["rows"]:
            table.add_row(f"{row['workload']}, batch {row['batch_size']}", row["compressor"],
                          *[report_.fmt_bw(v) if isinstance(v, float) else v for v in row["break_even_bps"].values()])
        terminal.print(table)
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
        click.echo(json.dumps(summaries if show_all else summaries[0], indent=2))
    else:
        for s in summaries:
            _print_summary(s)


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


def _network_spec(nodes, bw, bw_down, latency, jitter, loss, latency_impl, topology_file) -> RunSpec:
    return flags.build_spec(nodes=nodes, bw=bw, bw_down=bw_down, latency=latency, jitter=jitter, loss=loss,
                            latency_impl=latency_impl, topology_file=topology_file)


@main.command()
@network_options
def up(**network):
    """Bring a shaped cluster up and leave it running; prints its name."""
    state = testbed.up(_network_spec(**network))
    table = Table(title=f"gct-{state.run_id}  (delay: {state.meta['latency_impl']}, subnet {state.subnet})")
    for col in ("node", "namespace", "address"):
        table.add_column(col)
    for n in state.meta["nodes"]:
        table.add_row(str(n["rank"]), n["netns"], n["address"])
    console.print(table)
    console.print(f"run programs in it with: gctestbed exec gct-{state.run_id} NODE -- CMD ...; "
                  f"remove it with: gctestbed down gct-{state.run_id}")
    click.echo(f"gct-{state.run_id}")


@main.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("node")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def exec_(name, node, command):
    """Run COMMAND inside NODE (a rank or namespace) of cluster NAME: gctestbed exec NAME 0 -- CMD ..."""
    testbed.exec_in(name, node, list(command))


@main.command(name="ls")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ls_(as_json):
    """List clusters brought up with 'up' and runs in progress."""
    rows = testbed.listing()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table()
    for col in ("name", "kind", "alive", "nodes", "subnet", "delay"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["kind"], "yes" if r["alive"] else "no (gctestbed clean)", str(r["nodes"]),
                      r["subnet"], r["latency_impl"] or "-")
    Console().print(table if rows else "no clusters or runs")


@main.command()
@click.argument("name")
@click.option("--force", is_flag=True, help="Also tear down the network of a run that is still going.")
def down(name, force):
    """Remove cluster NAME and everything it made."""
    problems = testbed.down(name, force)
    if problems:
        click.echo("could not remove: " + "; ".join(problems), err=True)
        sys.exit(1)
    click.echo(f"removed {name}")


@main.command(name="calibrate")
@click.argument("name", required=False)
@network_options
@click.option("--seconds", default=3.0, show_default=True, help="Measured seconds per path (after a 1 s warm-up).")
@click.option("--tool", type=click.Choice(["auto", "iperf3", "builtin"]), default="auto", show_default=True,
              help="Throughput tool: iperf3 when installed, else the built-in TCP probe.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--results", "results_dir", default=flags.DEFAULTS["results_dir"], show_default=True, help="Results directory.")
def calibrate_(name, seconds, tool, as_json, results_dir, **network):
    """Measure throughput and RTT of every path of cluster NAME, or of a cluster built from the flags."""
    if name:
        state = testbed.ledger.find(name)
        cluster_id = state.run_id
        topo = RunSpec.from_json(state.meta["spec"]).network()
        paths = calibration.calibrate(topo, [testbed.namespaces_node(n) for n in state.meta["nodes"]],
                                      seconds=seconds, tool=tool)
    else:
        topo = _network_spec(**network).network()
        with testbed.scratch(topo, network["latency_impl"]) as net:
            cluster_id = net.prefix.removeprefix("gct-")
            paths = calibration.calibrate(topo, net.nodes, seconds=seconds, tool=tool)
    recorder = results.Recorder(results_dir, cluster_id)
    for p in paths:
        recorder.calibration(p.to_dict())
    recorder.close()
    if as_json:
        click.echo(json.dumps([p.to_dict() for p in paths], indent=2))
    else:
        table = Table(title=f"calibration of gct-{cluster_id}")
        for col in ("path", "tool", "target", "wire rate", "goodput", "target RTT", "RTT idle", "RTT loaded", ""):
            table.add_column(col)
        for p in paths:
            table.add_row(f"{p.src} -> {p.dst}", p.tool, format_rate(p.target_bps), _fmt(p.wire_bps, " Mbit/s", 1e6),
                          _fmt(p.goodput_bps, " Mbit/s", 1e6), _fmt(p.target_rtt_s, " ms", 1e-3),
                          _fmt(p.rtt_idle_s, " ms", 1e-3), _fmt(p.rtt_loaded_s, " ms", 1e-3), p.miss and "MISS" or "ok")
        Console().print(table)
    if any(p.miss for p in paths):
        click.echo("gctestbed: " + "; ".join(p.miss for p in paths if p.miss), err=True)
        sys.exit(1)


@main.command(name="compressors")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def compressors_(as_json):
    """List every compression method: collective, options with defaults, paper."""
    rows = compress.registry.describe()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="compressors (--compressor NAME:key=value,...)", show_lines=True)
    for col in ("name", "collective", "options (default)", "what", "paper"):
        table.add_column(col)
    for r in rows:
        opts = ", ".join(f"{o['name']}={o['default']}" for o in r["options"]) or "-"
        table.add_row(r["name"], r["collective"], opts, r["summary"], r["paper"] or "-")
    Console().print(table)


@main.command(name="verify")
@click.option("--compressor", multiple=True,
              help="Methods to check, separated by ';' or repeated, with options if wanted (default: all 17).")
@click.option("--nodes", default=2, show_default=True, help="Nodes of the job.")
@click.option("--bw", default="1gbit", show_default=True, help="Link rate of every node (tc units: mbit = bits/s).")
@click.option("--steps", default=verify_.STEPS, show_default=True, help="Training steps per method (the first two are not judged).")
@click.option("--results", "results_dir", default="results/verify", show_default=True, help="Results directory.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
def verify(compressor, nodes, bw, steps, results_dir, as_json):
    """Check every method against its paper's contract on a small shaped job beside 'none': exchanges
    per step, rounds and collectives, elements chosen, payload terms, and the interface counters.
    Exits 1 when any method breaks its contract."""
    methods = verify_.methods_from(compressor)
    if nodes < 2 or steps < 4:
        raise SpecError("--nodes must be at least 2 and --steps at least 4 (the first two steps are not judged).")
    parse_rate(bw)
    report = _bench_report("verify", lambda phase: verify_.run(methods, nodes, bw, steps, results_dir,
                                                             lambda m: phase(f"verify: {m}")),
                           verify_table, as_json, width=140)
    if not report["ok"]:
        rows = report["methods"] + ([report["none"]] if report["none"] not in report["methods"] else [])
        broken = [r["method"] for r in rows if not r["ok"]]
        click.echo(f"gctestbed: {len(broken)} method(s) broke their contract: {', '.join(broken)}", err=True)
        sys.exit(1)


def verify_table(report: dict) -> Table:
    judged = report["none"]["steps_judged"] if report["none"] else []
    table = Table(title=f"verify: {report['nodes']} nodes at {report['bw']}, {report['workload']} "
                        f"({report['model_numel']:,} parameters), "
                        + (f"steps {judged[0]}-{judged[-1]} judged" if judged else "no step judged")
                        + "; bytes per node per step")
    for col in ("method", "contract", "interface", "ratio to none", "exchanges", "collectives", "sent", "verdict"):
        table.add_column(col, justify="left" if col in ("method", "verdict") else "right")
    none_ex = report["none"]["exchanges_per_step"] if report["none"] else None
    for r in report["methods"]:
        exchanges = r["exchanges_per_step"]
        table.add_row(escape(r["method"]), verify_.fmt_bytes(r["contract_bytes"]), verify_.fmt_bytes(r["counters_bytes"]),
                      f"{r['ratio_to_none']:.3g}" if r["ratio_to_none"] else "-",
                      f"{exchanges:g} (none {none_ex:g})" if exchanges is not None and none_ex else "-",
                      f"{r['collectives_per_step']:g}" if r["collectives_per_step"] is not None else "-",
                      f"{100 * r['sent_fraction']:.3g}%" if r["sent_fraction"] is not None else "",
                      "[green]ok[/]" if r["ok"] else "[red]BROKEN[/]")
    for r in report["methods"]:
        for line in contracts.describe(r["problems"]):
            table.add_row(escape(f"{r['method']} broke {line}"), "", "", "", "", "", "", "")
    return table


@main.command(name="doctor")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def doctor_(as_json):
    """Check what this host can do: privileges, kernel features (tried, not guessed), tools, CUDA/NCCL."""
    checks = doctor.diagnose()
    if as_json:
        click.echo(json.dumps(doctor.to_json(checks), indent=2))
        return
    table = Table(title="gctestbed doctor")
    for col in ("", "check", "found", "without it", "to get it"):
        table.add_column(col)
    for c in checks:
        table.add_row("[green]ok[/]" if c.ok else "[red]--[/]", c.name, c.detail, "" if c.ok else c.disables,
                      "" if c.ok else c.fix)
    Console().print(table)


@main.group()
def bench():
    """Benchmarks: measure on this machine, print a table (or JSON)."""


@bench.command(name="net")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
@click.option("--seconds", default=3.0, show_default=True, help="Measured seconds per cell (after a 1.5 s warm-up).")
@click.option("--rates", default="10mbit,100mbit,500mbit,1gbit", show_default=True, help="Comma-separated rates.")
@click.option("--latencies", default="0,1ms,5ms,20ms", show_default=True, help="Comma-separated one-way latencies.")
def bench_net(as_json, seconds, rates, latencies):
    """Configured against measured throughput and RTT, and this host's ceilings."""
    from .bench import net as bench_net_
    rate_list = [parse_rate(r) for r in rates.split(",")]
    latency_list = [parse_duration(t) for t in latencies.split(",")]
    _bench_report("bench net", lambda phase: bench_net_.run(rate_list, latency_list, seconds, phase),
                  bench_net_table, as_json)


def _bench_report(title: str, measure, table, as_json: bool, width: int | None = None) -> dict:
    """Run a benchmark under a progress line (``measure(phase)`` reports its phases), then print
    its report as JSON or as ``table(report)``; the report."""
    with Progress(TextColumn("{task.description}"), console=console, transient=True) as bar:
        task = bar.add_task(title)
        report = measure(lambda text: bar.update(task, description=text))
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        Console(width=max(Console().width, width or 0)).print(table(report))
    return report


@bench.command(name="soak")
@click.option("--minutes", default=60.0, show_default=True, help="How long to keep starting runs.")
@click.option("--seed", default=0, show_default=True, help="Seed of the choice of faults.")
@click.option("--launchers", default="netns", show_default=True,
              help="Launchers to mix, comma-separated (netns, docker).")
@click.option("--results", "results_dir", default="results/soak", show_default=True, help="Results directory.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
def bench_soak(minutes, seed, launchers, results_dir, as_json):
    """Short runs with random faults for MINUTES; then what, if anything, was left behind."""
    from .bench import soak as soak_
    chosen = [x.strip() for x in launchers.split(",") if x.strip()]
    if not chosen or any(x not in LAUNCHERS for x in chosen) or minutes <= 0:
        raise SpecError(f"--launchers takes {', '.join(LAUNCHERS)} and --minutes a positive number.")
    for launcher in chosen:                  # refuse now, not after an hour of failed runs
        runner.cluster_class(RunSpec(nodes=1, link=LinkSpec(bw_bps=1), launcher=launcher)).check_host()
    if "docker" in chosen:
        from .launch import image
        image.needs_host_mounts(image.client(), image.tag(False))      # the node image must exist
    outcome = {}

    def measure(phase):
        outcome.update(soak_.run(minutes, results_dir, seed, chosen, phase))
        with open(os.path.join(results_dir, "soak.json"), "w") as f:
            json.dump(outcome, f, indent=2)
        return outcome

    _bench_report("bench soak", measure, soak_table, as_json)
    if outcome["leaks"] or outcome["unexpected"]:
        sys.exit(1)


def soak_table(report: dict) -> Table:
    table = Table(title=f"soak: {report['runs']} runs in {report['minutes']:g} min ({', '.join(report['launchers'])}); "
                        f"left behind: {len(report['leaks'])}; open files {report['fds_before']} -> {report['fds_after']}")
    for col in ("scenario", "runs", "as expected", "steps recorded"):
        table.add_column(col, justify="left" if col == "scenario" else "right")
    for r in report["scenarios"]:
        table.add_row(r["scenario"], str(r["runs"]), str(r["as_expected"]), str(r["steps"]))
    for r in report["unexpected"]:
        table.add_row(escape(f"UNEXPECTED {r['scenario']} run {r['run_id']}: exit {r['exit_code']}, {r['status']}, "
                             f"{r['note']} {r['error'] or ''}"[:400]), "", "", "")
    for leak in report["leaks"]:
        table.add_row(escape(f"LEFT BEHIND {leak}"[:400]), "", "", "")
    return table


@bench.command(name="kernels")
@click.option("--size", default=25_000_000, show_default=True, help="Elements of the synthetic gradient.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True, help="Where to run.")
@click.option("--payloads", default=4, show_default=True, help="Ranks' payloads each decoder sums.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
def bench_kernels(size, device, payloads, as_json):
    """Native kernels against the torch reference: time, speedup, GB/s and % of copy bandwidth."""
    from .bench import kernels as bench_kernels_
    if size < 1 or payloads < 1:
        raise SpecError("--size and --payloads must be at least 1.")
    _bench_report("bench kernels", lambda phase: bench_kernels_.run(size, device, payloads, phase),
                  bench_kernels_table, as_json, width=120)


def bench_kernels_table(report: dict) -> Table:
    table = Table(title=f"kernels on {report['machine']} ({report['device']}, {report['threads']} threads), "
                        f"{report['size']:,} elements; copy {report['copy_gbps']:.1f} GB/s (median of the rows' own)")
    for col in ("kernel", "native ms", "torch ms", "speedup", "GB/s", "copy GB/s", "% copy", "vs torch.topk"):
        table.add_column(col, justify="left" if col == "kernel" else "right")
    for r in report["rows"]:
        table.add_row(r["kernel"], f"{r['native_ms']:.2f}", f"{r['reference_ms']:.1f}", f"{r['speedup']:.1f}x",
                      f"{r['gbps']:.1f}", f"{r['copy_gbps']:.1f}", f"{r['pct_copy']:.0f}",
                      f"{r['vs_topk']:.1f}x" if "vs_topk" in r else "")
    return table


@main.command()
@click.option("--dev", required=True, help="The interface to shape, e.g. eth0 (a real NIC, or a container's).")
@click.option("--bw", required=True, help="Egress rate, in tc's units (mbit = bits/s, mbps = BYTES/s).")
@click.option("--latency", default="0", show_default=True, help="One-way delay added on egress (needs netem).")
@click.option("--jitter", default="0", show_default=True, help="Delay variation (needs netem).")
@click.option("--loss", default="0", show_default=True, help="Packet loss in percent (needs netem).")
@click.option("--force", is_flag=True, help="Replace a qdisc gctestbed did not make (unshape puts it back).")
def shape(dev, bw, latency, jitter, loss, force):
    """Shape the egress of interface DEV as a gctestbed link; 'gctestbed unshape' restores what was there."""
    from .launch.state import state_dir
    from .net import nic
    link = LinkSpec(bw_bps=parse_rate(bw), latency_s=parse_duration(latency), jitter_s=parse_duration(jitter, "--jitter"),
                    loss_pct=parse_percent(loss, "--loss"))
    link.validate()
    before = nic.shape(dev, Direction(link.bw_bps, link.latency_s, link.jitter_s, link.loss_pct), state_dir(), force)
    click.echo(f"shaped {dev}: {format_rate(link.bw_bps)}, latency {format_duration(link.latency_s)} "
               f"(saved its {before['kind'] or 'default'} qdisc for unshape)")


@main.command()
@click.option("--dev", required=True, help="The interface 'gctestbed shape' shaped.")
def unshape(dev):
    """Remove gctestbed's shaping from DEV and put back the qdisc it had before."""
    from .launch.state import state_dir
    from .net import nic
    before = nic.unshape(dev, state_dir())
    click.echo(f"unshaped {dev}: its {before['kind'] or 'default'} qdisc is back")


@main.command(name="node")
@click.option("--rdzv", required=True, help="HOST:PORT of torchrun's c10d rendezvous (the first node's address).")
@click.option("--nnodes", required=True, help="How many nodes join.")
@click.option("--dev", default=None, help="This host's interface to shape and to pin Gloo/NCCL to (e.g. eth0).")
@click.option("--bw", default=None, help="Shape --dev's egress to this rate (tc units); omitted: no shaping.")
@click.option("--latency", default=flags.DEFAULTS["latency"], show_default=True,
              help="One-way delay added on --dev's egress (needs netem), so a round trip between two such hosts is "
                   "twice this.")
@click.option("--jitter", default=flags.DEFAULTS["jitter"], show_default=True, help="Delay variation on --dev (needs netem).")
@click.option("--loss", default=flags.DEFAULTS["loss"], show_default=True, help="Packet loss on --dev, in percent (needs netem).")
@click.option("--force", is_flag=True, help="Replace a qdisc on --dev that gctestbed did not make (put back at exit).")
@training_options
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default=flags.DEFAULTS["backend"], show_default=True,
              help="nccl needs --device cuda; it is kept on --dev by socket transport.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=flags.DEFAULTS["device"], show_default=True,
              help="Where tensors live.")
@click.option("--run-id", default=None, help="The run's id, the same on every host (default: from --rdzv).")
def node_(rdzv, nnodes, dev, bw, latency, jitter, loss, force, compressor, kernel_mode, workload, mode, steps, batch_size,
          lr, seed, bucket_cap_mb, timeout, results_dir, backend, device, run_id):
    """Be one node of a multi-host run: shape --dev, join the rendezvous, train, unshape (see docs/clusters.md).
    The training flags and their defaults are run's."""
    from .launch import hosts
    if bw and not dev:
        raise SpecError("--bw shapes an interface: name it with --dev.")
    spec = flags.build_spec(nodes=nnodes, bw=bw or flags.DEFAULTS["bw"], latency=latency, jitter=jitter, loss=loss,
                            compressor=compressor, kernels=kernel_mode, workload=workload, mode=mode, steps=steps,
                            batch_size=batch_size, lr=lr, seed=seed, bucket_cap_mb=bucket_cap_mb, timeout=timeout,
                            results_dir=results_dir, calibrate=False, backend=backend, device=device,
                            run_id=run_id or hosts.default_run_id(rdzv))
    status = hosts.run_node(spec, rdzv, dev, shape=bool(bw), force=force)
    click.echo(f"node of run {spec.run_id}: torchrun exited with {status}" + ("" if dev is None or not bw else f"; {dev} unshaped"))
    sys.exit(0 if status == 0 else 1)


@main.command(name="compose")
@click.option("--nodes", default=2, show_default=True, help="Nodes (services node0..N-1).")
@click.option("--gpus", default=None, help="GPU of each node, e.g. 0,1,2,3 (default 0..N-1); one GPU per node.")
@click.option("-o", "--output", default=None, help="Write the file here instead of printing it.")
def compose_(nodes, gpus, output):
    """Write a docker-compose file for N nodes: gpu profile (NCCL, one GPU each) and cpu profile (Gloo)."""
    import yaml
    from .launch import compose
    try:
        data = compose.compose(nodes, gpus.split(",") if gpus else None)
    except ValueError as e:
        raise SpecError(f"{e}.") from None
    text = COMPOSE_HEADER + yaml.safe_dump(data, sort_keys=False, width=120)
    if output:
        with open(output, "w") as f:
            f.write(text)
        click.echo(f"wrote {output}: docker compose --profile gpu up (or --profile cpu)")
    else:
        click.echo(text, nl=False)


COMPOSE_HEADER = """# Written by 'gctestbed compose'. First 'gctestbed image build --gpu' (or without --gpu for the cpu
# profile), then: BW=100mbit COMPRESSOR=dgc docker compose --profile gpu up
# (or --profile cpu on machines without GPUs). Variables: BW, LATENCY, COMPRESSOR, WORKLOAD, STEPS, NODES.
"""


@main.group(name="image")
def image_group():
    """The gctestbed-node image the docker launcher runs."""


@image_group.command(name="build")
@click.option("--gpu", is_flag=True, help="The CUDA image (gctestbed/docker/Dockerfile.gpu) instead of the CPU one.")
@click.option("--offline/--online", default=None,
              help="Offline: an empty imported base that runs this host's Python through read-only mounts; online: "
                   "the Dockerfile. Default: online when the registry answers, else offline.")
def image_build(gpu, offline):
    """Build gctestbed-node:cpu (or :gpu) from gctestbed/docker/Dockerfile.*, or offline where no registry is reachable."""
    from .launch import image
    with console.status("building the image") as status:
        built = image.build(gpu=gpu, offline=offline, on_phase=lambda text: status.update(text))
    how = "offline: this host's Python, mounted read-only: " + ", ".join(built["host_mounts"]) if built["offline"] \
        else f"from gctestbed/docker/{image.DOCKERFILES[gpu]}"
    click.echo(f"built {built['tag']} ({how})")


@main.group(name="kernels")
def kernels_group():
    """The native compressor kernels."""


@kernels_group.command(name="build")
@click.option("--verbose", is_flag=True, help="Show the compiler's commands and output.")
def kernels_build(verbose):
    """Build (or find the cached build of) the native kernels now, rather than on first use."""
    from . import kernels
    start = time.monotonic()
    kernels.build(verbose=verbose)
    click.echo(f"native kernels ready for {kernels.built_for()} in {time.monotonic() - start:.1f} s ({kernels.build_dir()})")


@bench.command(name="convergence")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
@click.option("--nodes", default=2, show_default=True, help="Nodes (2 to 4 recommended on a small machine).")
@click.option("--steps", default=200, show_default=True, help="Training steps per method.")
@click.option("--methods", default=None,
              help="Semicolon-separated methods, each NAME or NAME:key=value,... (default: all, tuned as documented).")
@click.option("--results", "results_dir", default="results/convergence", show_default=True, help="Results directory.")
def bench_convergence(as_json, nodes, steps, methods, results_dir):
    """Train the same small task with every method: final loss, accuracy, steps to none's loss."""
    from .bench import convergence
    names = methods.split(";") if methods else compress.names()
    if "none" in names:
        names = ["none"] + [n for n in names if n != "none"]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("bench convergence", total=len(names))
        report = convergence.run(names, nodes, steps, results_dir,
                                 lambda m: bar.update(task, description=m, advance=1))
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    table = Table(title=f"bench convergence: {nodes} nodes, {steps} steps, mlp {report['workload']['mlp']}",
                  caption=f"steps to target: first step whose 10-step mean loss <= {_fmt(report['target_loss'], digits=4)}"
                          " (none's final x 1.05)")
    for col in ("method", "options", "final loss", "held-out loss", "accuracy", "vs none", "steps to target",
                "bytes vs none"):
        table.add_column(col, justify="right")
    for name, r in report["methods"].items():
        table.add_row(name, r["compressor"].partition(":")[2] or "-",
                      "diverged" if r["diverged"] else _fmt(r["final_loss"], digits=4),
                      _fmt(r["eval_loss"], digits=4), _fmt(r["eval_accuracy"] * 100 if r["eval_accuracy"] is not None else None, "%", digits=4),
                      _fmt(r.get("accuracy_vs_none", 0) * 100 if r.get("accuracy_vs_none") is not None else None, " pt", digits=2),
                      str(r.get("steps_to_target") or "never"), _fmt(r.get("bytes_vs_none"), "x", digits=3))
    Console().print(table)


def bench_net_table(report: dict) -> Table:
    floor, line0, ceiling = report["probe_floor"], report["delayline_0ms"], report["ceiling"]
    table = Table(title=f"bench net on {report['machine']['cpus']} x {report['machine']['cpu']}, "
                        f"kernel {report['machine']['kernel']}",
                  caption=f"probe RTT floor (unshaped veth) {floor['rtt_idle_s'] * 1e3:.3f} ms; delay line adds "
                          f"{line0['added_rtt_s'] * 1e3:.3f} ms at 0 ms; host ceiling {ceiling['veth_wire_bps'] / 1e9:.2f} "
                          f"Gbit/s on veth, {ceiling['delayline_wire_bps'] / 1e9:.2f} Gbit/s through the delay line")
    for col in ("rate", "latency", "delay by", "wire rate", "error", "goodput", "RTT target", "RTT idle",
                "excess", "excess - floor", "RTT loaded", "rate", "RTT"):
        table.add_column(col, justify="right")
    for c in report["cells"]:
        table.add_row(format_rate(c["rate_bps"]), format_duration(c["latency_s"]), c["impl"],
                      _fmt(c["wire_bps"], " Mbit/s", 1e6, 4), _fmt(c["rate_error"] * 100 if c["rate_error"] is not None else None, "%", 1, 2),
                      _fmt(c["goodput_bps"], " Mbit/s", 1e6, 4), f"{c['rtt_target_s'] * 1e3:g} ms",
                      _fmt(c["rtt_idle_s"], " ms", 1e-3, 4), _fmt(c["rtt_excess_s"], " ms", 1e-3, 2),
                      _fmt(c["rtt_excess_over_floor_s"], " ms", 1e-3, 2),
                      _fmt(c["rtt_loaded_s"], " ms", 1e-3, 4), "ok" if c["rate_ok"] else "MISS",
                      "ok" if c["rtt_ok"] else ("ok-floor" if c["rtt_ok_over_floor"] else "MISS"))
    return table


def _fmt(value, unit: str = "", scale: float = 1.0, digits: int = 3) -> str:
    """``digits`` significant digits, never in exponent form (1000, not 1e+03)."""
    if value is None:
        return "-"
    v = value / scale
    text = f"{v:.0f}" if abs(v) >= 10 ** digits else f"{v:.{digits}g}"
    if "e" in text:
        text = f"{v:.{digits}f}".rstrip("0").rstrip(".")
    return f"{text}{unit}"


def _print_summary(s: dict) -> None:
    table = Table(title=f"run {s['run_id']}  [{s['status']}]", show_header=False)
    rows = [
        ("compressor", f"{s['compressor']} ({s['kernels']} kernels)" if compress.get(s["compressor"]).has_kernels
         else s["compressor"]), ("workload", s["workload"]),
        ("nodes", str(s["nodes"])),
        ("link", f"topology {s['topology']} (see its calibration)" if s.get("topology")
         else f"{format_rate(s['bw_bps'])}, latency {format_duration(s['latency_s'])}"),
        ("steps recorded", f"{s['steps_recorded']} / {s['steps']}"),
        ("median step", _fmt(s["median_step_s"], " s")),
        ("  compute (fwd+bwd, incl. waiting on comm)", _fmt(s["median_compute_s"], " s")),
        ("  communication span", _fmt(s["median_comm_s"], " s")),
        ("samples/s", _fmt(s["samples_per_s"])),
        ("payload per step (accounting)", _fmt(s["payload_bytes_per_step"], " MB", 1e6)),
        ("sent per node per step (eth0)", _fmt(s["wire_bytes_per_step"], " MB", 1e6)),
        ("buckets exchanged per step", _fmt(s["buckets_per_step"], digits=3)),
        ("all-reduce bus bandwidth", _fmt(s["busbw_bps"], " Mbit/s", 1e6)
         + (f"  ({s['busbw_fraction_of_link']:.1%} of link)" if s["busbw_fraction_of_link"] else "")),
        ("final loss", _fmt(s["final_loss"], digits=5)),
        ("replicas bit-identical", {True: "yes", False: "NO", None: "-"}[s["params_identical"]]),
    ]
    if s.get("sent_fraction") is not None:
        rows.append(("elements sent", f"{s['sent_fraction']:.3%} of the gradient (median step)"))
    if s.get("contract"):
        c = s["contract"]
        verdict = "kept" if c["ok"] else "BROKEN: " + "; ".join(contracts.describe(c["problems"], limit=2))
        rows.append(("contract (gctestbed verify)", f"{_fmt(c['contract_wire_bytes'], ' MB', 1e6)} per node per step "
                     f"against {_fmt(c['counters_bytes'], ' MB', 1e6)} counted (steps {c['steps_judged'][0]}-"
                     f"{c['steps_judged'][-1]}): {verdict}" if c["steps_judged"] else f"no step judged: {verdict}"))
    if s.get("latency_impl") not in (None, "none"):
        rows.append(("delay made by", s["latency_impl"]))
    for c in s.get("calibration", []):
        rows.append((f"calibration {c['src']} -> {c['dst']} ({c['tool']})",
                     f"{_fmt(c['wire_bps'], ' Mbit/s', 1e6)} of {c['target_bps'] / 1e6:g}, RTT {_fmt(c['rtt_idle_s'], ' ms', 1e-3)}"
                     f" idle / {_fmt(c['rtt_loaded_s'], ' ms', 1e-3)} loaded" + ("  MISSED" if c["miss"] else "")))
    for f in s.get("faults", []):
        if f["started"] is None:
            effect = "never started (the run ended first)"
        elif not f["steps"]:
            effect = "no step ran while it was on"
        else:
            span = f"step {f['steps'][0]}" if len(f["steps"]) == 1 else f"steps {f['steps'][0]}-{f['steps'][-1]}"
            effect = (f"{span}: median step {_fmt(f['median_step_s_during'], ' s')} "
                      f"(other steps {_fmt(f['median_step_s_outside'], ' s')})")
        rows.append((f"fault {f['fault']}", effect))
    if s["error"]:
        rows.append(("error", s["error"]))
    for k, v in rows:
        table.add_row(escape(k), escape(v))         # workers' errors quote C++ paths in [brackets]
    Console().print(table)


if __name__ == "__main__":
    main()
