"""The report of a results store: break-even table, model fit and projection, pictures, exports.

``build`` analyses the store and writes into ``out``: one PNG per picture and group, a
self-contained ``report.html`` (pictures embedded), ``cells.csv`` (one row per measured cell) and
``report.json`` (everything the HTML shows, as data). The terminal table is drawn by the CLI from
the same dictionary.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import html
import json
import os
import re
import time

from . import accuracy, breakeven, cells, model, plots
from ..spec import UserError, format_duration, format_rate

NO_MODEL = ("no model: it takes compute, encode and decode times from serial cells; sweep with --mode overlap,serial "
            "(and include none) to fit it")
PROJECT_NODES = (8, 64, 256)
PROJECT_BW = (1e9, 10e9, 100e9)
CSV_FIELDS = ("run_id", "sweep", "repeat", "seed", "workload", "compressor", "nodes", "bw_bps", "latency_s", "batch_size", "mode",
              "step_s", "compute_s", "encode_s", "comm_s", "decode_s", "optim_s", "payload_bytes", "expected_tx_bytes",
              "busbw_fraction", "final_loss", "dilate", "host_bound", "dilation_excess", "dilation_paced", "paced")


def fmt_bw(bps: float | None) -> str:
    """Three significant digits in tc's units: 4.63gbit."""
    return "-" if bps is None else format_rate(float(f"{bps:.3g}"))


def dilated_label(dilated: dict[str, int]) -> str:
    """What the report says of its dilated cells (--dilate K), whose times and rates are emulated."""
    return ("Dilated cells: " + ", ".join(f"{n} dilated x{k}" for k, n in dilated.items())
            + "; their times and rates are in emulated units (host seconds / K), as every other cell's are in seconds.")


def host_bound_label(run_ids: list[str]) -> str:
    """What the report says of the runs the host, not the link, may have paced (a repeated cell's
    runs each counted)."""
    return (f"HOST-BOUND runs: {len(run_ids)} ({', '.join(run_ids)}): this host, not the emulated link, may have "
            "set their step times ('gctestbed show RUN' says why from the host's counters; the dilation test, "
            "below where there is one, from the same cell at a higher K); their figures are the host's.")


def write_cells_csv(rows: list[cells.Row], path: str) -> None:
    """One line per measured cell, CSV_FIELDS; a yes/no figure as 1 or 0, empty where there is none
    (a real run's host_bound, an untested run's dilation_paced), so a reader cannot take a missing
    figure for a no. host_bound is the counters' verdict alone, dilation_paced the dilation test's."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in rows:
            w.writerow([int(v) if isinstance(v := getattr(r, k), bool) else v for k in CSV_FIELDS])


def dilation_label(tested: list[dict]) -> str:
    """What the report says of the cells the dilation test could judge (cells.dilation_test)."""
    slow = [t for t in tested if t["excess"] > cells.DILATION_TOLERANCE]
    return (f"Dilation test: {len(tested)} runs of cells measured at several K, each against its cell's highest K; "
            f"{len(slow)} slower by more than {cells.DILATION_TOLERANCE:.0%}, so paced in part by work the dilation "
            "does not stretch (marked HOST-BOUND)" + (": " + "; ".join(
                f"{t['cell']} x{t['dilate']:g} {t['excess']:+.1%} against x{t['against']:g}" for t in slow) if slow else "")
            + ". The highest K of a cell carries some of that work too.")


def lambda_label(m: dict) -> str:
    """λ as fitted, or, where none's overlap cells fit a range of λ equally well (or best at the
    grid's edge), as the choice it is (model.why_unidentified)."""
    lo_hi = m.get("lambda_range")
    if m.get("lambda_identified", True) or not lo_hi:
        return f"λ {m['lambda']:.3f}"
    lo, hi, elsewhere = *lo_hi, bool(m.get("lambda_ties_elsewhere"))
    return (f"λ {m['lambda']:.3f} (not identified: {model.why_unidentified(lo, hi, elsewhere)}"
            + (")" if model.at_edge(lo, hi, elsewhere) else "; the one nearest 1 is taken)"))


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:80]


