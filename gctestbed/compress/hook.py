"""The one adapter that turns any Compressor into a DDP communication hook.

Installed with ``register_comm_hook``, compression runs per bucket as soon as the bucket's
gradients are ready, so it overlaps with the rest of backward exactly as production DDP does,
and any model wrapped in DDP can use it.

Every collective is issued by one driver thread per process, bucket after bucket in the order
DDP hands them over (the same on every rank): collectives are matched across ranks by the order
they are issued, and issuing them from completion callbacks — which run on the backend's own
threads, in whatever order buckets finish — would pair one rank's gather of bucket 0 with
another's of bucket 1. The hook only enqueues and returns a future, so backward goes on. A
single-round method whose payload is only summed keeps its all-reduce asynchronous; anything
that needs a further collective waits for it in the driver, never on a backend thread.

The state object, like PyTorch's PowerSGDState, counts what each step cost: payload bytes (and
the part of them that is gathered), the bytes the collectives transmit, the collectives issued,
buckets, encode and decode time, and the communication time. On a GPU those times are the GPU's
(CUDA events around the work, read when the step closes): the CPU only queues kernels and
NCCL's collectives, so its clock would time the queueing. When the hook got a bucket, and when
a bucket's exchange began and ended on the step's clock, stay the CPU's moments.

Two timing modes. ``overlap`` is the above: production DDP, where the communication time is the
span from the first bucket's launch to the last one's completion. ``serial`` lets backward finish
with no communication at all (the hook hands each bucket back untouched and keeps it), then
``exchange_pending`` compresses, communicates and decompresses bucket after bucket, so each phase
is timed on its own and the communication time is the sum of the collectives' own durations: the
phase breakdown the performance model is fitted on. Serial mode needs DDP's
``gradient_as_bucket_view`` so that writing a bucket after backward writes the gradients.
"""

import queue
import threading
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..timing import Moment, Span, cpu_seconds, now, seconds
from . import collectives
from ..spec import DENSE_FLOOR
from .base import Bucket, Compressor, Payload
from .dense import NoCompression

PLAIN = NoCompression()       # what buckets under the dense floor use




