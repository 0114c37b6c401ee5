"""A results store filled with runs made up from known phase times, for testing analysis without
training: every step of every rank is written through the real Recorder, as workers write them."""

from __future__ import annotations

import json

from gctestbed import results
from gctestbed.spec import LinkSpec, RunSpec

# per method: (payload bytes per step, of which gathered, reduce calls, gather calls, encode s, decode s)
METHODS = {
    "none": (4_000_000, 0, 2, 0, 0.0005, 0.0),
    "fp16": (2_000_000, 0, 2, 0, 0.005, 0.005),
    "twobit": (250_000, 250_000, 0, 4, 0.004, 0.003),
}
COMPUTE_S, OPTIM_S = 0.05, 0.005
LAMBDA, ALPHA_S, ETA = 1.2, 0.0002, 0.9
DECODE_PER_PEER = True      # a gathering method decodes every node's payload; False: its decode does not grow
BWS = (10e6, 30e6, 100e6, 300e6, 1e9)


def true_step(method: str, bw: float, mode: str, nodes: int = 2) -> tuple[float, float, float]:
    """(step, comm, expected tx bytes) the way gctestbed.analysis.model says a step goes, with the
    last of two equal buckets outside the overlap."""
    payload, gathered, reduce_calls, gather_calls, enc, dec = METHODS[method]
    p = nodes
    tx = 2 * (p - 1) / p * (payload - gathered) + (p - 1) * gathered
    comm = (reduce_calls * 2 + gather_calls) * (p - 1) * ALPHA_S + tx * 8 / (bw * ETA)
    dec = dec * p / 2 if gathered and DECODE_PER_PEER else dec             # a gathering method decodes every node's payload
    if mode == "serial":
        return COMPUTE_S + comm + enc + dec + OPTIM_S, comm, tx
    return max(LAMBDA * COMPUTE_S, comm / 2) + comm / 2 + enc + dec + OPTIM_S, comm, tx


def fill(results_dir: str, sweep: str = "synthetic", steps: int = 4, methods=("none", "fp16", "twobit"),
         bws=BWS, modes=("overlap", "serial"), loss_of=lambda method, step: 2.3 - 0.1 * step, nodes=(2,),
         seed: int = 0) -> int:
    """Write one finished run per (nodes, method, bw, mode) and mark it a sweep cell; returns the count."""
    count = 0
    for method, n, bw, mode in ((m, n, b, d) for n in nodes for m in methods for b in bws for d in modes):
        spec = RunSpec(nodes=n, link=LinkSpec(bw_bps=int(bw)), compressor=method, workload="mlp",
                       steps=steps, batch_size=32, mode=mode, results_dir=results_dir, seed=seed,
                       run_id=(f"n{n}-" if n != 2 else "") + f"{method}{int(bw)}{mode}" + (f"-s{seed}" if seed else ""))
        rec = results.Recorder(results_dir, spec.run_id)
        rec.start_run(spec, {})
        step_s, comm_s, tx = true_step(method, bw, mode, n)
        payload, gathered, reduce_calls, gather_calls, enc, dec = METHODS[method]
        dec = dec * n / 2 if gathered and DECODE_PER_PEER else dec
        compute = COMPUTE_S if mode == "serial" else step_s - OPTIM_S
        for step in range(steps):
            for rank in range(n):
                rec.step(rank, step, step_s=step_s, compute_s=compute, optim_s=OPTIM_S, comm_s=comm_s,
                         encode_s=enc, decode_s=dec, loss=loss_of(method, step), payload_bytes=payload,
                         gather_bytes=gathered, expected_tx_bytes=round(tx), reduce_calls=reduce_calls,
                         gather_calls=gather_calls, buckets=2, tail_tx_bytes=round(tx / 2))
        rec.finish_run("ok")
        params = {"workload": "mlp", "batch_size": "32", "nodes": str(n), "latency": "0", "bw": str(int(bw)) + "bit",
                  "compressor": method, "mode": mode}
        results.mark_cell(rec.conn, sweep, json.dumps(params, sort_keys=True), 0, "ok", spec.run_id)
        rec.close()
        count += 1
    return count


# ---- parameter servers and local steps, on the same phases and network as the ring's ----

PS_PUSH = 250_000               # a twobit payload a worker pushes per step, over two buckets
PS_SUM_S = 0.004                # the server's decoding and summing per step
DENSE = METHODS["none"][0]      # a dense pull: the whole fp32 gradient
PERIOD = 4