def analyse(rows: list[cells.Row], curves: list | None = None, fits: dict | None = None, baseline: str = "none",
            target_accuracy: float | None = None, target_loss: float | None = None,
            fit_nodes: set[int] | None = None) -> dict:
    """Everything the report shows, as data; ``curves`` and ``fits`` when the caller has them;
    with ``fit_nodes``, the model fitted on those node counts only and tested on the others."""
    curves = breakeven.curves(rows, baseline) if curves is None else curves
    fits = {v: model.fit(rows, v) for v in model.VARIANTS} if fits is None else fits
    main = fits["tail"]
    groups = sorted({r.group for r in rows}, key=str)
    best = breakeven.best_per_bandwidth(rows)
    out = {
        "generated_at": time.time(),
        "cells": len(rows),
        "dilated": {f"{k:g}": sum(r.dilate == k for r in rows) for k in sorted({r.dilate for r in rows} - {1.0})},
        "baseline": baseline,
        "time_to_accuracy": accuracy.table(rows, baseline, target_accuracy, target_loss),
        "groups": [{"label": cells.group_label(g), "key": list(g)} for g in groups],
        "break_even": [{"group": cells.group_label(c.group), "compressor": c.compressor, "kind": c.crossing.kind,
                        "bw_bps": c.crossing.bw_bps, "low_bps": c.crossing.low_bps, "high_bps": c.crossing.high_bps,
                        "text": c.crossing.text(fmt_bw), "flags": c.flags,
                        "points": [dataclasses.asdict(p) for p in c.points]} for c in curves],
        "best": {cells.group_label(g): [{"bw_bps": bw, "compressor": label, "step_s": t} for bw, label, t in b]
                 for g, b in best.items()},
        "model": {},
        "projection": None,
        "held_out": model.held_out(rows, fit_nodes) if fit_nodes else None,
        # cells whose compute came from a trace (docs/replay.md): their workload label names it
        "replayed": sorted({r.workload for r in rows if r.workload.startswith("replay of ")}),
        # replayed cells the host, not the link, may have paced by its counters (show's HOST-BOUND) or by the
        # dilation test: their figures are the host's
        "host_bound": sorted(r.run_id for r in rows if r.paced),
        # replayed cells measured at several K (cells.dilation_test): each against its highest K
        "dilation_test": [{"run_id": r.run_id, "cell": f"{r.method}, {r.nodes} nodes, {r.mode}, {fmt_bw(r.bw_bps)}", "dilate": r.dilate,
                           "against": r.dilated_from, "excess": r.dilation_excess}
                          for r in sorted(rows, key=lambda r: (r.compressor, r.nodes, r.mode, r.dilate))
                          if r.dilation_excess is not None],
    }
    for t in out["time_to_accuracy"]:
        for b in t["break_even"]:
            b["text"] = breakeven.Crossing(b["kind"], b["bw_bps"], b["low_bps"], b["high_bps"]).text(fmt_bw)
    for variant, f in fits.items():
        if f is None:
            continue
        out["model"][variant] = {
            "lambda": f.lam, "lambda_range": f.lam_range, "lambda_identified": f.lam_identified,
            "lambda_ties_elsewhere": f.lam_ties_elsewhere,
            "alpha_s": f.alpha_s, "eta": f.eta, "median_abs_error": f.median_error,
            "fit_median_abs_error": f.fit_error, "predicted_cells": sum(not p.fitted for p in f.predictions),
            "misses": [{"group": cells.group_label(p.row.group), "compressor": p.row.compressor, "bw_bps": p.row.bw_bps,
                        "measured_s": p.row.step_s, "predicted_s": p.predicted_s, "error": p.error, "why": p.why}
                       for p in sorted(f.misses, key=lambda p: -abs(p.error))]}
    if main is not None:
        proj = model.project(rows, main, sorted({*PROJECT_NODES, *(r.nodes for r in rows)}), list(PROJECT_BW))
        out["projection"] = {"label": "MODEL OUTPUT, not measured: the fitted model at node counts and bandwidths "
                                      "this machine did not run (same per-node compute and batch, ring collectives)",
                             "nodes": sorted({*PROJECT_NODES, *(r.nodes for r in rows)}), "bandwidths_bps": list(PROJECT_BW),
                             "rows": proj}
    return out


