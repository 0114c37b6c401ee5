"""The performance model: why a step takes what it takes, fitted on ``none`` and tested on the rest.

    serial:   T = T_compute + T_comm + T_encode + T_decode + T_optim
    overlap:  T = max(λ·T_compute, T_ready + T_comm - T_tail) + T_tail + T_encode + T_decode + T_optim

T_compute is forward + backward, T_ready the time from the step's start until its first bucket is
ready (on the latest rank), and T_optim the optimizer step, the workload's, from none's serial
cells (timed with no communication in the way); T_encode and T_decode are the method's own, from
its serial cells: none of these depends on the network. No exchange starts before T_ready, so the
exchanges but the last run from T_ready on, while backward goes; λ does not stretch T_ready, since
no exchange runs beside the compute before it. A run that recorded no ready times has T_ready = 0
(every exchange may start with the step). Back-to-back exchanges from T_ready are DDP's in-order
pipeline when no bucket comes ready late; with gaps between buckets the term is a lower bound. The communication time of a step
sums, over its collectives, the ring formulas

    all-reduce of b bytes:        2(p-1)·(α + L) + 2b(p-1)/(p·BW)
    all-gather of m bytes a rank: (p-1)·(α + L) + (p-1)·m/BW

with L the configured one-way latency, BW the shaped rate times η, the share of it the
collectives' bytes actually get (TCP framing, acknowledgements, the collective's own pauses), and α
the host's own cost per message. The bytes are the step's
exact payload sizes as the hook counted them. T_tail is the exchange of the bucket backward
finishes last: it cannot start before backward ends, so it is never hidden (with one bucket,
overlap is serial). The issue's simpler form, max(λ·T_compute, T_comm) + T_encode + T_decode,
hides all communication and has no T_ready; it is fitted and reported too, so the two can be compared.

Parameter servers (``--comm ps``) and local steps (``localsgd``, ``diloco``) have their own
communication terms, with the same α and η:

    parameter servers:  max(T_push, T_pull) + min(T_push, T_pull)/B + T_sum + 2B·(α + L)
        T_push = max(b_push, b_in)·8/(η·BW),  T_pull = max(b_back, b_out)·8/(η·BW)
    local steps:        (the step's mean messages)·(α + L) + (its mean bytes)·8/(η·BW), never hidden

A worker pushes b_push bytes up its link while the busiest server's downlink takes b_in, the N
workers' parts of it (with K servers about N/K payloads); pulls come back the other way, b_out out
of that server and b_back into each worker. Pushes and pulls use opposite directions of every
link, so B buckets pipeline them: the longer phase, plus a B-th of the shorter. T_sum is the
busiest server's summing time, measured. Local SGD and DiLoCo all-reduce the whole model once
every H steps after the optimizer, so their step is compute + optimizer + the averaging's ring
all-reduce amortised over whole periods (what their step time and bytes are: means, see
``cells``); DiLoCo's outer optimizer step is left out (one SGD step per H).

λ, α and η are fitted on the ``none`` cells only (α and η from the serial ones, λ from the overlap ones);
every other cell is a prediction, and the median absolute error over those is the model's score.
Tested on node counts it was not fitted on (``held_out``), α and η come from every method's serial
cells at the fitted node counts: there the question is the node count, not the method.
"""

from __future__ import annotations

import math
import statistics
import dataclasses
from dataclasses import dataclass, field

from ..spec import LOCAL_COMMS
from .cells import SAME_CELL, Row, top_dilation, undilated_cell, undilated_workload

TOLERANCE = 0.10
LAMBDA_STEP = 0.005         # λ's grid, from 0.25 to 4
LAMBDA_GRID = [0.25 + LAMBDA_STEP * i for i in range(751)]
VARIANTS = ("tail", "issue")
BASELINE = "none"


