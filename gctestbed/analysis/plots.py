"""The report's pictures, one function per kind, each writing a PNG and returning what it drew.

Every function takes the analysed data, draws with matplotlib's non-interactive backend, saves
``path`` and returns a small description (title, and per axes the number of lines, bars and
points drawn) so a test can check that no picture came out empty.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from .breakeven import Curve  # noqa: E402
from .cells import Row, group_label  # noqa: E402
from .model import Fit  # noqa: E402

DPI = 110
PHASES = (("compute", "compute_s", "#4c72b0"), ("encode", "encode_s", "#dd8452"), ("communication", "comm_s", "#55a868"),
          ("decode", "decode_s", "#c44e52"), ("optimizer", "optim_s", "#8172b3"))


def _rate(x: float, _pos=None) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if x >= scale:
            return f"{x / scale:g} {unit}"
    return f"{x:g} bit/s"


def _against_bandwidth(ax, bws, ylabel: str) -> None:
    """Log-log axes: x ticked at the measured bandwidths, labelled in bits per second."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(sorted(set(bws)))
    ax.xaxis.set_major_formatter(FuncFormatter(_rate))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("link bandwidth")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if len(ax.get_legend_handles_labels()[1]) > 6:        # many methods: the legend beside the plot, not over it
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    else:
        ax.legend(fontsize=7)


def _save(fig, path: str, title: str) -> dict:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    drawn = [{"lines": len(ax.lines), "bars": len(ax.patches), "points": sum(len(c.get_offsets()) for c in ax.collections)}
             for ax in fig.axes]
    plt.close(fig)
    return {"path": path, "title": title, "axes": drawn}