class HookState:
    """A compressor, the process group it talks over, the step, and the counters of a step.

    Decoding runs on the communication thread when a collective completes, so the counters are
    guarded by a lock. ``step`` counts the steps closed by ``take_step_stats``: the caller that
    records a step closes it, and the hook numbers the next one itself.
    """

    def __init__(self, compressor: Compressor, process_group: dist.ProcessGroup | None = None,
                 dense_floor: int = DENSE_FLOOR, serial: bool = False,
                 names: dict[int, str] | None = None, exchange=None, device: torch.device | None = None):
        self.compressor = compressor
        self.device = device if device is not None and device.type == "cuda" else None   # a GPU: CUDA events time it
        self.exchange = exchange or ring_exchange     # how one bucket meets the others (gctestbed.comm: servers)
        self.names = names or {}          # id(parameter) -> its name in the model: a bucket's ids
        self.serial = serial
        self.pending: list[tuple[torch.Tensor, Bucket]] = []     # serial mode: buckets backward produced
        self.failure: BaseException | None = None                  # what stopped the driver thread's last job
        self.dense_floor = dense_floor
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.step = 0
        self._lock = threading.Lock()
        self._layouts: dict[tuple, int] = {}      # a bucket's parameters (names, shapes) -> its layout id
        self._reset()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._drive, name="gctestbed-comm", daemon=True).start()

    def _drive(self) -> None:
        """The driver thread: one bucket at a time, in the order the hook enqueued them."""
        broken = None
        if self.device is not None:       # a new thread starts on GPU 0: work (and events) go to the buckets' GPU
            try:
                torch.cuda.set_device(self.device)
            except BaseException as e:  # noqa: BLE001 - every bucket fails with it, rather than waiting forever
                broken = e
        while True:
            future, buffer, ctx = self._jobs.get()
            try:
                if broken is not None:
                    raise broken
                self.exchange(self, future, buffer, ctx)
            except BaseException as e:  # noqa: BLE001 - handed to DDP, which raises it in backward
                self.failure = e          # DDP's wrapping garbles the message; the worker reports this one
                future.set_exception(e)

    def _reset(self) -> None:
        self._stats = {"encode_s": [], "decode_s": []}     # seconds or Spans; parameter servers add push_s and pull_s
        self._comm_start: Moment | None = None        # the step's first collective launched
        self._comm_ends: list[Moment] = []            # each collective round's completion
        self._comm_busy: list[Span] = []              # each collective round, launch to completion
        self._exchanges: list[dict[str, Any]] = []   # one record per bucket exchanged (results: exchanges)
        self._step_start: Moment | None = None        # the step's first forward (HookState.started)
        self._ready: dict[int, float] = {}            # bucket index -> when the hook got it this step
        self._ready_cpu: dict[int, float | None] = {}  # ... and the CPU seconds forward's thread had spent since
        self._new_layouts: list[dict[str, Any]] = []

    def take_step_stats(self) -> dict[str, Any]:
        """The counters since the last call (one step), then start afresh. ``exchanges`` lists
        every bucket exchanged (its layout, elements, elements sent, rounds, collectives, bytes);
        ``layouts`` the bucket layouts first seen in this step; the step's byte and call counts
        are their sums."""
        with self._lock:
            exchanges = self._exchanges
            for ex in exchanges:
                ex["encode_cpu_s"], ex["decode_cpu_s"] = (cpu_seconds(ex[k]) for k in ("encode_s", "decode_s"))
                ex["encode_s"], ex["decode_s"] = (None if ex[k] is None else seconds(ex[k]) for k in ("encode_s", "decode_s"))
            stats = {**{key: seconds(parts) for key, parts in self._stats.items()},
                     **{key: sum(ex[key] for ex in exchanges) for key in ROUND_FIELDS},
                     "buckets": len(exchanges), "exchanges": exchanges, "layouts": self._new_layouts}
            start = self._comm_start
            span = max(Span(start, end).seconds() for end in self._comm_ends) if start and self._comm_ends else None
            stats["comm_s"] = (seconds(self._comm_busy) if exchanges else None) if self.serial else span
            # the bucket backward finishes last (DDP's highest index): its exchange cannot overlap backward
            tail = max((ex["bucket"] for ex in exchanges), default=None)
            stats["tail_tx_bytes"] = (sum(ex["expected_tx_bytes"] for ex in exchanges if ex["bucket"] == tail)
                                      if exchanges else None)
            self._reset()
            self.step += 1
        return stats

    def exchange_pending(self) -> None:
        """Serial mode, after backward: compress, communicate and decompress every bucket in turn,
        writing the averaged gradient into the bucket (and so into the parameters' gradients)."""
        pending, self.pending = self.pending, []
        for buffer, ctx in pending:
            future: torch.futures.Future = torch.futures.Future()
            self.exchange(self, future, buffer, ctx)
            future.wait()

    def started(self, at: Moment) -> None:
        """The step's first forward began (later forwards of the step, micro-batches, change nothing),
        taken on the thread that runs forward (and, on a CPU, backward)."""
        with self._lock:
            if self._step_start is None:
                self._step_start = at

    def ready(self, ctx: Bucket, at: Moment) -> None:
        """DDP handed bucket ``ctx`` to the hook at ``at``, taken on the thread that runs backward:
        on a CPU forward's, whose CPU seconds since the step began are then forward's and backward's
        work (a replay spins them: workloads/replay.py); elsewhere Span.cpu_seconds gives None."""
        with self._lock:
            self._ready[ctx.key] = at.cpu
            if self._step_start is not None and self.device is None:
                self._ready_cpu[ctx.key] = Span(self._step_start, at).cpu_seconds()

    def moment(self) -> Moment:
        """Now, with a CUDA event where the buckets are on a GPU (see timing.Moment)."""
        return Moment(self.device)

    def record(self, ctx: Bucket, numel: int, sent: int | None, rounds: list[dict[str, Any]],
               encode_s=None, decode_s=None, started: float | None = None, done: float | None = None) -> None:
        """One bucket's exchange, for the store (and the contract check, which reads it there), with
        when the hook got it, when its encoding began (``started``) and when its decoded result was
        in the bucket (``done``), all three from the step's first forward, its encode and decode
        seconds (seconds, Spans or lists of them, read when the step closes), and per round what
        this rank put on the wire (each round's ``wire``, see ``wire_of``:
        what a replay needs to send payloads of the recorded sizes)."""
        layout = tuple((name, tuple(shape)) for name, shape in zip(ctx.ids, ctx.shapes))
        with self._lock:
            ready = self._ready.pop(ctx.key, None)
            ready_cpu = self._ready_cpu.pop(ctx.key, None)
            since = self._step_start.cpu if self._step_start is not None else None
            if layout not in self._layouts:
                self._layouts[layout] = len(self._layouts)
                self._new_layouts.append({"layout": self._layouts[layout],
                                          "params": [[str(name), list(shape)] for name, shape in layout]})
            self._exchanges.append({
                "seq": len(self._exchanges), "bucket": ctx.key, "layout": self._layouts[layout], "numel": numel,
                "sent": sent, "rounds": sum(1 for r in rounds if r["reduce_calls"] or r["gather_calls"]),
                **{key: sum(r[key] for r in rounds) for key in ROUND_FIELDS},
                "ready_s": _since(ready, since), "ready_cpu_s": ready_cpu,
                "start_s": _since(started, since), "done_s": _since(done, since),
                "encode_s": encode_s, "decode_s": decode_s, "payloads": [r["wire"] for r in rounds]})

    def count(self, **add) -> None:
        """Add seconds, or Spans (read when the step closes), to the step's counters."""
        with self._lock:
            for key, value in add.items():
                self._stats.setdefault(key, []).append(value)

    def launched(self, at: Moment) -> None:
        with self._lock:
            if self._comm_start is None:
                self._comm_start = at

    def arrived(self, at: Moment, since: Moment) -> None:
        """A collective round launched at ``since`` completed at ``at``."""
        with self._lock:
            self._comm_ends.append(at)
            self._comm_busy.append(Span(since, at))