def one_lambda(lo: float, hi: float) -> bool:
    """Whether a range of λ on the grid is one λ (one step of the grid at most)."""
    return hi - lo <= LAMBDA_STEP + 1e-12


def at_edge(lo: float, hi: float, ties_elsewhere: bool) -> bool:
    """Whether λ fitted to the range [lo, hi] is one λ (none apart from it as good) at the grid's
    edge, where the best may lie beyond: not identified, though no tie was broken by a choice."""
    return one_lambda(lo, hi) and not ties_elsewhere and (lo <= LAMBDA_GRID[0] or hi >= LAMBDA_GRID[-1])


def why_unidentified(lo: float, hi: float, ties_elsewhere: bool) -> str:
    """Why λ fitted to the range [lo, hi] (``Fit.lam_range``) is not identified, in words: a range
    that fits none's overlap cells equally well, or one λ at the edge of the grid, or one λ with
    others apart from it fitting as well. What the report and the claims both say."""
    elsewhere = "; other λ apart from these fit as well" if ties_elsewhere else ""
    edge, top = LAMBDA_GRID[0], LAMBDA_GRID[-1]
    if at_edge(lo, hi, ties_elsewhere):
        return f"best at the edge of the λ the fit tries ({top if hi >= top else edge:.3f}), so the best may lie beyond"
    if one_lambda(lo, hi):
        return f"λ {lo:.3f} fits none's overlap cells best{elsewhere}"
    if lo <= edge and hi >= top:
        where = "every λ the fit tries fits none's overlap cells as well"
    elif lo <= edge:
        where = f"every λ up to {hi:.3f} fits none's overlap cells as well"
    elif hi >= top:
        where = f"every λ from {lo:.3f} up fits none's overlap cells as well"
    else:
        where = f"every λ from {lo:.3f} to {hi:.3f} fits none's overlap cells as well"
    return where + elsewhere


@dataclass
class Phases:
    """The network-independent parts of a step for one method in one setting (seconds)."""

    compute: float
    optim: float
    encode: float
    decode: float
    first_ready: float = 0.0    # from the step's start until its first bucket is ready: no exchange starts earlier


@dataclass
class Prediction:
    row: Row
    predicted_s: float
    comm_s: float
    error: float                # predicted / measured - 1
    fitted: bool                # a none cell: used for the fit, not a prediction
    why: str = ""


@dataclass
class Fit:
    variant: str
    lam: float
    alpha_s: float
    eta: float
    predictions: list[Prediction] = field(default_factory=list)
    # the run of λ, contiguous on the grid around the chosen one, that fit none's overlap cells as well
    # (None: no overlap cells, λ = 1 by default); wider than one step of the grid when those cells
    # cannot tell λ apart (communication hides their compute), and then λ was not fitted, only chosen
    lam_range: tuple[float, float] | None = None
    lam_ties_elsewhere: bool = False    # some λ outside that run fit as well (then not identified either)

    @property
    def lam_identified(self) -> bool:
        """One λ fits best, inside the grid: not a range of equals, nor the grid's own edge (a best
        λ there may lie beyond it)."""
        if self.lam_range is None:
            return False
        lo, hi = self.lam_range
        return one_lambda(lo, hi) and not self.lam_ties_elsewhere and not at_edge(lo, hi, False)

    @property
    def median_error(self) -> float | None:
        errs = [abs(p.error) for p in self.predictions if not p.fitted]
        return statistics.median(errs) if errs else None

    @property
    def fit_error(self) -> float | None:
        errs = [abs(p.error) for p in self.predictions if p.fitted]
        return statistics.median(errs) if errs else None

    @property
    def misses(self) -> list[Prediction]:
        return [p for p in self.predictions if not p.fitted and abs(p.error) > TOLERANCE]


def _setting(r: Row) -> tuple:
    return (r.workload, r.nodes, r.batch_size)


