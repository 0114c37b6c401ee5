"""Beyond one host and its images: node, compose, image build, kernels build."""

from __future__ import annotations

import os
import signal
import sys
import time

import click

from .. import flags
from ..spec import SpecError

from . import console, main
from .options import calibration_options, training_options


@main.command(name="node")
@click.option("--rdzv", required=True, help="HOST:PORT of torchrun's c10d rendezvous (the first node's address).")
@click.option("--nnodes", required=True, help="How many workers join (with --comm ps:servers=K, K more hosts join: the last ranks serve).")
@click.option("--dev", default=None, help="This host's interface to shape and to pin Gloo/NCCL to (e.g. eth0).")
@click.option("--bw", default=None, help="Shape --dev's egress to this rate (tc units); omitted: no shaping.")
@click.option("--latency", default=flags.DEFAULTS["latency"], show_default=True,
              help="One-way delay added on --dev's egress (needs netem), so a round trip between two such hosts is "
                   "twice this.")
@click.option("--jitter", default=flags.DEFAULTS["jitter"], show_default=True, help="Delay variation on --dev (needs netem).")
@click.option("--loss", default=flags.DEFAULTS["loss"], show_default=True, help="Packet loss on --dev, in percent (needs netem).")
@click.option("--force", is_flag=True, help="Replace a qdisc on --dev that gctestbed did not make (put back at exit).")
@calibration_options
@training_options
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default=flags.DEFAULTS["backend"], show_default=True,
              help="nccl needs --device cuda; it is kept on --dev by socket transport.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=flags.DEFAULTS["device"], show_default=True,
              help="Where tensors live.")
@click.option("--run-id", default=None, help="The run's id, the same on every host (default: from --rdzv).")
def node_(rdzv, nnodes, dev, bw, latency, jitter, loss, force, calibrate, accept_miss, compressor, kernel_mode, workload,
          mode, steps, batch_size, optimizer, lr, comm, eval_every, seed, bucket_cap_mb, timeout, results_dir, backend,
          device, run_id):
    """Be one node of a multi-host run: shape --dev, join the rendezvous, train, unshape (see docs/clusters.md).
    The training flags and their defaults are run's; '{host}' in --results is this host's name."""
    from ..launch import hosts
    signal.signal(signal.SIGTERM, _interrupt)     # a scheduler ending the job (scancel, srun) still gets the NIC back
    results_dir = results_dir.replace("{host}", os.uname().nodename)     # one store per host under a shared directory
    if bw and not dev:
        raise SpecError("--bw shapes an interface: name it with --dev.")
    spec = flags.build_spec(nodes=nnodes, bw=bw or flags.DEFAULTS["bw"], latency=latency, jitter=jitter, loss=loss,
                            compressor=compressor, kernels=kernel_mode, workload=workload, mode=mode, steps=steps,
                            batch_size=batch_size, optimizer=optimizer, lr=lr, eval_every=eval_every, seed=seed,
                            bucket_cap_mb=bucket_cap_mb, timeout=timeout, comm=comm,
                            results_dir=results_dir, calibrate=calibrate, accept_miss=accept_miss, backend=backend,
                            device=device, run_id=run_id or hosts.default_run_id(rdzv))
    status, error = hosts.run_node(spec, rdzv, dev, shape=bool(bw), force=force)
    click.echo(f"node of run {spec.run_id}: exited with {status}" + ("" if dev is None or not bw else f"; {dev} unshaped"))
    if error:
        click.echo(f"gctestbed: node of run {spec.run_id} failed: {error}", err=True)
    sys.exit(0 if status == 0 and error is None else 1)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


@main.command(name="compose")
@click.option("--nodes", default=2, show_default=True, help="Nodes (services node0..N-1).")
@click.option("--gpus", default=None, help="GPU of each node, e.g. 0,1,2,3 (default 0..N-1); one GPU per node.")
@click.option("-o", "--output", default=None, help="Write the file here instead of printing it.")
def compose_(nodes, gpus, output):
    """Write a docker-compose file for N nodes: gpu profile (NCCL, one GPU each) and cpu profile (Gloo)."""
    import yaml
    from ..launch import compose
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
    from ..launch import image
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
    from .. import kernels
    start = time.monotonic()
    kernels.build(verbose=verbose)
    click.echo(f"native kernels ready for {kernels.built_for()} in {time.monotonic() - start:.1f} s ({kernels.build_dir()})")

