"""What each method must put on the wire, written from its paper and its options, not from the code.

A contract takes what the model and the run fix — a bucket's tensor shapes, the step, the number of
nodes, the method's options — and, for the methods that choose what to send, the number of
elements each node says it sent; it gives the bytes of each node's payload, term by term (codes,
indices, values, norms, scales), and how payloads meet: the rounds, and in each the collectives
(all-reduce or all-gather) with their bytes. From that follow the bytes one node transmits, which
the node's interface counters, kept by the kernel, must show. Nothing here imports gctestbed's
compressors: a method that sends what its paper does not say fails its contract, whatever its own
accounting says.

Rules that are gctestbed's, not a paper's, and so part of every contract:

- a bucket of fewer than DENSE_FLOOR elements is all-reduced as fp32, whatever the method;
- an all-reduce is Gloo's ring: each node sends 2(p-1)/p of the buffer;
- an all-gather of payloads whose sizes differ by node first all-gathers each tensor's element
  count (one int64 per tensor), then every node's tensors packed into one buffer, each tensor
  starting 8-byte aligned, padded to the largest node's (at least 8 bytes): each node sends (p-1)
  such buffers and counts.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .spec import DENSE_FLOOR          # smaller buckets go dense (a rule of gctestbed's, set in one place)
ALIGN = 8                  # bytes: where each gathered tensor starts
COUNT_BYTES = 8            # one int64 element count per gathered tensor

Shape = Sequence[int]


@dataclass
class Collective:
    """One collective of a round: all-reduce or all-gather, and the payload's tensors in bytes
    (a node's own, for an all-gather: the buffer is padded to the largest node's)."""

    kind: str                                   # "allreduce" | "allgather"
    terms: dict[str, int]                       # tensor -> bytes, in payload order

    @property
    def nbytes(self) -> int:
        return sum(self.terms.values())


@dataclass
class Bounds:
    """What the paper allows of a count the method chose: ``low <= sent <= high``."""

    what: str
    low: float
    high: float


@dataclass
class BucketContract:
    """One node's exchange of one bucket: rounds of collectives, and the bounds of what it chose."""

    rounds: list[list[Collective]]
    bounds: Bounds | None = None

    @property
    def payload_bytes(self) -> int:
        return sum(c.nbytes for r in self.rounds for c in r)

    @property
    def calls(self) -> tuple[int, int]:
        """(all-reduce calls, all-gather calls): an all-gather is two (counts, then data)."""
        reduce = sum(1 for r in self.rounds for c in r if c.kind == "allreduce")
        gather = sum(2 for r in self.rounds for c in r if c.kind == "allgather")
        return reduce, gather


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def wire_bytes(mine: BucketContract, everyone: list[BucketContract], world: int) -> int:
    """Bytes this node transmits for its bucket contract ``mine``, given every node's (padding)."""
    if world <= 1:
        return 0
    total = 0.0
    for i, round_ in enumerate(mine.rounds):
        for j, c in enumerate(round_):
            if c.kind == "allreduce":
                total += 2 * (world - 1) / world * c.nbytes
            else:
                width = max(ALIGN, max(sum(aligned(b) for b in other.rounds[i][j].terms.values()) for other in everyone))
                total += (world - 1) * (width + COUNT_BYTES * len(c.terms))
    return round(total)


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def words(n: int, bits: int) -> int:
    """Bytes of n codes of ``bits`` bits packed into 4-byte words (MXNet sizes payloads in floats)."""
    return 4 * math.ceil(n * bits / 32)


# --- the methods -------------------------------------------------------------------------------
# Each takes (options, shapes, step, sent) and gives this node's BucketContract for one bucket;
# ``sent`` is the count the node reports for methods that choose elements, else None.

def _dense(bytes_per_element: int, what: str):
    def contract(o, shapes, step, sent):
        n = sum(_numel(s) for s in shapes)
        return BucketContract([[Collective("allreduce", {what: bytes_per_element * n})]])
    return contract