def phases(rows: list[Row]) -> dict[tuple, Phases]:
    """Per (workload, nodes, batch size, method), medians over serial cells: compute, the first
    bucket's ready time and optimizer are the workload's, taken from none's cells (the method's own
    where none has none); encode and decode are the method's own (from its overlap cells where it
    has no serial ones)."""
    out: dict[tuple, Phases] = {}
    serial = [r for r in rows if r.mode == "serial" and r.compute_s is not None]
    for key in {(*_setting(r), r.compressor) for r in rows}:
        own = [r for r in serial if (*_setting(r), r.compressor) == key]
        workload = [r for r in serial if (*_setting(r), r.compressor) == (*key[:3], BASELINE)] or own
        if not workload:
            continue
        coded = own or [r for r in rows if (*_setting(r), r.compressor) == key]
        ready = [r.first_ready_s for r in workload if r.first_ready_s is not None]
        out[key] = Phases(compute=statistics.median(r.compute_s for r in workload),
                          optim=statistics.median(r.optim_s or 0.0 for r in workload),
                          encode=statistics.median(r.encode_s or 0.0 for r in coded),
                          decode=statistics.median(r.decode_s or 0.0 for r in coded),
                          first_ready=statistics.median(ready) if ready else 0.0)
    return out


def messages(reduce_calls: float, gather_calls: float, p: int) -> float:
    """Sequential messages of a step's collectives on a ring of ``p``: each pays one α + L."""
    return (reduce_calls * 2 + gather_calls) * (p - 1)


def comm_time(tx_bytes: float, n_messages: float, bw_bps: float, latency_s: float, alpha_s: float,
              eta: float) -> float:
    return n_messages * (alpha_s + latency_s) + tx_bytes * 8 / (bw_bps * eta)


def step_time(ph: Phases, comm: float, tail: float, mode: str, lam: float, variant: str) -> float:
    fixed = ph.encode + ph.decode + ph.optim
    if mode == "serial":
        return ph.compute + comm + fixed
    if variant == "issue":
        return max(lam * ph.compute, comm) + fixed
    return max(lam * ph.compute, ph.first_ready + comm - tail) + tail + fixed


def _mode(r: Row) -> str:
    """Local steps exchange nothing while backward runs: their averaging adds to the step."""
    return "serial" if r.comm in LOCAL_COMMS else r.mode


def _comm(r: Row, alpha: float, eta: float) -> tuple[float, float]:
    """(whole step's, last bucket's) communication time of row ``r``."""
    if r.comm == "ps":
        return _ps_comm(r, alpha, eta)
    n = messages(r.reduce_calls or 0, r.gather_calls or 0, r.nodes)
    whole = comm_time(r.expected_tx_bytes or 0, n, r.bw_bps, r.latency_s, alpha, eta)
    buckets = max(1.0, r.buckets or 1)
    tail = comm_time(r.tail_tx_bytes if r.tail_tx_bytes is not None else (r.expected_tx_bytes or 0) / buckets,
                     n / buckets, r.bw_bps, r.latency_s, alpha, eta)
    return whole, min(tail, whole)


def _ps_comm(r: Row, alpha: float, eta: float) -> tuple[float, float]:
    """A parameter-server step: pushes and pulls through the busiest links, pipelined over buckets."""
    rate = r.bw_bps * eta
    push = max(r.expected_tx_bytes or 0, r.server_push_bytes or 0) * 8 / rate
    pull = max(r.pull_rx_bytes or 0, r.server_pull_bytes or 0) * 8 / rate
    b = max(1.0, r.buckets or 1)
    whole = max(push, pull) + min(push, pull) / b + (r.server_sum_s or 0.0) + 2 * b * (alpha + r.latency_s)
    return whole, whole / b