def _colours(labels: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10")
    return {label: cmap(i % 10) for i, label in enumerate(sorted(labels))}


LINES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
MARKERS = ("o", "s", "^", "D", "v", "P")


def _styles(labels: list[str]) -> dict[str, dict]:
    """Per method label, how its line looks: the colour is the compressor's, the line and marker
    the scheme's (``twobit over ps:servers=2``: twobit's colour, the second scheme's dashes), so
    a plot comparing the ring, parameter servers and local steps can be read method by method."""
    split = {label: (label.split(" over ", 1) + [""])[:2] for label in labels}
    colours = _colours(sorted({m for m, _ in split.values()}))
    schemes = sorted({s for _, s in split.values()})          # "" (the ring) first
    return {label: {"color": colours[m], "linestyle": LINES[schemes.index(s) % len(LINES)],
                    "marker": MARKERS[schemes.index(s) % len(MARKERS)]} for label, (m, s) in split.items()}


def step_times(rows: list[Row], group: tuple, path: str) -> dict:
    """Median step time against bandwidth, one line per method, log-log."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    members = [r for r in rows if r.group == group]
    styles = _styles(list({r.compressor for r in members}))
    for label in sorted(styles):
        pts = sorted((r.bw_bps, r.step_s) for r in members if r.compressor == label)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, markersize=4, **styles[label])
    _against_bandwidth(ax, [r.bw_bps for r in members], "median step time (s)")
    return _save(fig, path, f"step time: {group_label(group)}")


def speedups(curves: list[Curve], group: tuple, path: str) -> dict:
    """Speedup over none against bandwidth; the break-even bandwidths marked where the curve crosses 1."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    mine = [c for c in curves if c.group == group]
    styles = _styles([c.compressor for c in mine])
    for c in mine:
        bw, colour = [p.bw_bps for p in c.points], styles[c.compressor]["color"]
        ax.plot(bw, [p.speedup for p in c.points], label=c.compressor, markersize=4, **styles[c.compressor])
        if len(c.points) > 1 and any(p.low != p.high for p in c.points):
            ax.fill_between(bw, [p.low for p in c.points], [p.high for p in c.points], color=colour, alpha=0.15)
        if c.crossing.bw_bps:
            ax.axvline(c.crossing.bw_bps, color=colour, linestyle=":", linewidth=1)
            ax.plot([c.crossing.bw_bps], [1.0], "x", color=colour, markersize=9, mew=2)
    ax.axhline(1.0, color="black", linewidth=0.8)
    _against_bandwidth(ax, [p.bw_bps for c in mine for p in c.points], "speedup over none (x)")
    return _save(fig, path, f"speedup, break-even marked x: {group_label(group)}")


def phases(rows: list[Row], group: tuple, path: str) -> dict:
    """Stacked bars of the timed phases per method, one panel per bandwidth (serial mode's breakdown)."""
    members = [r for r in rows if r.group == group]
    bws = sorted({r.bw_bps for r in members})
    labels = sorted({r.compressor for r in members})
    cols = min(3, len(bws))
    fig, axes = plt.subplots(math.ceil(len(bws) / cols), cols, figsize=(4 * cols, 3.2 * math.ceil(len(bws) / cols)),
                             squeeze=False)
    for ax, bw in zip(axes.flat, bws):
        bottom = [0.0] * len(labels)
        for name, attr, colour in PHASES:
            values = []
            for label in labels:
                cell = [r for r in members if r.bw_bps == bw and r.compressor == label]
                values.append(sorted(getattr(r, attr) or 0.0 for r in cell)[len(cell) // 2] if cell else 0.0)
            ax.bar(range(len(labels)), values, bottom=bottom, color=colour, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_title(_rate(bw), fontsize=9)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels([lab.split(":")[0] for lab in labels], rotation=45, fontsize=7)
        ax.set_ylabel("s per step", fontsize=8)
    for ax in list(axes.flat)[len(bws):]:
        ax.remove()
    axes.flat[0].legend(fontsize=7)
    return _save(fig, path, f"phases per step: {group_label(group)}")


def losses(rows: list[Row], group: tuple, path: str) -> dict:
    """Training loss against wall time at the slowest and the fastest bandwidth."""
    members = [r for r in rows if r.group == group]
    bws = sorted({r.bw_bps for r in members})
    shown = [bws[0]] + ([bws[-1]] if len(bws) > 1 else [])
    fig, axes = plt.subplots(1, len(shown), figsize=(5.5 * len(shown), 3.8), squeeze=False)
    styles = _styles(list({r.compressor for r in members}))
    for ax, bw in zip(axes.flat, shown):
        for r in sorted((r for r in members if r.bw_bps == bw and r.repeat == 0), key=lambda r: r.compressor):
            pts = [(t, v) for t, v in zip(r.wall, r.losses) if v is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=r.compressor,
                    **{**styles[r.compressor], "marker": None})
        ax.set_title(_rate(bw), fontsize=9)
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("training loss (rank 0)")
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    return _save(fig, path, f"loss against wall time: {group_label(group)}")


def model_fit(f: Fit, path: str) -> dict:
    """Predicted against measured step time for every cell, log-log, with the ±10 % band."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    fitted = [p for p in f.predictions if p.fitted]
    predicted = [p for p in f.predictions if not p.fitted]
    for group, marker, label in ((fitted, "s", "none (fitted)"), (predicted, "o", "predicted")):
        if group:
            ax.scatter([p.row.step_s for p in group], [p.predicted_s for p in group], marker=marker, s=18, label=label,
                       c=["#c44e52" if abs(p.error) > 0.1 else "#4c72b0" for p in group])
    values = [p.row.step_s for p in f.predictions] + [p.predicted_s for p in f.predictions]
    lo, hi = min(values) / 1.3, max(values) * 1.3
    ax.plot([lo, hi], [lo, hi], "k-", linewidth=0.8)
    ax.plot([lo, hi], [lo * 1.1, hi * 1.1], "k:", linewidth=0.6)
    ax.plot([lo, hi], [lo * 0.9, hi * 0.9], "k:", linewidth=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("model's step time (s)")
    ax.grid(True, which="both", alpha=0.3)
    if len(ax.get_legend_handles_labels()[1]) > 6:        # many methods: the legend beside the plot, not over it
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    else:
        ax.legend(fontsize=7)
    err = f.median_error
    return _save(fig, path, f"model ({f.variant}) against measurement: median |error| "
                            f"{'-' if err is None else f'{err:.1%}'}; red: off by more than 10 %")
