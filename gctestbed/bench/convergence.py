"""Does each method still learn? The same small task trained once per method, against ``none``.

A 2-node mlp on the teacher task (fast link: this measures learning, not speed), every method
with the options in TUNED where the method's defaults are tied to a gradient scale. Reported per
method: final training loss (mean of the last 10 steps), held-out loss and accuracy, and the
step at which the 10-step mean training loss first reaches the level the baseline ends at (x 1.05).
Any workload (the sources' architectures, on real digits with ``data=digits``), optimizer and
baseline (``none``, or ``fp16``/``bf16``, what many already run) can replace the defaults.
"""

from __future__ import annotations

import math
from typing import Callable

from .. import compress, flags, optimizers, results, runner
from ..launch.kept import kept_for
from ..spec import LinkSpec, RunSpec

WORKLOAD = {"width": 256, "depth": 2, "input_dim": 64, "classes": 10}
# Options set where a default is tied to a gradient scale (thresholds, sign magnitudes) or where the
# paper's recipe includes it (DGC's local clipping, PowerSGD's rank); chosen by sweeps on this task
# recorded in docs/compressors.md. Ratio-based methods (topk, randomk) keep their defaults.
TUNED = {
    "powersgd": "powersgd:rank=4,start_iter=10",
    "dgc": "dgc:ratio=0.001,steps_per_epoch=10,clip_norm=1",
    "variance": "variance:alpha=5",
    "hybrid": "hybrid:alpha=1000,tau=0.01",
    "twobit": "twobit:threshold=0.03",
    "threshold": "threshold:tau=0.03",
    "onebit": "onebit:scale=0.01",
    "signum": "signum:scale=0.01",
}
WINDOW = 10


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _smooth(losses: list[float]) -> list[float]:
    return [sum(losses[max(0, i - WINDOW + 1):i + 1]) / len(losses[max(0, i - WINDOW + 1):i + 1]) for i in range(len(losses))]


def run(methods: list[str], nodes: int = 2, steps: int = 200, results_dir: str = "results/convergence",
        on_cell: Callable[[str], None] = lambda s: None, workload: str | None = None, optimizer: str = "sgd",
        lr: float = 0.05, batch_size: int = 64, baseline: str = "none") -> dict:
    """Every method on the same task; ``workload`` as typed (default: the mlp teacher task)."""
    wl_name, wl_options = flags.resolve_workload(workload) if workload else ("mlp", WORKLOAD)
    opt_name, opt_options = optimizers.resolve(optimizer)
    rows = {}
    with kept_for("bench convergence") as kept:      # one network and fork server for every method, as a sweep's
        for method in methods:
            on_cell(method)
            name, options = compress.resolve(TUNED.get(method, method))     # NAME or NAME:key=value,...
            if not optimizers.compatible(opt_name, compress.create(name, options, kernels="torch").momentum_inside):
                continue                # applies momentum itself: not with Adam (optimizers.check says why)
            spec = RunSpec(nodes=nodes, link=LinkSpec(bw_bps=1_000_000_000), compressor=name, compressor_options=options,
                           workload=wl_name, workload_options=wl_options, steps=steps, batch_size=batch_size, lr=lr, seed=0,
                           optimizer=opt_name, optimizer_options=opt_options, calibrate=False, results_dir=results_dir)
            summary = runner.run(spec, kept=kept)
            conn = results.connect(results_dir)
            # SQLite keeps NaN as NULL: a diverged step reads as None, and is reported as diverged
            losses = [math.nan if loss is None else loss for loss in results.losses(conn, summary.run_id)]
            conn.close()
            rows[method] = {"compressor": TUNED.get(method, method) if ":" in TUNED.get(method, method) else name, "run_id": summary.run_id, "status": summary.status,
                            "final_loss": _finite(sum(losses[-WINDOW:]) / max(1, len(losses[-WINDOW:]))),
                            # a NaN gradient now stops the run at that step (compress/hook.py), so its error says so
                            "diverged": any(math.isnan(v) or math.isinf(v) for v in losses)
                                        or "NaN or Inf" in (summary.error or ""),
                            "eval_loss": summary.eval_loss, "eval_accuracy": summary.eval_accuracy,
                            "payload_bytes_per_step": summary.payload_bytes_per_step, "smoothed": _smooth(losses)}
    base = rows.get(baseline)
    if base:
        target = base["smoothed"][-1] * 1.05
        for row in rows.values():
            row["steps_to_target"] = next((i + 1 for i, v in enumerate(row["smoothed"]) if v <= target), None)
            row["accuracy_vs_baseline"] = (row["eval_accuracy"] - base["eval_accuracy"]) \
                if row["eval_accuracy"] is not None and base["eval_accuracy"] is not None else None
            if row["diverged"]:
                row["steps_to_target"] = None
            row["bytes_vs_baseline"] = (row["payload_bytes_per_step"] / base["payload_bytes_per_step"]
                                    if row["payload_bytes_per_step"] else None)
        target_loss = target
    else:
        target_loss = None
    for row in rows.values():
        row.pop("smoothed")
    return {"nodes": nodes, "steps": steps, "workload": {wl_name: wl_options}, "optimizer": {opt_name: opt_options},
            "baseline": baseline, "target_loss": target_loss, "methods": rows}