def fit_network(rows: list[Row], every_method: bool = False) -> tuple[float, float]:
    """(α, η) from none's serial cells (with ``every_method``, every method's): least squares, in
    relative terms, of their measured communication time against messages·(α + L) + bytes·8 /
    (η·BW). η is the share of the shaped rate Gloo's collectives actually get (TCP framing,
    acknowledgements sharing the link, the collective's own pauses); (1, 0) when there is nothing
    to fit on."""
    import numpy as np
    pts = [r for r in rows if (every_method or r.compressor == BASELINE) and r.mode == "serial" and r.comm_s
           and r.nodes > 1 and r.comm == "allreduce"]
    if not pts:
        return 0.0, 1.0
    n = np.array([messages(r.reduce_calls or 0, r.gather_calls or 0, r.nodes) for r in pts])
    x = np.array([(r.expected_tx_bytes or 0) * 8 / r.bw_bps for r in pts])
    y = np.array([r.comm_s - m * r.latency_s for r, m in zip(pts, n)])
    w = 1 / np.array([r.comm_s for r in pts])
    if len(pts) >= 2 and np.ptp(n / np.maximum(x, 1e-12)) + np.ptp(x) > 0:
        (alpha, inv_eta), *_ = np.linalg.lstsq(np.stack([n * w, x * w], 1), y * w, rcond=None)
        if alpha >= 0 and inv_eta > 0:
            return float(alpha), float(1 / inv_eta)
    inv_eta = float(np.sum(x * y * w * w) / np.sum(x * x * w * w))     # α = 0: the rate alone
    return 0.0, 1 / inv_eta if inv_eta > 0 else 1.0


def fit(rows: list[Row], variant: str = "tail", network_from_every_method: bool = False) -> Fit | None:
    """λ and α from the none cells (α and η from every method's serial cells with
    ``network_from_every_method``), then every cell predicted; None without serial cells."""
    ph = phases(rows)
    usable = [r for r in rows if (*_setting(r), r.compressor) in ph and r.nodes > 1 and r.expected_tx_bytes]
    if not usable:
        return None
    alpha, eta = fit_network(usable, network_from_every_method)
    base = [r for r in usable if r.compressor == BASELINE and r.mode == "overlap"]

    def errors(lam: float, subset: list[Row]) -> list[float]:
        out = []
        for r in subset:
            whole, tail = _comm(r, alpha, eta)
            out.append(step_time(ph[(*_setting(r), r.compressor)], whole, tail, _mode(r), lam, variant) / r.step_s - 1)
        return out

    lam, lam_range, elsewhere = 1.0, None, False
    if base:
        # the least median error; where cells that λ does not touch (communication hides the compute) hold
        # the median flat over a range of λ, the least mean error among those, then the λ nearest 1. "Flat"
        # is within 1e-9 (relative): a tie must not be broken by rounding in the fitted α and η
        left = {g: [abs(e) for e in errors(g, base)] for g in LAMBDA_GRID}
        for measure in (statistics.median, statistics.fmean):
            best = min(measure(v) for v in left.values())
            left = {g: v for g, v in left.items() if measure(v) <= best + 1e-9}
        lam = min(left, key=lambda g: abs(g - 1))
        # the run of equals around the chosen λ (contiguous on the grid), so "every λ from a to b" holds
        i = j = LAMBDA_GRID.index(lam)
        while i > 0 and LAMBDA_GRID[i - 1] in left:
            i -= 1
        while j < len(LAMBDA_GRID) - 1 and LAMBDA_GRID[j + 1] in left:
            j += 1
        lam_range = (LAMBDA_GRID[i], LAMBDA_GRID[j])
        elsewhere = len(left) > j - i + 1
    result = Fit(variant, lam, alpha, eta, lam_range=lam_range, lam_ties_elsewhere=elsewhere)
    for r in usable:
        whole, tail = _comm(r, alpha, eta)
        p = ph[(*_setting(r), r.compressor)]
        predicted = step_time(p, whole, tail, _mode(r), lam, variant)
        pred = Prediction(r, predicted, whole, predicted / r.step_s - 1, fitted=r.compressor == BASELINE)
        result.predictions.append(pred)
    for pred in result.misses:
        pred.why = explain(pred, ph[(*_setting(pred.row), pred.row.compressor)], rows, result)
    return result


