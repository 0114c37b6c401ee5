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
BWS = (10e6, 30e6, 100e6, 300e6, 1e9)


def true_step(method: str, bw: float, mode: str, nodes: int = 2) -> tuple[float, float, float]:
    """(step, comm, expected tx bytes) the way gctestbed.analysis.model says a step goes, with the
    last of two equal buckets outside the overlap."""
    payload, gathered, reduce_calls, gather_calls, enc, dec = METHODS[method]
    p = nodes
    tx = 2 * (p - 1) / p * (payload - gathered) + (p - 1) * gathered
    comm = (reduce_calls * 2 + gather_calls) * (p - 1) * ALPHA_S + tx * 8 / (bw * ETA)
    if mode == "serial":
        return COMPUTE_S + comm + enc + dec + OPTIM_S, comm, tx
    return max(LAMBDA * COMPUTE_S, comm / 2) + comm / 2 + enc + dec + OPTIM_S, comm, tx


def fill(results_dir: str, sweep: str = "synthetic", steps: int = 4, methods=("none", "fp16", "twobit"),
         bws=BWS, modes=("overlap", "serial"), loss_of=lambda method, step: 2.3 - 0.1 * step) -> int:
    """Write one finished run per (method, bw, mode) and mark it a sweep cell; returns the count."""
    count = 0
    for method in methods:
        for bw in bws:
            for mode in modes:
                spec = RunSpec(nodes=2, link=LinkSpec(bw_bps=int(bw)), compressor=method, workload="mlp",
                               steps=steps, batch_size=32, mode=mode, results_dir=results_dir, run_id=f"{method}{int(bw)}{mode}")
                rec = results.Recorder(results_dir, spec.run_id)
                rec.start_run(spec, {})
                step_s, comm_s, tx = true_step(method, bw, mode)
                payload, gathered, reduce_calls, gather_calls, enc, dec = METHODS[method]
                compute = COMPUTE_S if mode == "serial" else step_s - OPTIM_S
                for step in range(steps):
                    for rank in range(2):
                        rec.step(rank, step, step_s=step_s, compute_s=compute, optim_s=OPTIM_S, comm_s=comm_s,
                                 encode_s=enc, decode_s=dec, loss=loss_of(method, step), payload_bytes=payload,
                                 gather_bytes=gathered, expected_tx_bytes=round(tx), reduce_calls=reduce_calls,
                                 gather_calls=gather_calls, buckets=2, tail_tx_bytes=round(tx / 2))
                rec.finish_run("ok")
                params = {"workload": "mlp", "batch_size": "32", "nodes": "2", "latency": "0", "bw": str(int(bw)) + "bit",
                          "compressor": method, "mode": mode}
                results.mark_cell(rec.conn, sweep, json.dumps(params, sort_keys=True), 0, "ok", spec.run_id)
                rec.close()
                count += 1
    return count
