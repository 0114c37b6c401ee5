"""Break-even, the performance model and the report, on stores whose truth is known."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import re

import matplotlib.image
import pytest

import synthetic
from gctestbed.analysis import breakeven, cells, model, report
from helpers import gctestbed


def test_crossing_is_interpolated_in_log_bandwidth():
    kind, bw = breakeven.crossing([1e7, 1e8, 1e9], [4.0, 2.0, 0.5])
    assert kind == "crosses"
    assert bw == pytest.approx(1e8 * 10 ** (2 / 3), rel=1e-9)      # 1/1.5 of the way, in log
    assert breakeven.crossing([1e7, 1e8], [3.0, 1.5]) == ("always", None)
    assert breakeven.crossing([1e7, 1e8], [0.9, 0.5]) == ("never", None)
    kind, bw = breakeven.crossing([1e7, 1e8], [0.5, 2.0])
    assert kind == "above" and 1e7 < bw < 1e8


def test_break_even_of_a_known_store(tmp_path):
    synthetic.fill(str(tmp_path))
    rows = cells.load(str(tmp_path))
    assert len(rows) == 30
    curves = {(c.group[4], c.compressor): c for c in breakeven.curves(rows)}
    for mode in ("overlap", "serial"):
        for method in ("fp16", "twobit"):
            c = curves[(mode, method)]
            truth = [synthetic.true_step("none", bw, mode)[0] / synthetic.true_step(method, bw, mode)[0] for bw in synthetic.BWS]
            assert [p.speedup for p in c.points] == pytest.approx(truth)
            kind, bw = breakeven.crossing(list(synthetic.BWS), truth)
            assert c.crossing.kind == kind and c.crossing.bw_bps == (pytest.approx(bw) if bw else None)
    # with these phases fp16 stops paying off inside the range in overlap mode
    assert curves[("overlap", "fp16")].crossing.kind == "crosses"
    assert 30e6 < curves[("overlap", "fp16")].crossing.bw_bps < 1e9


def test_the_model_recovers_the_parameters_it_was_made_with(tmp_path):
    synthetic.fill(str(tmp_path))
    f = model.fit(cells.load(str(tmp_path)), "tail")
    assert f.lam == pytest.approx(synthetic.LAMBDA, abs=0.01)
    assert f.alpha_s == pytest.approx(synthetic.ALPHA_S, rel=0.01)
    assert f.eta == pytest.approx(synthetic.ETA, rel=0.001)
    assert f.median_error < 0.005 and not f.misses
    # the form hides the last bucket too, so on the same data it must be worse
    assert model.fit(cells.load(str(tmp_path)), "issue").median_error > f.median_error


def test_a_miss_is_reported_with_a_reason(tmp_path):
    synthetic.fill(str(tmp_path))
    conn = cells.results.connect(str(tmp_path))
    with conn:      # twobit's serial cell at 100 Mbit/s took twice as long in its collectives as its bytes need
        conn.execute("UPDATE steps SET step_s = step_s + 0.05, comm_s = comm_s + 0.05 WHERE run_id='twobit100000000serial'")
    conn.close()
    f = model.fit(cells.load(str(tmp_path)), "tail")
    [miss] = f.misses
    assert miss.row.run_id == "twobit100000000serial"
    assert miss.why.startswith("its collectives took 73 ms against the model's 23 ms")


def test_projection_is_labelled_and_follows_the_ring_formulas(tmp_path):
    synthetic.fill(str(tmp_path))
    rows = cells.load(str(tmp_path))
    f = model.fit(rows, "tail")
    proj = {r["compressor"]: r for r in model.project(rows, f, [2, 64], [1e9, 100e9])}
    # at 2 nodes, the projection reproduces what was measured at 1 Gbit/s
    truth = synthetic.true_step("none", 1e9, "overlap")[0] / synthetic.true_step("fp16", 1e9, "overlap")[0]
    assert proj["fp16"]["speedup"]["2@1e+09"] == pytest.approx(truth, rel=0.01)
    # an all-gather's bytes grow with p, an all-reduce's do not: at 64 nodes twobit loses ground to fp16
    assert proj["twobit"]["speedup"]["64@1e+09"] / proj["twobit"]["speedup"]["2@1e+09"] < \
        proj["fp16"]["speedup"]["64@1e+09"] / proj["fp16"]["speedup"]["2@1e+09"]
    assert "MODEL OUTPUT" in report.analyse(rows)["projection"]["label"]


def test_convergence_flag_when_faster_but_worse(tmp_path):
    synthetic.fill(str(tmp_path), loss_of=lambda method, step: 2.3 - (0.02 if method == "twobit" else 0.1) * step)
    curves = breakeven.curves(cells.load(str(tmp_path)))
    flagged = {c.compressor for c in curves if c.flags}
    assert flagged == {"twobit"}
    assert all("faster per step but ends at loss" in f for c in curves for f in c.flags)


def _png_ok(data_or_path) -> tuple[int, int]:
    img = matplotlib.image.imread(data_or_path, format="png")
    h, w = img.shape[:2]
    assert w >= 400 and h >= 300
    assert img[..., :3].std() > 0.05          # not a blank canvas
    return w, h


def test_report_writes_pictures_html_and_exports(tmp_path):
    n = synthetic.fill(str(tmp_path / "store"))
    out = tmp_path / "out"
    proc = gctestbed("report", str(tmp_path / "store"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "break-even bandwidth" in proc.stdout and "fp16" in proc.stdout and "MODEL OUTPUT" in proc.stdout
    r = json.loads((out / "report.json").read_text())
    kinds = {p["path"].rsplit("/", 1)[1].split("_")[0] for p in r["pictures"]}
    assert kinds == {"step-time", "speedup", "phases", "loss", "model.png"}
    sizes = {}
    for pic in r["pictures"]:
        sizes[pic["path"].rsplit("/", 1)[1]] = _png_ok(pic["path"])
        assert pic["axes"] and all(a["lines"] + a["bars"] + a["points"] > 0 for a in pic["axes"]), pic
    page = (out / "report.html").read_text()
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(embedded) == len(r["pictures"])
    assert sorted(_png_ok(io.BytesIO(base64.b64decode(e))) for e in embedded) == sorted(sizes.values())
    assert "Break-even bandwidth" in page and "Performance model" in page and "MODEL OUTPUT" in page
    with open(out / "cells.csv") as f:
        assert len(list(csv.DictReader(f))) == n
    assert math.isfinite(r["model"]["tail"]["median_abs_error"])


def test_report_of_an_empty_store_is_one_sentence(tmp_path):
    proc = gctestbed("report", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_report_without_serial_cells_or_without_none_says_what_is_missing(tmp_path):
    synthetic.fill(str(tmp_path / "overlap"), modes=("overlap",))
    r = report.build(str(tmp_path / "overlap"), str(tmp_path / "out1"))
    assert r["model"] == {} and r["break_even"]
    assert "no model" in (tmp_path / "out1" / "report.html").read_text()
    synthetic.fill(str(tmp_path / "nonone"), methods=("fp16", "twobit"))
    r = report.build(str(tmp_path / "nonone"), str(tmp_path / "out2"))
    assert r["break_even"] == [] and r["pictures"]
    assert "defaults, not fits" in (tmp_path / "out2" / "report.html").read_text()