def build(results_dir: str, out: str, sweep: str | None = None, baseline: str = "none",
          target_accuracy: float | None = None, target_loss: float | None = None,
          fit_nodes: set[int] | None = None) -> dict:
    """Analyse the store of ``results_dir`` (one sweep, or all) and write the report into ``out``;
    speedups and break-even against ``baseline`` (none, fp16 or bf16); with ``fit_nodes``, the
    model's error on the node counts it was not fitted on."""
    rows = cells.dilation_test(cells.load(results_dir, sweep))
    if not rows:
        raise UserError(f"{results_dir} has no finished runs to report on: run 'gctestbed sweep' first.")
    if fit_nodes:
        have = {r.nodes for r in rows}
        if not fit_nodes < have:
            raise UserError(f"--fit-nodes {','.join(map(str, sorted(fit_nodes)))} must be some of the node counts the "
                            f"cells ran ({', '.join(map(str, sorted(have)))}), leaving others to test on.")
    if baseline != "none" and not any(r.compressor == baseline for r in rows):
        raise UserError(f"no cell of {results_dir} ran the baseline '{baseline}': sweep it too "
                        f"(--compressor '{baseline};...') or choose another --baseline.")
    os.makedirs(out, exist_ok=True)
    curves = breakeven.curves(rows, baseline)
    fits = {v: model.fit(rows, v) for v in model.VARIANTS}
    report = analyse(rows, curves, fits, baseline, target_accuracy, target_loss, fit_nodes)
    report["results_dir"], report["sweep"] = os.path.abspath(results_dir), sweep
    pictures = []
    for g in sorted({r.group for r in rows}, key=str):
        slug = _slug(cells.group_label(g))
        pictures.append(plots.step_times(rows, g, os.path.join(out, f"step-time_{slug}.png")))
        if any(c.group == g for c in curves):
            pictures.append(plots.speedups(curves, g, os.path.join(out, f"speedup_{slug}.png")))
        pictures.append(plots.phases(rows, g, os.path.join(out, f"phases_{slug}.png")))
        pictures.append(plots.losses(rows, g, os.path.join(out, f"loss_{slug}.png")))
    fit = fits["tail"]
    if fit is not None and fit.predictions:
        pictures.append(plots.model_fit(fit, os.path.join(out, "model.png")))
    report["pictures"] = pictures
    write_cells_csv(rows, os.path.join(out, "cells.csv"))
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    with open(os.path.join(out, "report.html"), "w") as f:
        f.write(render_html(report))
    return report


def held_out_label(held: dict) -> str:
    fitted_paced = held.get("host_bound_fit_cells")
    return (f"{', '.join(map(str, held['fit_nodes']))} nodes ({lambda_label(held)}, α {held['alpha_s'] * 1e6:.0f} µs, "
            f"η {held['eta']:.3f})" + (f", {fitted_paced} of whose cells were HOST-BOUND: the fit carries some of the "
                                       "host's pace" if fitted_paced else ""))


def _table(head: list[str], rows: list[list[str]]) -> str:
    cells_ = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + f"</tr>{cells_}</table>")


