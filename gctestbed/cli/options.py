"""The flags several commands share, with the defaults of flags.DEFAULTS."""

from __future__ import annotations


import click

from .. import flags
from ..spec import KERNEL_MODES, MAX_NODES, TIMING_MODES


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
                 help="Built-in workload and options (mlp, cnn, lstm, transformer, and the sources' own architectures alexnet, vgg16, "
                      "resnet18, resnet50, gpt2 with scale=, image=, data=synthetic|digits; e.g. mlp:width=512,depth=3), or your "
                      "own as pkg.module:function, called as function(rank, world, batch_size, seed) and returning "
                      "(model, batches, loss_fn[, evaluate])."),
    click.option("--mode", type=click.Choice(TIMING_MODES), default=flags.DEFAULTS["mode"], show_default=True,
                 help="overlap: communicate in DDP's hook during backward (production); serial: after backward, "
                      "compress, communicate, decompress, each phase timed."),
    click.option("--steps", default=flags.DEFAULTS["steps"], show_default=True, help="Training steps (with -- CMD: the steps expected, for progress)."),
    click.option("--batch-size", default=flags.DEFAULTS["batch_size"], show_default=True, help="Samples per node per step."),
    click.option("--optimizer", default=flags.DEFAULTS["optimizer"], show_default=True,
                 help="sgd, adam or adamw, with options as NAME:key=value,... (sgd: momentum=0.9, weight_decay, "
                      "nesterov; adam/adamw: beta1, beta2, eps, weight_decay). A method that applies momentum "
                      "itself (dgc, signum) runs with SGD, its momentum off."),
    click.option("--lr", default=flags.DEFAULTS["lr"], show_default=True, help="The optimizer's learning rate."),
    click.option("--comm", default=flags.DEFAULTS["comm"], show_default=True,
                 help="How workers meet: allreduce (the ring), ps[:servers=K,pull=dense|compressed] (K parameter-server "
                      "nodes join the network), localsgd[:period=H,warmup=S] or diloco[:inner=H,outer_lr=0.7,"
                      "outer_momentum=0.9] (local steps, the model averaged every H). See docs/running.md."),
    click.option("--eval-every", default=flags.DEFAULTS["eval_every"], show_default=True,
                 help="Evaluate on held-out data every N steps, for time to accuracy (0: once, after the last step)."),
    click.option("--seed", default=flags.DEFAULTS["seed"], show_default=True, help="Seed of the model, the teacher and the data."),
    click.option("--bucket-cap-mb", default=flags.DEFAULTS["bucket_cap_mb"], show_default=True, help="DDP bucket size in MB."),
    click.option("--timeout", default=flags.DEFAULTS["timeout"], show_default=True,
                 help="Collective timeout: a node silent this long fails the run (and is named as hung)."),
    click.option("--results", "results_dir", default=flags.DEFAULTS["results_dir"], show_default=True, help="Results directory (one SQLite store)."),
]



def calibration_options(f):
    """--calibrate/--no-calibrate and --accept-miss, shared by run and node."""
    f = click.option("--accept-miss", is_flag=True, help="Train even when calibration misses (the run is marked as such).")(f)
    return click.option("--calibrate/--no-calibrate", default=True, show_default=True,
                        help="Measure every link before training and stop if one misses its target by more than 10 % "
                             "(node: its shaped --dev, against the other hosts').")(f)


def cpus_option(f):
    """--cpus-per-node, shared by run and sweep."""
    return click.option("--cpus-per-node", default=flags.DEFAULTS["cpus_per_node"], show_default=True, metavar="X",
                        help="Hold every node to X CPUs (e.g. 0.5) with a cgroup each, so nodes that outnumber cores "
                             "share them equally and step times do not depend on the scheduler; 0: no cap.")(f)


def dilate_option(f):
    """--dilate, shared by run and sweep."""
    return click.option("--dilate", default=flags.DEFAULTS["dilate"], show_default=True, metavar="K",
                        help="Time dilation for a replay (--workload replay:trace=FILE): links shaped at their rate / K "
                             "with delays x K, the trace's compute x K, and every time and rate the run reports in "
                             "emulated units (times / K, rates x K), so this host emulates links K times faster than "
                             "it can drive. A sweep takes several, comma-separated (128,256): every cell at each K, "
                             "which the report's dilation test compares. See docs/replay.md.")(f)