def explain(pred: Prediction, ph: Phases, rows: list[Row], fit: "Fit") -> str:
    """Which of the model's simplifications this cell runs into, read from its own measurements:
    in serial mode the phase that differs from the model's; in overlap mode how much overlap
    saved against the cell's serial twin (same method and link), compared with the model."""
    r, reasons, lam = pred.row, [], fit.lam
    base = [b for b in rows if b.group == r.group and b.compressor == BASELINE and b.bw_bps == r.bw_bps]
    if base and base[0].busbw_fraction is not None and base[0].busbw_fraction < 0.85:
        reasons.append(f"the host could not fill the link: none reached {base[0].busbw_fraction:.0%} of "
                       f"{r.bw_bps / 1e6:g} Mbit/s here, so the model's rate is too high")
    if r.mode == "serial":
        reasons += _serial_deltas(r, ph, pred.comm_s)
    else:
        twin = next((t for t in fit.predictions if t.row.mode == "serial" and t.row.compressor == r.compressor
                     and t.row.bw_bps == r.bw_bps and t.row.group[:4] == r.group[:4]), None)
        if twin is not None:
            saved, expected = twin.row.step_s - r.step_s, twin.predicted_s - pred.predicted_s
            if abs(saved - expected) > 0.05 * r.step_s:
                reasons.append(
                    f"overlap {_gain(saved)} against its serial run where the model expects it to {_gain(expected)}: "
                    f"λ = {lam:.2f} is one number fitted on none, whose large all-reduce "
                    + ("slows backward more than this method's exchange does on this host's cores" if saved > expected
                       else "overlaps better than this method's exchange, whose encode/decode and collectives "
                            "compete with backward for this host's cores"))
            if abs(twin.error) > TOLERANCE:
                reasons.append(f"its serial run is off by {twin.error:+.0%} as well: "
                               + "; ".join(_serial_deltas(twin.row, ph, twin.comm_s) or ["see that row"]))
    if r.step_s < 0.02:
        reasons.append("its steps are so short that timer and scheduling noise of a millisecond is over 5 %")
    return "; ".join(reasons) or "none of the model's known simplifications: an effect the model does not capture"


def _gain(seconds: float) -> str:
    return f"saved {seconds * 1e3:.0f} ms" if seconds >= 0 else f"cost {-seconds * 1e3:.0f} ms"


def _serial_deltas(r: Row, ph: Phases, comm_s: float) -> list[str]:
    """The phases of a serial cell that differ from the model's by more than 5 % of its step."""
    out = []
    for what, measured, model_s in (("forward + backward", r.compute_s, ph.compute), ("its collectives", r.comm_s, comm_s),
                                    ("encode", r.encode_s, ph.encode), ("decode", r.decode_s, ph.decode)):
        if measured is None or abs(measured - model_s) <= 0.05 * r.step_s:
            continue
        text = f"{what} took {measured * 1e3:.3g} ms against the model's {model_s * 1e3:.3g} ms"
        if what == "forward + backward":
            text += " (the workload's median: the host ran this cell " + ("slower)" if measured > model_s else "faster)")
        elif what == "its collectives" and r.gather_calls:
            text += (" (the rate is fitted on none's all-reduce; Gloo's two-call all-gather of a small payload gets "
                     "less of the link)")
        elif what == "its collectives" and (r.reduce_calls or 0) >= 8:
            text += (f" ({r.reduce_calls:.0f} small all-reduces a step: a cost per call that α, fitted on none's few "
                     "large ones, does not see)")
        out.append(text)
    return out


# ---- projection beyond this machine (model output, never a measurement) ----