def render_html(report: dict) -> str:
    """One page, no external files: pictures embedded as base64 PNG."""
    parts = [f"<h1>gctestbed report</h1><p>{report['cells']} cells from {html.escape(report['results_dir'])}"
             f"{' (sweep ' + html.escape(report['sweep']) + ')' if report['sweep'] else ''}.</p>"
             + (f"<p><b>Replayed cells</b> (compute from a trace, everything on the wire real; docs/replay.md): "
                f"{html.escape('; '.join(report['replayed']))}.</p>" if report.get("replayed")
                else "<p>Every cell ran its model for real (no replayed cells).</p>")
             + (f"<p>{html.escape(dilated_label(report['dilated']))}</p>" if report.get("dilated") else "")
             + (f"<p><b>{html.escape(host_bound_label(report['host_bound']))}</b></p>" if report.get("host_bound") else "")
             + (f"<p>{html.escape(dilation_label(report['dilation_test']))}</p>" if report.get("dilation_test") else ""),
             f"<h2>Break-even bandwidth</h2><p>Below it, the method's steps are faster than {html.escape(report['baseline'])}'s; above it, slower "
             "(interpolated in log-bandwidth; brackets: the range over repeats).</p>",
             _table(["setting", "method", "break-even", "flags"],
                    [[b["group"], b["compressor"], b["text"], "; ".join(b["flags"]) or "-"] for b in report["break_even"]])]
    parts.append("<h2>Time to accuracy</h2><p>Steps and seconds of training until the held-out accuracy first "
                 "reached the target (evaluated every --eval-every steps); speedup against the baseline at the same "
                 "bandwidth.</p>")
    for t in report["time_to_accuracy"]:
        target = (f"accuracy {t['target_accuracy']:.3f}" if t["target_accuracy"] is not None
                  else f"loss {t['target_loss']:.4g}")
        parts.append(f"<h3>{html.escape(t['group'])}: target {target}</h3>" + _table(
            ["method", "bandwidth", "steps", "seconds", "speedup", "final accuracy"],
            [[e["compressor"], fmt_bw(e["bw_bps"]), e["steps"] if e["steps"] is not None else "never",
              "-" if e["seconds"] is None else f"{e['seconds']:.2f}", "-" if e["speedup"] is None else f"{e['speedup']:.2f}x",
              "-" if e["final_accuracy"] is None else f"{e['final_accuracy']:.3f}"] for e in t["rows"]]))
        if t["break_even"]:
            parts.append(_table(["method", "break-even by time to the target"],
                                [[b["compressor"], b["text"]] for b in t["break_even"]]))
    parts.append("<h2>Fastest method per bandwidth</h2>")
    for group, best in report["best"].items():
        parts.append(f"<h3>{html.escape(group)}</h3>" + _table(["bandwidth", "fastest", "step time"],
                     [[fmt_bw(b["bw_bps"]), b["compressor"], f"{b['step_s'] * 1e3:.1f} ms"] for b in best]))
    parts.append("<h2>Performance model</h2>")
    if not report["model"]:
        parts.append(f"<p>{html.escape(NO_MODEL)}</p>")
    for variant, m in report["model"].items():
        parts.append(f"<h3>{'with the last bucket outside the overlap' if variant == 'tail' else 'as in the issue: all communication hideable'}</h3>"
                     f"<p>{html.escape(lambda_label(m))}, α = {m['alpha_s'] * 1e6:.0f} µs per message, η = {m['eta']:.3f} "
                     f"(fitted on none, median |error| there {pct(m['fit_median_abs_error'])}); median |error| over "
                     f"the {m['predicted_cells']} predicted cells: <b>{pct(m['median_abs_error'])}</b>.</p>")
        if not m["fit_median_abs_error"]:
            parts.append("<p>There were no <code>none</code> cells in both modes to fit on: λ = 1, α = 0 and η = 1 "
                         "are defaults, not fits.</p>")
        if m["misses"]:
            parts.append("<p>Cells off by more than 10 %, and why:</p>" + _table(
                ["setting", "method", "bandwidth", "measured", "model", "error", "why"],
                [[x["group"], x["compressor"], fmt_bw(x["bw_bps"]), f"{x['measured_s'] * 1e3:.1f} ms",
                  f"{x['predicted_s'] * 1e3:.1f} ms", f"{x['error']:+.0%}", x["why"]] for x in m["misses"]]))
    held = report.get("held_out")
    if held:
        parts.append(f"<h2>The model where it was not fitted</h2><p>Fitted on {held_out_label(held)}; each cell of "
                     "another node count predicted from its twin among those (bytes and messages by the ring "
                     "formulas).</p>" + _table(
                         ["nodes", "cells", "median |error|", "host-bound cells", "median |error| without them"],
                         [[p, v["cells"], pct(v["median_abs_error"]), v["host_bound_cells"],
                           pct(v["median_abs_error_host_free"])] for p, v in held["by_nodes"].items()]))
        counts = sorted({p for v in held["measured_speedup"].values() for p in v})
        if counts:
            parts.append("<p>Measured speedup over none by node count (overlap):</p>" + _table(
                ["method"] + [f"{p} nodes" for p in counts],
                [[k] + [f"{v[p]:.2f}x" if p in v else "-" for p in counts] for k, v in held["measured_speedup"].items()]))
    proj = report.get("projection")
    if proj and proj["rows"]:
        most = proj["nodes"][-1]
        parts.append(f"<h2>Projection</h2><p><b>{html.escape(proj['label'])}.</b></p>" + _table(
            ["setting", "method"] + [f"break-even, {p} nodes" for p in proj["nodes"]]
            + [f"speedup {p} nodes @ {fmt_bw(bw)}" for p in proj["nodes"][-1:] for bw in proj["bandwidths_bps"]],
            [[f"{r['workload']}, batch {r['batch_size']}, latency {format_duration(r['latency_s'])}", r["compressor"]]
             + [fmt_bw(v) if isinstance(v, float) else v for v in r["break_even_bps"].values()]
             + [f"{r['speedup'][f'{most}@{bw:g}']:.2f}x" for bw in proj["bandwidths_bps"]]
             for r in proj["rows"]]))
    parts.append("<h2>Pictures</h2>")
    for pic in report["pictures"]:
        with open(pic["path"], "rb") as f:
            data = base64.b64encode(f.read()).decode()
        parts.append(f"<figure><img alt=\"{html.escape(pic['title'])}\" src=\"data:image/png;base64,{data}\">"
                     f"<figcaption>{html.escape(pic['title'])}</figcaption></figure>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}table{border-collapse:collapse;"
             "margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
             "img{max-width:100%}figure{margin:1.5em 0}")
    return f"<!doctype html><html><head><meta charset=\"utf-8\"><title>gctestbed report</title><style>{style}</style></head><body>{''.join(parts)}</body></html>"
