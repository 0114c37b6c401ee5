"""gctestbed bench: measure on this machine, print a table (or JSON)."""

from __future__ import annotations

import json
import os
import sys

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from .. import flags
from ..spec import SpecError, parse_duration, parse_rate

from . import console, main
from .render import bench_kernels_table, bench_net_table, bench_report, convergence_table, scale_table, soak_table


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
    from ..bench import net as bench_net_
    rate_list = [parse_rate(r) for r in rates.split(",")]
    latency_list = [parse_duration(t) for t in latencies.split(",")]
    bench_report("bench net", lambda phase: bench_net_.run(rate_list, latency_list, seconds, phase),
                  bench_net_table, as_json)


@bench.command(name="scale")
@click.option("--nodes", default="2,4,8,16,32,64", show_default=True, help="Node counts, comma-separated.")
@click.option("--bw", default="1gbit", show_default=True, help="Every link's rate.")
@click.option("--steps", default=5, show_default=True, help="Training steps per run.")
@click.option("--cpus-per-node", default="0", show_default=True, metavar="X",
              help="Hold every node to X CPUs (see run); 0: the nodes share the host's cores freely.")
@click.option("--workload", default=None, help="The job (default: a 340 kB mlp, so the bench times gctestbed itself).")
@click.option("--results", "results_dir", default="results/scale", show_default=True, help="Results directory.")
@click.option("--fresh-nodes", is_flag=True,
              help="Start an interpreter per node on a network of each run's own (default: fork every worker from one "
                   "server on one kept network, as a sweep does).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
def bench_scale(nodes, bw, steps, cpus_per_node, workload, results_dir, fresh_nodes, as_json):
    """One small run on each node count: fixed cost, memory per node, step time, bus bandwidth."""
    from ..bench import scale as scale_
    counts = flags.node_counts("--nodes", nodes)
    report = bench_report("bench scale", lambda phase: scale_.run(counts, bw, steps, cpus_per_node, workload or scale_.WORKLOAD,
                                                                  results_dir, phase, fresh=fresh_nodes),
                          scale_table, as_json, width=150)
    if any(r["status"] != "ok" for r in report["rows"]):
        sys.exit(1)


@bench.command(name="soak")
@click.option("--minutes", default=60.0, show_default=True, help="How long to keep starting runs.")
@click.option("--seed", default=0, show_default=True, help="Seed of the choice of faults.")
@click.option("--launchers", default="netns", show_default=True,
              help="Launchers to mix, comma-separated (netns, docker).")
@click.option("--results", "results_dir", default="results/soak", show_default=True, help="Results directory.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
def bench_soak(minutes, seed, launchers, results_dir, as_json):
    """Short runs with random faults for MINUTES; then what, if anything, was left behind."""
    from ..bench import soak as soak_
    chosen = soak_.check_launchers(launchers, minutes)
    outcome = {}

    def measure(phase):
        outcome.update(soak_.run(minutes, results_dir, seed, chosen, phase))
        with open(os.path.join(results_dir, "soak.json"), "w") as f:
            json.dump(outcome, f, indent=2)
        return outcome

    bench_report("bench soak", measure, soak_table, as_json)
    if outcome["leaks"] or outcome["unexpected"]:
        sys.exit(1)


@bench.command(name="kernels")
@click.option("--size", default=25_000_000, show_default=True, help="Elements of the synthetic gradient.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True, help="Where to run.")
@click.option("--payloads", default=4, show_default=True, help="Ranks' payloads each decoder sums.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
def bench_kernels(size, device, payloads, as_json):
    """Native kernels against the torch reference: time, speedup, GB/s and % of copy bandwidth."""
    from ..bench import kernels as bench_kernels_
    if size < 1 or payloads < 1:
        raise SpecError("--size and --payloads must be at least 1.")
    bench_report("bench kernels", lambda phase: bench_kernels_.run(size, device, payloads, phase),
                  bench_kernels_table, as_json, width=120)


@bench.command(name="convergence")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
@click.option("--nodes", default=2, show_default=True, help="Nodes (2 to 4 recommended on a small machine).")
@click.option("--steps", default=200, show_default=True, help="Training steps per method.")
@click.option("--methods", default=None,
              help="Semicolon-separated methods, each NAME or NAME:key=value,... (default: all, tuned as documented).")
@click.option("--workload", default=None, help="The task, as for run (default: a small mlp teacher task; e.g. "
                                               "resnet18:scale=0.125,image=32,classes=10,data=digits for real images).")
@click.option("--optimizer", default="sgd", show_default=True, help="sgd, adam or adamw with options, as for run; "
                                                                     "methods with momentum inside are left out of adam runs.")
@click.option("--lr", default=0.05, show_default=True, help="The optimizer's learning rate.")
@click.option("--batch-size", default=64, show_default=True, help="Samples per node per step.")
@click.option("--baseline", type=click.Choice(["none", "fp16", "bf16"]), default="none", show_default=True,
              help="The method the others are compared with (its final loss sets the target).")
@click.option("--results", "results_dir", default="results/convergence", show_default=True, help="Results directory.")
def bench_convergence(as_json, nodes, steps, methods, workload, optimizer, lr, batch_size, baseline, results_dir):
    """Train the same small task with every method: final loss, accuracy, steps to the baseline's loss."""
    from ..bench import convergence
    from .. import compress
    names = methods.split(";") if methods else compress.names()
    if baseline not in names:
        names.append(baseline)
    names = [baseline] + [n for n in names if n != baseline]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("bench convergence", total=len(names))
        report = convergence.run(names, nodes, steps, results_dir,
                                 lambda m: bar.update(task, description=m, advance=1), workload, optimizer, lr,
                                 batch_size, baseline)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    Console().print(convergence_table(report, nodes, steps))