def decode_slopes(rows: list[Row]) -> dict[tuple, float]:
    """Per (workload, batch size, method) of a gathering method measured at two or more node
    counts: how much its decode grows per node (seconds), the slope of the least-squares line
    through each node count's median decode (not below 0). How a decode
    grows with the peers is the method's own: DGC adds each peer's few (index, value) pairs into
    one dense bucket and barely grows, the reference 2-bit unpacks each peer's codes into a whole
    bucket and grows about a bucket per peer; so it is read from the cells, not assumed."""
    by: dict[tuple, dict[int, list[float]]] = {}
    coded = [r for r in rows if r.gather_calls and r.decode_s is not None and r.comm == "allreduce"]
    serial = {(undilated_workload(r), r.batch_size, r.compressor) for r in coded if r.mode == "serial"}
    for r in coded:                     # serial cells where a method has them, as ``phases`` reads its decode
        key = (undilated_workload(r), r.batch_size, r.compressor)      # a replay's whatever its K
        if r.mode == "serial" or key not in serial:
            by.setdefault(key, {}).setdefault(r.nodes, []).append(r.decode_s)
    out = {}
    for key, counts in by.items():
        if len(counts) < 2:
            continue
        slope = statistics.linear_regression(list(counts), [statistics.median(v) for v in counts.values()]).slope
        out[key] = max(0.0, slope)
    return out


def _scaled(r: Row, ph: Phases, p: int, bw: float, latency_s: float, f: "Fit", mode: str = "overlap",
            slope: float | None = None) -> float:
    """Row ``r``'s step time predicted for ``p`` nodes at ``bw`` in ``mode``: bytes and messages
    follow the ring formulas for p; a gathering method's decode grows by ``slope`` a node (its
    ``decode_slopes``), or, measured at one node count only, in proportion to the nodes (one
    payload decoded per rank: an assumption, which DGC's scatter into one bucket does not meet)."""
    p0 = r.nodes
    reduce_bytes = (r.payload_bytes or 0) - (r.gather_bytes or 0)
    ring0 = 2 * (p0 - 1) / p0 * reduce_bytes
    gather_sent = ((r.expected_tx_bytes or 0) - ring0) / (p0 - 1)
    tx = 2 * (p - 1) / p * reduce_bytes + (p - 1) * gather_sent
    n = messages(r.reduce_calls or 0, r.gather_calls or 0, p)
    whole = comm_time(tx, n, bw, latency_s, f.alpha_s, f.eta)
    share = (r.tail_tx_bytes or 0) / r.expected_tx_bytes if r.expected_tx_bytes else 1.0
    decode = ph.decode
    if r.gather_calls:
        decode = max(0.0, ph.decode + slope * (p - p0)) if slope is not None else ph.decode * p / p0
    scaled = dataclasses.replace(ph, decode=decode)
    return step_time(scaled, whole, whole * share, mode, f.lam, f.variant)


CELL = (*SAME_CELL, "dilate")


def per_cell(rows: list[Row]) -> list[Row]:
    """One row per cell: a cell's repeats merged into the median of each measured figure (a figure
    that some repeat lacks is the median of those that have it), over the repeats the host did not
    pace (``Row.paced``: False, or None where no test judged it, which counts as not paced) where it
    has any: a run the host paced (its cores saturated, a hypervisor's steal, the dilation test)
    measured the host, and its twin measured the cell. A cell every repeat of which the host paced
    is the median of them all, host-bound by either test when any repeat was."""
    cells: dict[tuple, list[Row]] = {}
    for r in rows:
        cells.setdefault(tuple(getattr(r, k) for k in CELL), []).append(r)
    measured = [f.name for f in dataclasses.fields(Row) if f.name not in CELL and f.type in ("float", "float | None")]
    out = []
    for runs in cells.values():
        runs = [r for r in runs if not r.paced] or runs
        merged = {k: statistics.median(v) for k in measured
                  if (v := [getattr(r, k) for r in runs if getattr(r, k) is not None])}
        flags = {k: [f for r in runs if (f := getattr(r, k)) is not None] for k in ("host_bound", "dilation_paced")}
        out.append(dataclasses.replace(runs[0], **merged, **{k: any(v) if v else None for k, v in flags.items()}))
    return out