ROUND_FIELDS = ("payload_bytes", "gather_bytes", "expected_tx_bytes", "reduce_calls", "gather_calls")


def _since(at: float | None, start: float | None) -> float | None:
    """``at`` on the step's clock (seconds from its first forward); None when either is unknown."""
    return at - start if at is not None and start is not None else None


def wire_of(payloads: list[Payload]) -> dict[str, list[list]]:
    """What this rank put on the wire in one round: ``{"reduce": [[dtype, numel], ...], "gather":
    [...]}`` in the payloads' tensor order, dtype as torch names it without ``torch.`` ("float16")."""
    def shapes(tensors: list[torch.Tensor]) -> list[list]:
        return [[str(t.dtype).removeprefix("torch."), t.numel()] for t in tensors]
    return {"reduce": [x for p in payloads for x in shapes(p.reduce)],
            "gather": [x for p in payloads for x in shapes(p.gather)]}


def _finish_round(state: HookState, payload: Payload) -> dict[str, int]:
    """Run the gather part of a payload (the reduce part is already summed); what the round cost,
    by ROUND_FIELDS, and what it put on the wire (``wire``)."""
    sent = 0
    if payload.gather:
        payload.gathered, sent = collectives.gather(payload.gather, state.process_group)
    tx = collectives.wire_bytes(sum(t.numel() * t.element_size() for t in payload.reduce), sent, state.world_size)
    return {"payload_bytes": payload.nbytes, "gather_bytes": sum(t.numel() * t.element_size() for t in payload.gather),
            "reduce_calls": len(payload.reduce), "gather_calls": collectives.GATHER_CALLS if payload.gather else 0,
            "expected_tx_bytes": tx, "wire": wire_of([payload])}


