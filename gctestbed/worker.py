"""One node's training loop: ``python -m gctestbed.worker SPEC.json`` inside the node.

The node environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) says who this node is; the RunSpec
says everything else. Each step is timed, its interface counters read, and committed to the
results store before the next begins, so a node that dies loses nothing it had recorded.
"""

from __future__ import annotations

import contextlib
import copy
import faulthandler
import hashlib
import inspect
import json
import os
import re
import resource
import sys
import time
from datetime import timedelta
from typing import Callable, NoReturn

import psutil
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from . import compress, optimizers, tracefile, workloads
from .comm import local, ps, server
from .compress import hook, recorded
from . import results
from .results import Recorder
from .spec import RunSpec
from .timing import Laps, thread_cpu


GATHER_ENV = "GCTESTBED_GATHER"     # set by 'gctestbed node': each host has its own store


def nic_bytes(ifname: str) -> tuple[int, int]:
    """(sent, received) bytes on ``ifname``; /proc/net/dev shows this node's own namespace, so
    these counters prove the traffic crossed the shaped link."""
    c = psutil.net_io_counters(pernic=True)[ifname]
    return c.bytes_sent, c.bytes_recv


def local_buffers() -> dict[str, bool]:
    """DDP's option that keeps each rank's buffers its own, not sent from rank 0 before every
    forward: forward_sync_buffers where this torch has it (it deprecates broadcast_buffers, with a
    warning however it is set), else broadcast_buffers."""
    new = "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    return {"forward_sync_buffers" if new else "broadcast_buffers": False}


def buffer_record(model: DDP) -> str:
    """The model's buffers (``[name, shape, dtype]``) and whether DDP sent rank 0's before every
    forward, as JSON for the node's row: what a trace of the run needs so a replay sends what it
    sent, read from the wrapped model itself (a user's own model included)."""
    sync = getattr(model, "forward_sync_buffers", getattr(model, "broadcast_buffers", True))
    buffers = tracefile.buffer_layout(model.module.named_buffers(), getattr(model, "parameters_to_ignore", ()))  # DDP sends none of these
    return json.dumps({"broadcast": bool(sync), "buffers": buffers})


class ByteWindow:
    """The interface's bytes (sent, received) since the last take. Each window starts where the last
    one ended, so a tail that drains between two steps (the store's write, an evaluation) lands in
    the next step's window, not nowhere; the first starts when the window is made, after the model
    was wrapped (DDP's first broadcast of the parameters is in no step)."""

    def __init__(self, ifname: str):
        self.ifname, self.last = ifname, nic_bytes(ifname)

    def take(self) -> tuple[int, int]:
        tx, rx = nic_bytes(self.ifname)
        sent, received = tx - self.last[0], rx - self.last[1]
        self.last = tx, rx
        return sent, received


def param_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's bytes: equal digests mean bit-identical replicas."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def forward_backward(model: DDP, loss_fn, x: torch.Tensor, y: torch.Tensor, parts: int,
                     cuda: bool = False) -> tuple[torch.Tensor, Callable[[], float]]:
    """One step's gradient, from ``parts`` micro-batches when a method needs their statistics,
    with one gradient exchange per step whatever ``parts`` is. DDP decides in the forward whether
    the next backward synchronises, so every micro-batch but the last runs forward *and* backward
    inside ``no_sync``; a forward outside it would make each backward exchange its buckets (each
    from one micro-batch). Returns the batch's mean loss and what gives the seconds its forward
    passes took, each from where the wrapped module's forward began (after DDP's own preparation,
    its buffer broadcast: the origin of the hook's ready times) to its loss. On a GPU those are
    CUDA events, read once the step's work is done (call it after synchronising), so the forward
    is timed without stopping the GPU between forward and backward."""
    def mark():
        if not cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    xs, ys = x.chunk(parts), y.chunk(parts)
    total, spans = 0.0, []
    handle = getattr(model, "module", model).register_forward_pre_hook(lambda m, a: spans.append([mark(), None]))
    try:
        for i, (xi, yi) in enumerate(zip(xs, ys)):
            last = i + 1 == len(xs)
            with contextlib.nullcontext() if last else model.no_sync():
                loss = loss_fn(model(xi), yi) / len(xs)
                spans[-1][1] = mark()
                loss.backward()
            total = total + loss.detach()
    finally:
        handle.remove()
    if cuda:
        return total, lambda: sum(a.elapsed_time(b) for a, b in spans) / 1e3
    return total, lambda: sum(b - a for a, b in spans)


