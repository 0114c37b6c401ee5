"""The claims report: one picture per claim, a self-contained HTML page and claims.json.

Each picture shows every part's measured figure with its interval and the region where the claim
holds, so a reader sees at once how far from the line a verdict fell. A claim measured at toy
scale says so in its heading.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os

COLOURS = {"agree": "#2a7d2a", "disagree": "#b22222", "inconclusive": "#8a6d00", "out of scope here": "#666666"}


def _pyplot():
    """matplotlib's pyplot on its file backend, imported where a picture is drawn: every command
    imports this module, and matplotlib would add half a second to each."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def picture(claim: dict, path: str) -> str:
    """Each part's figure (dot) and interval (bar) against its region (shaded)."""
    plt = _pyplot()
    parts = claim["parts"]
    fig, axes = plt.subplots(len(parts), 1, figsize=(7, 1.3 * len(parts) + 0.6), squeeze=False)
    for ax, p in zip(axes[:, 0], parts):
        region = p["region"]
        # an interval with no end (one run: none to give) is drawn to the picture's edge
        values = [v for v in (p["value"], p["low"], p["high"], *region) if v is not None and math.isfinite(v)]
        lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
        pad = (hi - lo) * 0.25 or 1.0
        lo, hi = lo - pad, hi + pad
        ax.axvspan(region[0] if region[0] is not None else lo, region[1] if region[1] is not None else hi,
                   color="#d8ecd8", label="holds")
        if p["value"] is not None:
            low, high = max(p["low"], lo), min(p["high"], hi)
            ax.errorbar([p["value"]], [0], xerr=[[p["value"] - low], [high - p["value"]]], fmt="o",
                        color=COLOURS[p["verdict"]], capsize=4)
        else:
            ax.text(0.5, 0.5, "not measured: " + p["why"][:90], transform=ax.transAxes, ha="center", fontsize=7)
        ax.set_xlim(lo, hi)
        ax.set_yticks([])
        ax.set_title(f"{p['label']} [{p['verdict']}]", fontsize=8)
    fig.suptitle(f"claim {claim['id']}: {claim['verdict']}" + (" (toy scale)" if claim["toy"] else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}{unit if unit in ('x', '') else ' ' + unit}"


def interval(part: dict) -> str:
    """A part's interval as text: "no interval" where neither end is bounded (one run a side, one
    repeat of a fit), an unbounded end as infinity."""
    low, high, unit = part["low"], part["high"], part["unit"]
    if high is None or low is None or (math.isinf(high) and (math.isinf(low) or (low == 0 and unit == "x"))):
        return "no interval"
    end = lambda x: ("-" if x < 0 else "") + "inf" if math.isinf(x) else fmt(x, unit)
    return f"[{end(low)}, {end(high)}]"


def to_json(report: dict) -> str:
    """The report as strict JSON: an interval with no end (one repeat of a fit gives none) is null,
    not the Infinity that only Python reads."""
    def finite(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: finite(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [finite(v) for v in x]
        return x
    return json.dumps(finite(report), indent=2, default=str, allow_nan=False)


def write(claims: list[dict], out: str, controls: list[dict] = ()) -> dict:
    """claims.json, one PNG per claim and report.html into ``out``; the report as data, with each
    accuracy experiment's positive control (judge.controls)."""
    os.makedirs(out, exist_ok=True)
    for c in claims:
        c["picture"] = picture(c, os.path.join(out, f"claim-{c['id']}.png"))
    report = {"claims": claims, "verdicts": {v: sum(c["verdict"] == v for c in claims) for v in COLOURS},
              "controls": list(controls)}
    with open(os.path.join(out, "claims.json"), "w") as f:
        f.write(to_json(report))
    with open(os.path.join(out, "report.html"), "w") as f:
        f.write(render_html(report))
    return report


def control_lines(report: dict) -> str:
    """One sentence per accuracy experiment's positive control: what it lost, and whether visibly."""
    said = []
    for c in report.get("controls") or []:
        if c["value"] is None:
            said.append(f"{c['experiment']}: its control ({c['control']}) was not measured: {c['why']}")
            continue
        how = ("more than 1 point, its whole interval clear" if c["loses"]
               else "not clearly more than 1 point: its accuracy parts are inconclusive"
               + (f"; {c['why']}" if c.get("why") else ""))
        said.append(f"{c['experiment']}: {c['control']} lost {-c['value']:.2f} points [{-c['high']:.2f}, "
                    f"{-c['low']:.2f}] over {c['n'] or '?'} run{'s' if c['n'] != 1 else ''} each ({how})")
    return ("Positive controls (a method that must lose, against none): " + "; ".join(said) + ".") if said else ""


def run_time_line(report: dict) -> str:
    """What the cells read took to run, per experiment's sweep and in all: each run from its start
    to its end as the store keeps them (runs replaced, failed or not read, and the time between
    runs, are not in it)."""
    cells, run_s = {}, {}
    for c in report["claims"]:
        cells.update(c.get("cells") or {})
        run_s.update(c.get("run_s") or {})
    said = [f"{name}: {cells[name]} cell{'' if cells[name] == 1 else 's'}, {run_s[name] / 60:.1f} min"
            for name in sorted(run_s) if cells.get(name)]
    if not said:
        return ""
    return (f"Run time of the cells read, each run from its start to its end (runs replaced, failed or not read, "
            f"and the time between runs, are not in it): {'; '.join(said)}; in all "
            f"{sum(run_s[n] for n in run_s if cells.get(n)) / 60:.1f} min.")


def render_html(report: dict) -> str:
    parts = ["<h1>gctestbed: the field's claims, rerun</h1>",
             "<p>" + ", ".join(f"{n} {v}" for v, n in report["verdicts"].items()) + ". Intervals: Student's t over "
             "seeds, paired (on the differences of accuracies, on the log ratios of speedups and byte ratios); the "
             "range over repeats that do not pair; within one run, interquartile step times and the binomial error "
             "of a held-out accuracy; none for a byte ratio of one run a side. Byte ratios are the interface "
             "counters', judged again on the methods' payloads where those are believed (90 % to 102 % of the "
             "wire): a verdict the two counts do not share is inconclusive.</p>", "<p>" + html.escape(control_lines(report)) + "</p>"]
    for c in report["claims"]:
        scale = "; ".join(f"{k}: {v}" for k, v in c["scale"].items())
        parts.append(f"<h2 id=\"claim-{c['id']}\">{html.escape(c['id'])}. <span style=\"color:{COLOURS[c['verdict']]}\">"
                     f"{c['verdict']}</span>{' (toy scale)' if c['toy'] else ''}</h2>"
                     f"<p><b>{html.escape(c['source'])}</b>: {html.escape(c['sentence'])}</p>"
                     f"<p>the source's conditions: {html.escape(c.get('source_conditions') or 'not limited')}</p>"
                     f"<p><i>measured at: {html.escape(scale)}</i></p>"
                     + (f"<p>departures that do not gate the verdict: {html.escape(c['caveat'])}</p>" if c.get("caveat") else ""))
        rows = "".join(f"<tr><td>{html.escape(p['label'])}</td><td>{fmt(p['value'], p['unit'])}</td>"
                       f"<td>{interval(p)}</td><td>{html.escape(p['holds_if'])}</td>"
                       f"<td>{p['verdict']}</td><td>{html.escape(p['why'])}</td></tr>" for p in c["parts"])
        parts.append("<table><tr><th>part</th><th>measured</th><th>interval</th><th>holds if</th><th>verdict</th>"
                     f"<th>note</th></tr>{rows}</table>")
        with open(c["picture"], "rb") as f:
            data = base64.b64encode(f.read()).decode()
        parts.append(f"<figure><img alt=\"claim {c['id']}\" src=\"data:image/png;base64,{data}\"></figure>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}table{border-collapse:collapse;"
             "margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>gctestbed claims</title><style>{style}</style>"
            f"</head><body>{''.join(parts)}</body></html>")


BEGIN, END = "<!-- claims:begin (generated by gctestbed claims run/report --doc) -->", "<!-- claims:end -->"


def markdown(report: dict, heading: str) -> str:
    """The claims as Markdown: per claim the sentence, the source's conditions and the conditions
    here, then every part with its value, interval, n, verdict and what would have disagreed."""
    out = [heading, "", "Totals: " + ", ".join(f"{n} {v}" for v, n in report["verdicts"].items()) + ".", "",
           control_lines(report), "", run_time_line(report), ""]
    for c in report["claims"]:
        out += [f"### {c['id']}. {c['verdict']}{' (toy scale)' if c['toy'] else ''}", "",
                f"**{c['source']}**: {c['sentence']}", "",
                f"- the source's conditions: {c.get('source_conditions') or 'not limited'}",
                "- here: " + "; ".join(f"{k}: {v}" for k, v in (c.get("conditions_here") or {}).items()),
                "- measured at: " + "; ".join(f"{k}: {v}" for k, v in c["scale"].items()),
                *([f"- departures that do not gate the verdict: {c['caveat']}"] if c.get("caveat") else []), "",
                "| part | value [interval] | n | verdict | would have disagreed | note |", "| --- | --- | --- | --- | --- | --- |"]
        for p in c["parts"]:
            n = (p.get("detail") or {}).get("n", "")
            value = f"{fmt(p['value'], p['unit'])} {interval(p)}" if p["value"] is not None else "-"
            cells = [p["label"], value, str(n), p["verdict"], p.get("disagrees_if", ""), p["why"] or ""]
            out.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
        out.append("")
    return "\n".join(out)


def write_doc(path: str, report: dict, heading: str) -> None:
    """Replace what lies between BEGIN and END in ``path`` with the claims' Markdown."""
    with open(path) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{path} has no '{BEGIN}' ... '{END}' block to fill")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(path, "w") as f:
        f.write(head + BEGIN + "\n" + markdown(report, heading) + "\n" + END + tail)