def _powersgd(o, shapes, step, sent):
    """Vogels et al. 2019, Algorithm 1 with PyTorch's hook's options: before start_iter every tensor
    is all-reduced whole; after, each matrix (n x m, n*m >= rate*(n+m)*r) sends P (n x r) in round 1
    beside every other tensor whole, then Q (m x r) in round 2."""
    r, rate = o["rank"], o["min_compression_rate"]
    n_all = sum(_numel(s) for s in shapes)
    as_matrices = [(s[0], _numel(s) // s[0]) for s in shapes if len(s) >= 2]
    matrices = [(n, m) for n, m in as_matrices if n * m >= rate * (n + m) * r]
    if step < o["start_iter"] or not matrices:                  # plain all-reduce
        return BucketContract([[Collective("allreduce", {"fp32 values": 4 * n_all})]])
    whole = n_all - sum(n * m for n, m in matrices)
    first = [Collective("allreduce", {"P (fp32)": 4 * r * sum(n for n, _ in matrices)})]
    if whole:
        first.append(Collective("allreduce", {"uncompressed tensors (fp32)": 4 * whole}))
    return BucketContract([first, [Collective("allreduce", {"Q (fp32)": 4 * r * sum(m for _, m in matrices)})]])


def _k(n: int, ratio: float) -> int:
    return max(1, min(n, math.ceil(ratio * n)))


def _topk(o, shapes, step, sent):
    """Aji & Heafield 2017: the k = ceil(ratio * n) largest, each as int32 index + fp32 value."""
    n = sum(_numel(s) for s in shapes)
    k = _k(n, o["ratio"])
    return BucketContract([[Collective("allgather", {"int32 indices": 4 * k, "fp32 values": 4 * k})]],
                          bounds=Bounds("elements selected (k)", k, k))


def _randomk(o, shapes, step, sent):
    """Stich et al. 2018: k = ceil(ratio * n) values at positions every node draws alike: values only."""
    n = sum(_numel(s) for s in shapes)
    k = _k(n, o["ratio"])
    return BucketContract([[Collective("allreduce", {"fp32 values": 4 * k})]], bounds=Bounds("elements selected (k)", k, k))


def _chosen(sent, n):
    return Bounds("elements sent", 0, n), (sent if sent is not None else 0)


def _threshold(o, shapes, step, sent):
    """Strom 2015: every element whose residual reaches +-tau, as one 32-bit word (sign and index)."""
    n = sum(_numel(s) for s in shapes)
    bounds, c = _chosen(sent, n)
    return BucketContract([[Collective("allgather", {"sign|index words": 4 * c})]], bounds=bounds)


def _codes(bits: int, what: str, extra: Callable[[dict, int], dict[str, int]] = lambda o, n: {}):
    def contract(o, shapes, step, sent):
        n = sum(_numel(s) for s in shapes)
        return BucketContract([[Collective("allgather", {what: words(n, bits), **extra(o, n)})]])
    return contract


def dgc_density(o: dict, step: int) -> float:
    """Lin et al. 2018, warm-up: sparsity 75 %, 93.75 %, 98.4375 %, 99.6 % over the first epochs
    (density 4^-(e+1)), then the final density (never below it)."""
    epoch = step // o["steps_per_epoch"]
    return max(o["ratio"], 0.25 ** (epoch + 1)) if epoch < o["warmup_epochs"] else o["ratio"]


def _dgc(o, shapes, step, sent):
    """Lin et al. 2018: each tensor of more than one dimension and at least min_numel elements sends
    about density * n of its elements (a sampled threshold: 0.8 k to 1.3 k, DGC's own bounds) as
    int32 index + fp32 (or fp16) value, or (``packing=runlength``, the paper's §3.1) as a 16-bit
    run of zeros + value, where a run past 65,535 zeros costs one more entry of value 0 (at most one
    per 65,536 elements of the bucket); every other tensor goes dense, its velocity all-reduced."""
    sparse = [_numel(s) for s in shapes if len(s) > 1 and _numel(s) >= o["min_numel"]]
    dense = sum(_numel(s) for s in shapes) - sum(sparse)
    density = dgc_density(o, step)
    k = sum(max(1, math.ceil(density * n)) for n in sparse)
    c = sent if sent is not None else 0
    runs = o.get("packing", "index") == "runlength"
    cuts = sum(_numel(s) for s in shapes) // 65536 if runs else 0
    round_ = []
    if dense:
        round_.append(Collective("allreduce", {"dense tensors (fp32)": 4 * dense}))
    if sparse:
        where = {"16-bit runs of zeros": 2 * c} if runs else {"int32 indices": 4 * c}
        round_.append(Collective("allgather", {**where, "values": (2 if o["fp16_values"] else 4) * c}))
    what = (f"entries sent (0.8k..1.3k + {cuts} run cuts, k={k} at density {density:g})" if runs else
            f"elements selected (0.8k..1.3k, k={k} at density {density:g})")
    return BucketContract([round_], bounds=Bounds(what, 0.8 * k, 1.3 * k + cuts) if sparse else None)


def _variance(o, shapes, step, sent):
    """Tsuzuku et al. 2018: each element sent as an int32 index and a 4-bit code (sign, 3-bit
    exponent), 4.5 bytes, plus one fp32 scale per bucket."""
    n = sum(_numel(s) for s in shapes)
    bounds, c = _chosen(sent, n)
    return BucketContract([[Collective("allgather", {"int32 indices": 4 * c, "4-bit codes": words(c, 4),
                                                     "scale (fp32)": 4})]], bounds=bounds)


def _qsgd(o, shapes, step, sent):
    """Alistarh et al. 2017: per element a sign and a level in 0..s (1 + ceil(log2(s+1)) bits, sent in
    the next width of 2, 4 or 8), per chunk of bucket_size elements one fp32 norm."""
    n = sum(_numel(s) for s in shapes)
    need = 1 + math.ceil(math.log2(o["levels"] + 1))
    bits = next(w for w in (2, 4, 8) if w >= need)
    return BucketContract([[Collective("allgather", {f"{bits}-bit codes": words(n, bits),
                                                     "chunk norms (fp32)": 4 * math.ceil(n / o["bucket_size"])})]])


def _terngrad(o, shapes, step, sent):
    """Wen et al. 2017: the nodes first share one scale (a float each), then each sends a ternary
    code per element in 2 bits."""
    n = sum(_numel(s) for s in shapes)
    return BucketContract([[Collective("allgather", {"scale (fp32)": 4})],
                           [Collective("allgather", {"2-bit codes": words(n, 2)})]])


METHODS: dict[str, Callable[[dict, list[Shape], int, int | None], BucketContract]] = {
    "none": _dense(4, "fp32 values"),
    "fp16": _dense(2, "fp16 values"),
    "bf16": _dense(2, "bf16 values"),
    "powersgd": _powersgd,
    "topk": _topk,
    "randomk": _randomk,
    "threshold": _threshold,
    "twobit": _codes(2, "2-bit codes"),                      # MXNet: 16 codes per 4 bytes
    "onebit": _codes(1, "1-bit codes"),                      # MXNet: 32 codes per 4 bytes
    "dgc": _dgc,
    "variance": _variance,
    "hybrid": _variance,
    "qsgd": _qsgd,
    "terngrad": _terngrad,
    "signsgd": _codes(1, "sign bits"),                       # Bernstein et al. 2018/2019
    "signum": _codes(1, "sign bits"),
    "efsignsgd": _codes(1, "sign bits", lambda o, n: {"scale (fp32)": 4}),   # Karimireddy et al. 2019
}


def bucket(method: str, options: dict[str, Any], shapes: list[Shape], step: int, sent: int | None) -> BucketContract:
    """This node's contract for one bucket of ``shapes`` at ``step``."""
    if sum(_numel(s) for s in shapes) < DENSE_FLOOR:
        return _dense(4, "fp32 values (bucket under the dense floor)")(options, shapes, step, sent)
    return METHODS[method](options, shapes, step, sent)


@dataclass
class Phase:
    """A stretch of steps over which a method's contract keeps one form: ``first`` to ``last``
    (None: to the end of the run)."""

    name: str
    first: int
    last: int | None = None

    def holds(self, step: int) -> bool:
        return self.first <= step and (self.last is None or step <= self.last)


def phases(method: str, options: dict[str, Any]) -> list[Phase]:
    """The phases of a method's schedule, from its paper and options: DGC's warm-up epochs (each at
    its own density) and the steps after them; PowerSGD's plain all-reduce before start_iter and the
    compressed steps from it; one phase for every other method (their contracts do not change with
    the step)."""
    if method == "dgc":
        spe, epochs = options["steps_per_epoch"], options["warmup_epochs"]
        warm = [Phase(f"warm-up epoch {e} (density {dgc_density(options, e * spe):g})", e * spe, (e + 1) * spe - 1)
                for e in range(epochs)]
        return warm + [Phase(f"after warm-up (density {options['ratio']:g})", epochs * spe)]
    if method == "powersgd":
        start = options["start_iter"]
        dense = [Phase("dense start (all-reduced whole)", 0, start - 1)] if start else []
        return dense + [Phase(f"compressed (rank {options['rank']})", start)]
    return [Phase("every step", 0)]


# --- judging a run -------------------------------------------------------------------------------

FIRST_JUDGED = 2           # DDP's first two steps are not judged (see judge)
FRAMING = 0.08             # Ethernet, IP and TCP headers and ACKs, in proportion to the bytes sent
CALL_OVERHEAD = 2048       # bytes per collective call beyond its payload: Gloo's messages, TCP's ACKs
# Measured on this project's VM (verify's job, all 17 methods): 750-1000 bytes beyond the contract per
# call for small payloads, 0.3 % (about 3.1 kB a call) on none's 1 MB all-reduces, where the interface
# counts a GSO packet once with one set of headers. A node whose slowest path is under about 24 Mbit/s
# sends single frames (topology.gso_segments), each counted with its 66 bytes of headers, 4.6 % of a
# full frame's 1448 of payload; the pure ACKs a node sends add little (ring-share at 16 nodes: 0.25 %
# by the ACK class's counters, shaping.ACK_SHARE). A review measured none at 1.048-1.056 and fp16 at
# 1.049-1.065 of the contract with single frames at 1gbit (a version that sent them at every rate),
# above those 4.9 %, so the allowance leaves room: about twice the first figure and 0.08 here.


@dataclass
class StepCheck:
    """One node's step against the contract."""

    step: int
    rank: int
    contract_wire: int
    counters: int | None
    largest_bucket_wire: int
    contract_payload: int
    accounting: int
    exchanges: int
    calls: int
    numel: int
    sent: int | None
    problems: list[tuple[str, str]]      # (the broken term, what was found)


def _shapes(params: list) -> list[list[int]]:
    return [list(shape) for _, shape in params]


def judge(method: str, options: dict[str, Any], world: int, steps: list[dict], exchanges: list[dict],
          layouts: dict[tuple[int, int], list], model_numel: int | None = None, first_step: int | None = None) -> dict:
    """Every recorded step of a run against the method's contract.

    ``steps``: the steps table's rows (rank, step, tx_bytes); ``exchanges``: the exchanges table's
    rows; ``layouts``: (rank, layout) -> [[name, shape], ...]. ``model_numel``: the model's
    parameter count, counted on the model, when the caller has it (else the first layout's).
    Steps before ``first_step`` are not judged: by default DDP's first two (the first runs with one
    bucket of everything while DDP's start-up broadcast still drains; the second broadcasts the
    rebuilt buckets).

    Each step is checked on its own for what the nodes recorded: every parameter went out once,
    each bucket's rounds, collectives and payload size, the elements chosen within bounds. The
    interface counters are checked over all judged steps together: a step's last message may
    still be queued when its node reads the counters, and is then counted in the next step, so one
    bucket's bytes may cross each end of the window.
    """
    by_step: dict[tuple[int, int], list[dict]] = {}
    for ex in exchanges:
        by_step.setdefault((ex["step"], ex["rank"]), []).append(ex)
    tx = {(s["step"], s["rank"]): s.get("tx_bytes") for s in steps}
    complete = sorted({s for s, _ in tx if all((s, r) in tx for r in range(world))})
    if first_step is None:
        first_step = FIRST_JUDGED if len(complete) > FIRST_JUDGED else 0
    judged = [s for s in complete if s >= first_step]
    if model_numel is None and layouts:
        model_numel = sum(math.prod(shape) for _, shape in layouts[min(layouts)])
    checks = [c for step in judged for c in _judge_step(method, options, world, step, by_step, tx, layouts, model_numel)]
    return summarise(checks, world, phases(method, options))


def _judge_step(method, options, world, step, by_step, tx, layouts, model_numel) -> list[StepCheck]:
    contracts_of, last = {}, {}
    for rank in range(world):
        done = sorted(by_step.get((step, rank), []), key=lambda e: e["seq"])
        last[rank] = {ex["bucket"]: ex for ex in done}               # a bucket exchanged twice: its last
        contracts_of[rank] = {b: bucket(method, options, _shapes(layouts[(rank, ex["layout"])]), step, ex["sent"])
                              for b, ex in last[rank].items()}
    checks = []
    for rank in range(world):
        done = by_step.get((step, rank), [])
        problems: list[tuple[str, str]] = []
        wires = []
        for b, c in contracts_of[rank].items():
            ex = last[rank][b]
            everyone = [contracts_of[q].get(b) for q in range(world)]
            if any(e is None or len(e.rounds) != len(c.rounds) for e in everyone):
                problems.append(("exchanges", f"bucket {b} was not exchanged alike by every node"))
                continue
            wires.append(wire_bytes(c, everyone, world))
            if c.bounds is not None and not c.bounds.low <= (ex["sent"] or 0) <= c.bounds.high:
                problems.append((c.bounds.what.split(" (")[0], f"bucket {b}: {c.bounds.what}: {ex['sent']}, "
                                 f"outside {c.bounds.low:g}..{c.bounds.high:g}"))
            if ex["payload_bytes"] != c.payload_bytes:
                terms = ", ".join(f"{k} {v}" for r in c.rounds for col in r for k, v in col.terms.items())
                problems.append(("payload", f"bucket {b}: a payload of {ex['payload_bytes']} bytes by the method's "
                                            f"own count, {c.payload_bytes} by the contract ({terms})"))
            if (ex["reduce_calls"], ex["gather_calls"]) != c.calls or ex["rounds"] != len(c.rounds):
                problems.append(("collectives", f"bucket {b}: {ex['rounds']} round(s) of {ex['reduce_calls']} "
                                                f"all-reduce and {ex['gather_calls']} all-gather calls; the contract: "
                                                f"{len(c.rounds)} of {c.calls[0]} and {c.calls[1]}"))
        numel = sum(ex["numel"] for ex in done)
        names = [name for ex in done for name, _ in layouts[(rank, ex["layout"])]]
        if model_numel is not None and numel != model_numel:
            problems.append(("exchanges", f"{len(done)} exchanges carried {numel} elements where the model has "
                                          f"{model_numel}: its parameters went out {numel / model_numel:.3g} times"))
        elif len(names) != len(set(names)):
            problems.append(("exchanges", f"{len(done)} exchanges carried some parameters more than once"))
        sent = [ex["sent"] for ex in done if ex["sent"] is not None]
        checks.append(StepCheck(step, rank, sum(wires), tx.get((step, rank)), max(wires, default=0),
                                sum(c.payload_bytes for c in contracts_of[rank].values()),
                                sum(ex["payload_bytes"] for ex in done), len(done),
                                sum(ex["reduce_calls"] + ex["gather_calls"] for ex in done), numel,
                                sum(sent) if sent else None, problems))
    return checks


def wire_window(checks: list[StepCheck]) -> tuple[int, int, int, int]:
    """One node's judged steps together: (counters, contract, lowest allowed, highest allowed)."""
    contract = sum(c.contract_wire for c in checks)
    counters = sum(c.counters or 0 for c in checks)
    edge = max((c.largest_bucket_wire for c in checks), default=0)      # may cross each end of the window
    calls = sum(c.calls for c in checks)
    return counters, contract, contract - edge, round(contract * (1 + FRAMING) + CALL_OVERHEAD * calls + edge)


def summarise(checks: list[StepCheck], world: int, schedule: list[Phase] | None = None) -> dict:
    """The judged steps' figures (bytes on the wire averaged over the window, the rest medians of
    rank means), the counters against the contract over each phase of ``schedule`` (the whole
    window where it is one phase), the steps judged in each phase, and every problem found."""
    def median(values):
        vals = [v for v in values if v is not None]
        return statistics.median(vals) if vals else None

    schedule = schedule or [Phase("every step", 0)]
    per_step: dict[int, list[StepCheck]] = {}
    for c in checks:
        per_step.setdefault(c.step, []).append(c)

    def per_step_mean(name):
        return median(statistics.fmean(getattr(c, name) for c in cs) if all(getattr(c, name) is not None for c in cs)
                      else None for cs in per_step.values())

    problems = [{"term": term, "step": c.step, "node": c.rank, "text": text} for c in checks for term, text in c.problems]
    windows = []                            # per node: its judged steps' counters and contract, per step
    for rank in range(world):
        mine = [c for c in checks if c.rank == rank]
        if not mine or any(c.counters is None for c in mine):
            continue
        counters, contract, _, _ = wire_window(mine)
        windows.append((counters / len(mine), contract / len(mine)))
        largest = {c.step: c.largest_bucket_wire for c in mine}
        for phase in schedule:
            part = [c for c in mine if phase.holds(c.step)]
            if not part:
                continue
            counters, contract, low, high = wire_window(part)
            before = largest.get(part[0].step - 1, 0)       # the step before may cross into the phase: its bucket
            high += max(0, before - max(c.largest_bucket_wire for c in part))
            if not low <= counters <= high:
                within = f" ({phase.name})" if len(schedule) > 1 else ""
                problems.append({"term": "interface bytes", "step": None, "node": rank, "text":
                                 f"steps {part[0].step}-{part[-1].step}{within}: the interface sent {counters} bytes, "
                                 f"the contract {contract}" + (f" ({counters / contract:.3g}x)" if contract else "") +
                                 f"; allowed {low}..{high} (headers, and one bucket crossing each end)"})
    return {"steps_judged": sorted(per_step),
            "phases": [{"phase": p.name, "first": p.first, "last": p.last,
                        "steps_judged": [s for s in sorted(per_step) if p.holds(s)]} for p in schedule],
            # bytes on the wire: the window's, per step and node (a step's own counters may hold part of the next's)
            "contract_wire_bytes": statistics.fmean(w[1] for w in windows) if windows else per_step_mean("contract_wire"),
            "counters_bytes": statistics.fmean(w[0] for w in windows) if windows else None,
            "contract_payload_bytes": per_step_mean("contract_payload"),
            "accounting_bytes": per_step_mean("accounting"), "exchanges_per_step": median(c.exchanges for c in checks),
            "collectives_per_step": median(c.calls for c in checks),
            "sent_fraction": median(c.sent / c.numel for c in checks if c.sent is not None and c.numel),
            "ok": bool(checks) and not problems, "problems": problems}


def describe(problems: list[dict], limit: int = 4) -> list[str]:
    """One line per broken term (its first occurrence, and how often it recurred), at most ``limit``."""
    first: dict[str, tuple[dict, int]] = {}
    for p in problems:
        seen = first.get(p["term"])
        first[p["term"]] = (seen[0], seen[1] + 1) if seen else (p, 1)
    lines = []
    for term, (p, count) in list(first.items())[:limit]:
        where = ", ".join(x for x in (f"step {p['step']}" if p["step"] is not None else "",
                                      f"node {p['node']}" if p["node"] is not None else "") if x)
        more = f" (and {count - 1} more like it)" if count > 1 else ""
        lines.append(f"{term}: {where + ': ' if where else ''}{p['text']}{more}")
    return lines


# --- parameter servers (--comm ps) ----------------------------------------------------------------
# The servers' placement, restated here from the documentation (docs/running.md), not imported from
# gctestbed.comm. place=mxnet (MXNet's kvstore): a parameter of fewer than ``split`` elements goes
# whole to server (index * 9973) % servers, index its place in the model's parameter order (given
# by the caller, verify counting it on the model itself; otherwise taken from the first layout
# exchanged: under torch 2.13 DDP's first step sends the whole model as one bucket in its order,
# seen with 2 ranks and a 126 MB model); a bigger one is cut into contiguous flat ranges, range i
# ending at round-half-up(numel / servers * (i + 1)).
# place=balanced (gctestbed's own): a parameter of at least ``split`` elements is cut into one block of rows per
# server (numpy's array_split sizes); a smaller one goes whole to the server with the fewest
# elements so far (the lowest index on a tie), in the order the buckets are first exchanged, each
# parameter counted where it was placed last (DDP's rebuilt buckets place them again). Every
# part a worker sends is one message: a 32-byte envelope, then a small header and the part's
# payload. With a dense pull each server answers every worker with its parts' fp32 sum.

ENVELOPE = 32


def kvstore_parts(layouts: list[list], servers: int, split: int, place: str,
                  order: list[str] | None = None) -> list[list[tuple[int, list[Shape]]]]:
    """For each bucket layout ([[name, shape], ...]), in first-exchanged order: (server, the shapes
    of its part) per server that gets anything. ``order``: the model's parameter names in its order
    (MXNet's keys), or None to take them from the first layout."""
    load, where = [0] * servers, {}
    if order is None:
        order = [name for name, _ in layouts[0]] if layouts else []
    index = {name: i for i, name in enumerate(order)}
    out = []
    for params in layouts:
        parts: list[list[Shape]] = [[] for _ in range(servers)]
        for name, shape in params:
            n = _numel(shape)
            if place == "mxnet":
                if n < split or servers == 1:
                    parts[index[name] * 9973 % servers].append(list(shape))
                else:
                    ends = [math.floor(n / servers * (i + 1) + 0.5) for i in range(servers)]
                    for k, (a, b) in enumerate(zip([0] + ends[:-1], ends)):
                        if b > a:
                            parts[k].append([b - a])
                continue
            for k, m in where.pop(name, []):
                load[k] -= m
            if n >= split and servers > 1:
                rows = shape[0] if len(shape) > 1 and shape[0] >= servers else n
                width = n // rows
                for k in range(servers):
                    share = rows // servers + (1 if k < rows % servers else 0)
                    parts[k].append([share, *shape[1:]] if rows != n else [share])
                    load[k] += share * width
                    where.setdefault(name, []).append((k, share * width))
            else:
                k = min(range(servers), key=lambda i: (load[i], i))
                parts[k].append(list(shape))
                load[k] += n
                where[name] = [(k, n)]
        out.append([(k, p) for k, p in enumerate(parts) if p])
    return out


def _part(method: str, options: dict[str, Any], shapes: list[Shape], whole: int, step: int, sent: int | None) -> BucketContract:
    """One part's contract: the method's on the part's shapes, or fp32 when its whole bucket is
    under the dense floor (the floor is the bucket's, not the part's)."""
    if whole < DENSE_FLOOR:
        return _dense(4, "fp32 values (bucket under the dense floor)")(options, shapes, step, sent)
    return METHODS[method](options, shapes, step, sent)


def _push(method, options, parts, whole, step, sent) -> tuple[int, Bounds | None, bool]:
    """A bucket's pushes: the payload bytes over every part, the bounds on the elements chosen,
    and whether the payload depends on that count. A method that chooses elements pays the same
    bytes per element chosen in any part, so the total is each part's bytes for none chosen plus
    that rate times what the worker reports for the bucket."""
    zero = [_part(method, options, shapes, whole, step, 0) for _, shapes in parts]
    rate = max(_part(method, options, shapes, whole, step, 1).payload_bytes - z.payload_bytes
               for (_, shapes), z in zip(parts, zero))
    bounds = [z.bounds for z in zero if z.bounds is not None]
    total = Bounds(bounds[0].what.split(" (")[0] + " (summed over the servers' parts)", sum(b.low for b in bounds),
                   sum(b.high for b in bounds)) if bounds else None
    return sum(z.payload_bytes for z in zero) + rate * (sent or 0), total, rate > 0


def judge_ps(method: str, options: dict[str, Any], comm_options: dict[str, Any], workers: int, steps: list[dict],
             exchanges: list[dict], layouts: dict[tuple[int, int], list], server_steps: list[dict],
             model_numel: int | None = None, model_order: list[str] | None = None) -> dict:
    """A parameter-server run against the contract, as ``judge`` for the ring: each worker's pushes
    (payload term by term per part, elements chosen, every parameter once) and its interface
    counters; then the servers together, their counters in (every worker's pushes) and out (the
    dense sums, or the sums encoded again where the method's size is fixed). ``model_order``: the
    model's parameter names in its order, where the caller counted them on the model."""
    servers, dense_pull = comm_options["servers"], comm_options["pull"] == "dense"
    tx = {(s["step"], s["rank"]): s.get("tx_bytes") for s in steps}
    complete = sorted({s for s, _ in tx if all((s, r) in tx for r in range(workers))})
    judged = [s for s in complete if s >= (FIRST_JUDGED if len(complete) > FIRST_JUDGED else 0)]
    if model_numel is None and layouts:
        model_numel = sum(math.prod(shape) for _, shape in layouts[min(layouts)])
    numbered = sorted(n for r, n in layouts if r == 0)
    cut = dict(zip(numbered, kvstore_parts([layouts[(0, n)] for n in numbered], servers, comm_options["split"],
                                                comm_options.get("place", "balanced"),   # runs stored before place= existed
                                                model_order)))
    by_step: dict[tuple[int, int], list[dict]] = {}
    for ex in exchanges:
        by_step.setdefault((ex["step"], ex["rank"]), []).append(ex)
    checks, pulls, fixed_pull, summing = [], {}, True, {}
    for step in complete:
        for rank in range(workers):
            done, problems, wire, payload, largest, messages = by_step.get((step, rank), []), [], 0, 0, 0, 0
            for ex in done:
                parts = cut[ex["layout"]]
                nbytes, bounds, chosen = _push(method, options, parts, ex["numel"], step, ex["sent"])
                if bounds is not None and not bounds.low <= (ex["sent"] or 0) <= bounds.high:
                    problems.append((bounds.what.split(" (")[0], f"bucket {ex['bucket']}: {bounds.what}: {ex['sent']}, "
                                     f"outside {bounds.low:g}..{bounds.high:g}"))
                if ex["payload_bytes"] != nbytes:
                    problems.append(("payload", f"bucket {ex['bucket']}: pushes of {ex['payload_bytes']} bytes by the "
                                                f"method's own count, {nbytes} by the contract over {len(parts)} part(s)"))
                wire += nbytes + ENVELOPE * len(parts)
                payload += nbytes
                largest = max(largest, nbytes + ENVELOPE * len(parts))
                messages += len(parts)
                if rank == 0:                       # what the servers send back, to every worker
                    summing.setdefault(step, set()).update(k for k, _ in parts)
                    back = [4 * sum(_numel(s) for s in shapes) if dense_pull or ex["numel"] < DENSE_FLOOR
                            else _part(method, options, shapes, ex["numel"], step, 0).payload_bytes for _, shapes in parts]
                    fixed_pull &= dense_pull or not chosen
                    bytes_, count = pulls.get(step, (0, 0))
                    pulls[step] = (bytes_ + sum(back) + ENVELOPE * len(parts), count + len(parts))
            numel = sum(ex["numel"] for ex in done)
            if model_numel is not None and numel != model_numel:
                problems.append(("exchanges", f"{len(done)} exchanges carried {numel} elements where the model has "
                                              f"{model_numel}: its parameters went out {numel / model_numel:.3g} times"))
            sent = [ex["sent"] for ex in done if ex["sent"] is not None]
            checks.append(StepCheck(step, rank, wire, tx.get((step, rank)), largest, payload,
                                    sum(ex["payload_bytes"] for ex in done), len(done), messages, numel,
                                    sum(sent) if sent else None, problems))
    out = summarise([c for c in checks if c.step in judged], workers, phases(method, options))
    out.update(_servers_judged(server_steps, complete, checks, pulls, workers, fixed_pull, summing))
    out["problems"] += out.pop("server_problems")
    out["ok"] = bool(checks) and not out["problems"]
    return out


def _servers_judged(server_steps: list[dict], complete: list[int], checks: list[StepCheck], pulls: dict,
                    workers: int, fixed_pull: bool, summing: dict[int, set[int]]) -> dict:
    """The servers' interface counters over the whole run, all servers together: in, every
    worker's pushes; out, every worker's pulls (judged where their size is fixed). A server reads
    its counters when the next step's first part has arrived, so its steps' rows each hold part of
    the next; over the whole run nothing crosses an end, and the servers carry nothing else.
    ``summing``: step -> the servers the workers pushed parts to; each must have recorded that
    step (a server that summed nothing, or kept no record of it, breaks the contract)."""
    rows = [r for r in server_steps if r["step"] in complete]
    recorded = {(r["step"], r["rank"] - workers) for r in rows}
    missing = [(step, k) for step in complete for k in sorted(summing.get(step, ())) if (step, k) not in recorded]
    if missing:
        step, k = missing[0]
        more = f" (and {len(missing) - 1} more server steps)" if len(missing) > 1 else ""
        text = (f"the servers recorded no step at all: nothing was summed, though the workers pushed {len(missing)} "
                f"server steps' parts" if not rows else
                f"server {k} recorded no step {step}, though the workers pushed parts to it{more}")
        return {"servers": None, "server_problems": [{"term": "server steps", "step": None if not rows else step,
                                                      "node": None, "text": text}]}
    if any(r["rx_bytes"] is None or r["tx_bytes"] is None for r in rows):
        return {"servers": None, "server_problems": [{"term": "server interface bytes", "step": None, "node": None,
                                                      "text": "the servers recorded no interface counters"}]}
    if not rows:
        return {"servers": None, "server_problems": []}
    problems, figures = [], {}
    for what, counters, contract, messages in (
            ("in", sum(r["rx_bytes"] for r in rows), sum(c.contract_wire for c in checks), sum(c.calls for c in checks)),
            ("out", sum(r["tx_bytes"] for r in rows), workers * sum(p[0] for p in pulls.values()),
             workers * sum(p[1] for p in pulls.values()))):
        figures[what] = {"counters_bytes": counters, "contract_bytes": contract}
        if what == "out" and not fixed_pull:
            figures[what]["contract_bytes"] = None       # re-encoded sums of a method that chooses: no fixed size
            continue
        low, high = contract, round(contract * (1 + FRAMING) + CALL_OVERHEAD * messages)
        if not low <= counters <= high:
            problems.append({"term": "server interface bytes", "step": None, "node": None, "text":
                             f"steps {complete[0]}-{complete[-1]}: the servers' interfaces took {what} {counters} "
                             f"bytes, the contract {contract} ({counters / contract:.3g}x); allowed {low}..{high}"})
    return {"servers": figures, "server_problems": problems}