def exchange_failed(error: BaseException, rank: int, step: int) -> str:
    """The node log's last line when a bucket's exchange failed: bad gradients, or a collective that
    timed out or lost its connection (Gloo's ``[file.cc:N]`` prefix dropped)."""
    if isinstance(error, hook.NonFiniteGradient):
        return f"gctestbed: {error}"
    text = re.sub(r"^\[[^\]]*\]\s*", "", " ".join(str(error).split()))
    return f"gctestbed: rank {rank} step {step}: the gradient exchange failed: {text}"


def evaluate(work: workloads.Workload, model: torch.nn.Module, device: torch.device, recorder: Recorder | None,
             after: int) -> dict:
    """The workload's held-out figures after ``after`` steps, stored by rank 0. Every rank
    evaluates (its replica is identical), outside the timed laps, so none waits for another at
    the next step's exchange and no step time carries an evaluation."""
    metrics = work.evaluate(model if device.type == "cpu" else copy.deepcopy(model).cpu())
    if recorder is not None:
        recorder.evaluation(after, metrics["loss"], metrics["accuracy"], metrics.get("samples"))
    return metrics


def train(spec: RunSpec, rank: int, world: int, ifname: str) -> None:
    if not dist.is_initialized():       # 'gctestbed node' calibrated first, in this process group
        dist.init_process_group(spec.backend, rank=rank, world_size=world, timeout=timedelta(seconds=spec.timeout_s))
    workers = dist.new_group(list(range(spec.nodes))) if spec.servers else None    # every rank takes part
    recorder = Recorder(spec.results_dir, spec.run_id)
    if rank >= spec.nodes:              # a parameter server
        server.serve(spec, rank, recorder, lambda: nic_bytes(ifname))
        finish(spec, recorder, rank, world)
    work = workloads.build(spec.workload, spec.workload_options, spec.seed, rank, spec.batch_size, spec.nodes)
    serial = spec.mode == "serial"
    device = torch.device("cpu")
    if spec.device == "cuda":                    # one GPU per node: as told ('gctestbed node'), else by rank
        device = torch.device("cuda", int(os.environ.get("GCTESTBED_CUDA_DEVICE", rank % torch.cuda.device_count())))
        torch.cuda.set_device(device)
    model = DDP(work.model.to(device), bucket_cap_mb=spec.bucket_cap_mb, gradient_as_bucket_view=serial,
                **({} if work.broadcast_buffers else local_buffers()),
                device_ids=[device.index] if device.type == "cuda" else None, process_group=workers)
    compressor = compress.for_run(spec)
    if work.codec:                               # a replay's recorded payloads stand in for the method's
        compressor = recorded.for_run(compressor, work.codec, spec)
    averaging = local.averaging(spec, list(model.parameters()))
    exchange = ps.ServerExchange(spec, [n for n, _ in model.named_parameters()]) if spec.servers else averaging and averaging.exchange()
    comm = hook.install(model, compressor, process_group=workers, serial=serial, exchange=exchange)
    optimizer = optimizers.build(spec.optimizer, spec.optimizer_options, model.parameters(), spec.lr,
                                 compressor.momentum_inside, spec.compressor)
    schedule = optimizers.warmup(optimizer, spec.optimizer_options, spec.nodes)
    if work.optimizer:                           # a replay's recorded optimizer times stand in for the update
        optimizer = work.optimizer(optimizer)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)   # GPU work ends before a lap
    window = ByteWindow(ifname)
    for step in range(spec.steps):
        x, y = (t.to(device, non_blocking=True) for t in next(work.batches))
        laps = Laps()
        try:
            if compressor.reads_batch:   # variance: every sample's gradient, before backward sends a bucket
                compressor.observe(model.module, work.loss_fn, x, y)
            loss, forward_time = forward_backward(model, work.loss_fn, x, y, compressor.microbatches, device.type == "cuda")
            sync()
            compute_s, forward_s = laps.lap(), forward_time()
        except RuntimeError:             # DDP re-raises the hook's failure, garbled: report the hook's own
            if comm.failure is None:
                raise
            fail(exchange_failed(comm.failure, rank, step))
        try:
            comm.exchange_pending()      # serial mode: every bucket now, each phase timed; overlap: nothing left
        except RuntimeError as e:
            fail(exchange_failed(e, rank, step))
        sync()
        exchange_s = laps.lap()
        optim_cpu = thread_cpu() if device.type == "cpu" else None     # what the update took of this thread's CPU
        if not work.optimizer:           # (a replay's recorded optimizer time holds the clipping's)
            optimizers.clip(model.parameters(), spec.optimizer_options, compressor.clips_locally)
        optimizer.step()
        if schedule is not None:
            schedule.step()
        optimizer.zero_grad(set_to_none=not serial)     # serial: grads stay views of the buckets
        sync()
        optim_s = laps.lap()
        optim_cpu_s = None if optim_cpu is None else thread_cpu() - optim_cpu
        stats = comm.take_step_stats()
        if work.step_stats:              # what the workload measured of its own step (a replay: how late)
            stats.update(work.step_stats())
        if averaging is not None:        # local SGD, DiLoCo: the model averaged now and then
            for key, value in averaging.after_step(step).items():
                stats[key] = stats.get(key, 0) + value
        tx, rx = window.take()
        recorder.step(rank, step, step_s=compute_s + exchange_s + optim_s + stats.get("sync_s", 0.0),
                      compute_s=compute_s, forward_s=forward_s, optim_s=optim_s, optim_cpu_s=optim_cpu_s, loss=loss.item(), tx_bytes=tx, rx_bytes=rx,
                      **stats)
        if spec.eval_every and (step + 1) % spec.eval_every == 0 and step + 1 < spec.steps:
            evaluate(work, model.module, device, recorder if rank == 0 else None, step + 1)
    if spec.servers:
        ps.goodbye(spec)
    metrics = evaluate(work, model.module.cpu(), torch.device("cpu"), recorder if rank == 0 else None, spec.steps)
    recorder.node(rank, param_sha256=param_digest(model), eval_loss=metrics["loss"], eval_accuracy=metrics["accuracy"],
                  eval_samples=metrics.get("samples"), buffers=buffer_record(model))
    finish(spec, recorder, rank, world)