def held_out(rows: list[Row], fit_nodes: set[int], variant: str = "tail") -> dict | None:
    """The model where it was not fitted: λ, α, η and every phase fitted on the cells of
    ``fit_nodes`` only, then each ring cell of another node count predicted from its twin among
    them (same workload, a replay's at any dilation, batch, latency, method and mode; the same
    bandwidth where there is one, the most nodes, the highest dilation) the way ``project``
    extrapolates: bytes and messages by the ring formulas, a gathering method's decode by its slope
    over the fitted node counts. A replayed cell swept at several dilations is predicted at its
    highest only, the dilation test's reference, so one node count's error is not a mix of Ks.
    α and η come from every method's serial
    cells there, not none's alone: none's step has two large all-reduces whose messages and bytes
    both grow with the nodes, so on its own it cannot tell a cost per message from a lower rate,
    and one slow node count among three turns into a steep α (measured: 0.26 ms on 2-8 replayed
    nodes, 73-124 % off at 16-64, docs/replay.md); a gathering method's many small messages pin α.
    The question here is the node count, not the method. Per node count: the median absolute error
    and each cell's. Also the measured speedup over none by node count, so whether a method's
    advantage shrinks as nodes grow is seen measured, not only projected. A cell repeated
    (``sweep --repeat``) counts once, as its median (``per_cell``, over the repeats the host did not
    pace), so one slow run of a node count cannot set α on its own. A cell the host may have paced
    (``Row.paced``: by its counters or by the dilation test) is predicted and counted like the
    others, and marked; per node count, the error without those cells too
    (``median_abs_error_host_free``, None when every cell there was host-bound). Such cells among
    the fitted node counts are fitted like the others and counted (``host_bound_fit_cells``): λ, α
    and η then carry some of the host's pace, which the report says. None when the
    fitted node counts have no serial none cells to fit on."""
    rows = per_cell(rows)
    train = [r for r in rows if r.nodes in fit_nodes]
    f = fit(train, variant, network_from_every_method=True)
    if f is None:
        return None
    ph, slopes = phases(train), decode_slopes(train)
    top = top_dilation(rows)
    cells_out, by_nodes = [], {}
    for r in rows:
        if r.nodes in fit_nodes or r.comm != "allreduce" or not r.expected_tx_bytes or not r.step_s \
                or r.dilate < top[undilated_cell(r)]:
            continue
        twins = [t for t in train if (undilated_workload(t), t.batch_size, t.latency_s, t.compressor, t.mode, t.comm) ==
                 (undilated_workload(r), r.batch_size, r.latency_s, r.compressor, r.mode, "allreduce")
                 and t.nodes > 1 and t.expected_tx_bytes and (*_setting(t), t.compressor) in ph]
        if not twins:
            continue
        twin = max(twins, key=lambda t: (t.bw_bps == r.bw_bps, t.nodes, -abs(math.log(t.bw_bps / r.bw_bps)), t.dilate))
        predicted = _scaled(twin, ph[(*_setting(twin), twin.compressor)], r.nodes, r.bw_bps, r.latency_s, f, r.mode,
                            slopes.get((undilated_workload(twin), twin.batch_size, twin.compressor)))
        cell = {"nodes": r.nodes, "compressor": r.compressor, "mode": r.mode, "bw_bps": r.bw_bps,
                "measured_s": r.step_s, "predicted_s": predicted, "error": predicted / r.step_s - 1,
                "from_nodes": twin.nodes, "host_bound": r.paced}
        cells_out.append(cell)
        by_nodes.setdefault(r.nodes, []).append((abs(cell["error"]), bool(r.paced)))
    speedups: dict[str, dict[int, float]] = {}
    for r in rows:
        none = [b for b in rows if b.compressor == BASELINE and (b.workload, b.batch_size, b.latency_s, b.nodes, b.bw_bps,
                                                                  b.mode, b.comm) ==
                (r.workload, r.batch_size, r.latency_s, r.nodes, r.bw_bps, r.mode, r.comm)]
        if r.compressor != BASELINE and r.mode == "overlap" and none and r.step_s:
            key = f"{r.compressor} @ {r.bw_bps / 1e6:g} Mbit/s"
            speedups.setdefault(key, {})[r.nodes] = none[0].step_s / r.step_s
    return {"fit_nodes": sorted(fit_nodes), "lambda": f.lam, "lambda_range": f.lam_range,
            "lambda_ties_elsewhere": f.lam_ties_elsewhere,
            "lambda_identified": f.lam_identified, "alpha_s": f.alpha_s, "eta": f.eta,
            "host_bound_fit_cells": sum(bool(r.paced) for r in train),
            "by_nodes": {p: {"median_abs_error": statistics.median(x for x, _ in e), "cells": len(e),
                             "host_bound_cells": sum(b for _, b in e),
                             "median_abs_error_host_free": statistics.median(free) if (free := [x for x, b in e if not b]) else None}
                         for p, e in sorted(by_nodes.items())},
            "cells": cells_out, "measured_speedup": speedups}