def compression_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP hook: hand the bucket to the driver thread; the future completes with the new bucket.
    In serial mode, keep the bucket for ``exchange_pending`` and hand it back untouched."""
    # on a GPU, a future that knows its device: set_result then records events on the streams the
    # decode ran on (a Gloo completion runs on a stream of its own), and DDP's wait orders its copy
    # of the bucket after them; a plain future would let DDP read the bucket before the decode wrote it
    buffer = bucket.buffer()
    future: torch.futures.Future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
    params = bucket.parameters()
    ids = tuple(state.names.get(id(p), (bucket.index(), i)) for i, p in enumerate(params))
    ctx = Bucket(key=bucket.index(), shapes=[p.shape for p in params], step=state.step, rank=state.rank,
                 world=state.world_size, params=params, ids=ids)
    state.ready(ctx, Moment())
    if state.serial:
        state.pending.append((buffer, ctx))
        future.set_result(buffer)
        return future
    state._jobs.put((future, buffer, ctx))
    return future


class NonFiniteGradient(RuntimeError):
    """A bucket held NaN or Inf: the step stops before compression, so no memory absorbs it."""


def check_finite(buffer: torch.Tensor, ctx: Bucket) -> None:
    """One summing pass (no allocation); only a non-finite sum pays for the count."""
    if not torch.isfinite(buffer.sum()):
        bad = int((~torch.isfinite(buffer)).sum())
        raise NonFiniteGradient(f"rank {ctx.rank} step {ctx.step} bucket {ctx.key}: {bad} of {buffer.numel()} gradient "
                                "values are NaN or Inf; stopped before compression, so no error-feedback memory took them")


def ring_exchange(state: HookState, future: torch.futures.Future, buffer: torch.Tensor, ctx: Bucket) -> None:
    """Compress, communicate, decompress one bucket (on the driver thread)."""
    numel = buffer.numel()
    check_finite(buffer, ctx)
    compressor = state.compressor if numel >= state.dense_floor else PLAIN
    t0 = state.moment()
    payload = compressor.encode(buffer.div_(state.world_size), ctx)
    launched = state.moment()
    encode = Span(t0, launched)
    state.count(encode_s=encode)
    state.launched(launched)
    if compressor.rounds == 1 and not payload.gather:
        # summed only, one round: let the all-reduce run while the driver takes the next bucket
        collectives.allreduce(payload.reduce, state.process_group).then(
            lambda done: _complete(state, future, buffer, ctx, compressor, payload, numel, launched, done, t0))
        return
    current, decode, rounds = payload, [], []
    while True:
        collectives.allreduce(current.reduce, state.process_group).wait()
        rounds.append(_finish_round(state, current))
        t = state.moment()
        state.arrived(t, launched)
        result = compressor.decompress(current, ctx, numel, out=buffer)    # native decoders write in place
        decode.append(Span(t, state.moment()))
        if not isinstance(result, Payload):
            break
        current, launched = result, state.moment()
    deliver(state, future, buffer, result, decode,
            lambda done: state.record(ctx, numel, payload.sent, rounds, encode, decode, t0.cpu, done))


def _complete(state, future, buffer, ctx, compressor, payload, numel, launched, done, t0) -> None:
    """Completion of a one-round, summed-only payload (on a backend thread: no collectives here),
    encoded from ``t0`` to ``launched`` (Moments). A failed all-reduce (a timeout, a broken
    connection) fails the bucket: never decode unsummed."""
    try:
        done.value()
        round_ = _finish_round(state, payload)
        t = state.moment()
        state.arrived(t, launched)
        result = compressor.decompress(payload, ctx, numel)
        decode = Span(t, state.moment())
        deliver(state, future, buffer, result, decode,
                lambda at: state.record(ctx, numel, payload.sent, [round_], Span(t0, launched), decode, t0.cpu, at))
    except BaseException as e:  # noqa: BLE001
        state.failure = e
        future.set_exception(e)


def deliver(state: HookState, future: torch.futures.Future, buffer: torch.Tensor, result: torch.Tensor,
            decode_s, record) -> None:
    """Put the decoded ``result`` in the bucket, ``record(done)`` the exchange with the moment it was
    there, and complete DDP's future (after the record, so the step that waits on it has it)."""
    if result.data_ptr() != buffer.data_ptr():
        buffer.copy_(result)
    record(now())
    state.count(decode_s=decode_s)
    future.set_result(buffer)


def install(model: DistributedDataParallel, compressor: Compressor,
            process_group: dist.ProcessGroup | None = None, serial: bool = False, exchange=None) -> HookState:
    """Make ``model`` communicate through ``compressor``; returns the state holding the counters.
    ``serial``: communicate only when ``exchange_pending`` is called after backward (the model
    must be built with ``gradient_as_bucket_view=True``). ``exchange(state, future, buffer,
    bucket)``: how a bucket meets the other ranks, when not through ``process_group``'s
    collectives (parameter servers)."""
    if serial and not model.gradient_as_bucket_view:
        raise ValueError("serial mode needs DDP(..., gradient_as_bucket_view=True)")
    state = HookState(compressor, process_group, serial=serial,
                      names={id(p): name for name, p in model.named_parameters()}, exchange=exchange,
                      device=next(model.parameters()).device)
    compressor.attach(model)
    # the step's clock starts where the wrapped module's forward does (after DDP's own preparation),
    # where a replayed model (workloads/replay.py) starts its own
    # (a training forward only: an evaluation between steps must not restart it)
    getattr(model, "module", model).register_forward_pre_hook(
        lambda module, args: state.started(Moment()) if module.training and torch.is_grad_enabled() else None)
    model.register_comm_hook(state, compression_hook)
    return state