def finish(spec: RunSpec, recorder: Recorder, rank: int, world: int) -> NoReturn:
    """The node's CPU time against its wall time (so contention for cores shows); hosts with
    stores of their own send every row to rank 0's; then every rank meets once more and the
    process ends at once, its store closed and its output flushed.

    Not by destroying the process group and returning: a Gloo work of the last collective may
    still be releasing its Python tensors in one of Gloo's threads. Destroying the group joins
    those threads while holding the GIL the thread waits for (a hang), and interpreter shutdown
    ends the thread inside C++ (SIGABRT, "terminate called without an active exception";
    pytorch/pytorch#56297, #190489). The abort was caught here in a core dump of a finished
    two-host run; in CI the same run's other host then hung. After the last barrier every rank
    has all it needs from the others, so nothing is lost by leaving at once."""
    me = psutil.Process()
    cpu, memory = me.cpu_times(), me.memory_full_info()
    recorder.node(rank, role="server" if rank >= spec.nodes else "worker", wall_s=time.time() - me.create_time(),
                  cpu_s=cpu.user + cpu.system + cpu.children_user + cpu.children_system,
                  rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, pss_bytes=memory.pss, uss_bytes=memory.uss)
    if os.environ.get(GATHER_ENV) == "1" and world > 1:
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(results.export_rank(recorder.conn, spec.run_id, rank), gathered, dst=0)
        if rank == 0:
            results.import_rows(recorder.conn, [g for g in gathered if g])
    recorder.close()
    leave(0)


def leave(code: int) -> NoReturn:
    """Meet every rank once more, then end this process with ``code`` at once (see finish)."""
    dist.barrier()
    _end(code)


def fail(line: str) -> NoReturn:
    """End this node at once with ``line`` as its log's last line and exit code 1, without meeting
    the others: a node that failed must not wait for its peers. Not by interpreter shutdown either,
    for the reason in finish (a collective of this step may still be in Gloo's threads); a
    precaution, as finish's is: no run here was measured slower for it. Every row already stored
    is committed."""
    print(line, file=sys.stderr)
    _end(1)


def _end(code: int) -> NoReturn:
    """The process ends here, its output flushed, without interpreter shutdown (see finish)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    faulthandler.enable()         # a node that aborts in C++ (Gloo, NCCL) leaves its Python stack in its log
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = RunSpec.from_json(f.read())
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    try:
        train(spec, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ.get("GCTESTBED_IFNAME", "eth0"))
    except results.StoreError as e:          # disk full, store locked or damaged: one line, the log's last
        fail(f"gctestbed: rank {os.environ['RANK']}: {e}")


if __name__ == "__main__":
    main()