def project(rows: list[Row], f: Fit, nodes: list[int], bandwidths: list[float]) -> list[dict]:
    """Per setting and method: predicted speedup over none at each (p, bw), and the break-even
    bandwidth for each p, found by bisection in log-bandwidth between 1 Mbit/s and 1 Tbit/s.
    Ring runs only: a parameter server's or local SGD's bytes at other node counts are not ring formulas."""
    ph, slopes = phases(rows), decode_slopes(rows)
    out = []
    reps: dict[tuple, Row] = {}
    ring = (r for r in rows if r.nodes > 1 and r.expected_tx_bytes and r.comm == "allreduce")
    for r in sorted(ring, key=lambda r: (r.mode != "overlap", -r.bw_bps)):
        reps.setdefault((*_setting(r), r.latency_s, r.compressor), r)
    for key, r in sorted(reps.items()):
        none = reps.get((*key[:4], BASELINE))
        if r.compressor == BASELINE or none is None:
            continue
        pm, pn = ph.get((*_setting(r), r.compressor)), ph.get((*_setting(none), BASELINE))
        if pm is None or pn is None:
            continue

        def speedup(p: int, bw: float) -> float:
            return (_scaled(none, pn, p, bw, r.latency_s, f)
                    / _scaled(r, pm, p, bw, r.latency_s, f,
                              slope=slopes.get((undilated_workload(r), r.batch_size, r.compressor))))
        entry = {"workload": r.workload, "batch_size": r.batch_size, "latency_s": r.latency_s, "measured_nodes": r.nodes,
                 "compressor": r.compressor, "speedup": {}, "break_even_bps": {}}
        for p in nodes:
            for bw in bandwidths:
                entry["speedup"][f"{p}@{bw:g}"] = speedup(p, bw)
            entry["break_even_bps"][p] = _solve(lambda bw: speedup(p, bw) - 1)
        out.append(entry)
    return out


def _solve(g, lo: float = 1e6, hi: float = 1e12) -> float | str:
    """Bandwidth where ``g`` falls through 0; "above 1 Tbit/s" or "below 1 Mbit/s" at the ends."""
    if g(hi) >= 0:
        return "above 1 Tbit/s"
    if g(lo) < 0:
        return "below 1 Mbit/s"
    a, b = math.log(lo), math.log(hi)
    for _ in range(60):
        m = (a + b) / 2
        if g(math.exp(m)) >= 0:
            a = m
        else:
            b = m
    return math.exp((a + b) / 2)