def ps_true_step(bw: float, mode: str) -> tuple[float, float]:
    """(step, comm) of two workers and one server with a dense pull: the server's link carries both
    workers' pushes in and both pulls out, so it, not a worker's, bounds each phase; the two
    buckets pipeline a push behind the other's pull."""
    _, _, _, _, enc, dec = METHODS["twobit"]
    rate = bw * ETA
    push, pull = 2 * PS_PUSH * 8 / rate, 2 * DENSE * 8 / rate
    comm = max(push, pull) + min(push, pull) / 2 + PS_SUM_S + 2 * 2 * ALPHA_S
    if mode == "serial":
        return COMPUTE_S + comm + enc + dec + OPTIM_S, comm
    return max(LAMBDA * COMPUTE_S, comm / 2) + comm / 2 + enc + dec + OPTIM_S, comm


def local_step(step: int, steps: int, bw: float) -> tuple[float, float, int]:
    """(step, averaging, bytes sent) of local SGD on two workers: compute alone, and every PERIOD
    steps (and after the last) a ring all-reduce of the whole fp32 model."""
    if (step + 1) % PERIOD and step != steps - 1:
        return COMPUTE_S + OPTIM_S, 0.0, 0
    tx = DENSE                               # 2(p-1)/p of the model for p = 2
    sync = 2 * ALPHA_S + tx * 8 / (bw * ETA)
    return COMPUTE_S + OPTIM_S + sync, sync, tx


def fill_schemes(results_dir: str, sweep: str = "synthetic", steps: int = 9, bws=BWS) -> int:
    """Next to ``fill``'s ring cells: twobit over one parameter server (both modes) and none over
    local SGD (overlap), every bandwidth; the server's own rows included."""
    from gctestbed.comm import schemes
    count = 0
    for comm, modes in (("ps:servers=1", ("overlap", "serial")), (f"localsgd:period={PERIOD}", ("overlap",))):
        name, options = schemes.resolve(comm)
        method = "twobit" if name == "ps" else "none"
        for bw in bws:
            for mode in modes:
                run_id = f"{name}{int(bw)}{mode}"
                spec = RunSpec(nodes=2, link=LinkSpec(bw_bps=int(bw)), compressor=method, workload="mlp", steps=steps,
                               batch_size=32, mode=mode, results_dir=results_dir, run_id=run_id, comm=name,
                               comm_options=options)
                rec = results.Recorder(results_dir, run_id)
                rec.start_run(spec, {})
                for step in range(steps):
                    if name == "ps":
                        enc, dec = METHODS["twobit"][4:]
                        step_s, comm_s = ps_true_step(bw, mode)
                        values = dict(step_s=step_s, compute_s=COMPUTE_S if mode == "serial" else step_s - OPTIM_S,
                                      comm_s=comm_s, encode_s=enc, decode_s=dec, payload_bytes=PS_PUSH, gather_bytes=0,
                                      expected_tx_bytes=PS_PUSH, reduce_calls=0, gather_calls=0, buckets=2,
                                      tail_tx_bytes=PS_PUSH // 2)
                        rec.server_step(2, step, sum_s=PS_SUM_S, wait_s=0.0, send_s=0.0, messages=4,
                                        push_bytes=2 * PS_PUSH, pull_bytes=2 * DENSE, tx_bytes=2 * DENSE, rx_bytes=2 * PS_PUSH)
                    else:
                        step_s, sync_s, tx = local_step(step, steps, bw)
                        values = dict(step_s=step_s, compute_s=COMPUTE_S, comm_s=None, encode_s=0.0, decode_s=0.0,
                                      payload_bytes=0, gather_bytes=0, expected_tx_bytes=tx, reduce_calls=int(tx > 0),
                                      gather_calls=0, buckets=0, tail_tx_bytes=None, sync_s=sync_s)
                    for rank in range(2):
                        rec.step(rank, step, optim_s=OPTIM_S, loss=2.3 - 0.1 * step, **values)
                rec.finish_run("ok")
                params = {"workload": "mlp", "batch_size": "32", "nodes": "2", "latency": "0", "bw": str(int(bw)) + "bit",
                          "compressor": method, "mode": mode, "comm": comm}
                results.mark_cell(rec.conn, sweep, json.dumps(params, sort_keys=True), 0, "ok", spec.run_id)
                rec.close()
                count += 1
    return count
