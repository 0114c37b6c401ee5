"""gctestbed claims: the catalog, every verdict rule on synthetic stores, and one claim end to end."""

from __future__ import annotations

import dataclasses
import json
import types
import math
import subprocess
import sys

import pytest

from gctestbed import results, sweep
from gctestbed.analysis import cells
from gctestbed.claims import catalog, judge
from gctestbed.claims import experiments as X
from gctestbed.claims.experiments import EXPERIMENTS, STROM_TAUS
from gctestbed.claims.conditions import Conditions
from gctestbed.claims.verdict import (AGREE, DISAGREE, INCONCLUSIVE, OUT_OF_SCOPE, Measure, at_least, at_most, between,
                                      combine)
from gctestbed.spec import LinkSpec, RunSpec, parse_rate
from helpers import here



def gct(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gctestbed", *args], capture_output=True, text=True, **kw)


def test_the_catalog_lists_at_least_twenty_six_claims_each_with_its_source_and_conditions():
    out = gct("claims", "list", "--json")
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)
    assert [c["id"] for c in listed][:26] == list("abcdefghijklmnopqrstuvwxyz")
    for c in listed:
        assert c["source"] in catalog.SOURCES and c["citation"] and c["sentence"] and c["parts"]
        assert all(e in EXPERIMENTS for e in c["experiments"]) and c["quick_scale"] and c["full_scale"]
    assert {c["source"] for c in listed} == {"mxnet", "dgc", "variance", "utility", "hotnets"}


def test_every_experiment_plans_at_both_scales_with_valid_cells():
    from gctestbed import sweep
    for exp in EXPERIMENTS.values():
        for quick in (True, False):
            cells = sweep.plan(exp.grid(quick, results_dir="unused"))
            assert cells, exp.name
    assert judge.select(("a", "a", "r"), False) == [catalog.BY_ID["a"], catalog.BY_ID["r"]]
    with pytest.raises(Exception, match="there is no claim 'zz'"):
        judge.select(("zz",), False)


@pytest.mark.parametrize("claim", catalog.CLAIMS, ids=lambda c: c.id)
def test_every_part_of_every_claim_can_agree_and_disagree(claim):
    """Synthetic figures on each side of each part's region: a region no figure can leave (or
    enter) would make the part unable to disagree (or agree). The page states the disagreeing
    side for each part."""
    for part in claim.parts:
        lo, hi = part.region.low, part.region.high
        inside = (lo + hi) / 2 if lo is not None and hi is not None else (lo + 1 if lo is not None else hi - 1)
        outside = lo - 1 if lo is not None else hi + 1
        assert part.region.judge(Measure(inside, inside - 0.01, inside + 0.01)) == AGREE, part.label
        assert part.region.judge(Measure(outside, outside - 0.01, outside + 0.01)) == DISAGREE, part.label
        assert part.region.disagree_text().startswith("a whole interval")


def test_a_region_judges_an_interval_inside_clear_of_or_across_its_edge():
    region = at_least(1.5)
    assert region.judge(Measure(2.0, 1.8, 2.2)) == AGREE
    assert region.judge(Measure(1.0, 0.9, 1.1)) == DISAGREE
    assert region.judge(Measure(1.6, 1.3, 1.9)) == INCONCLUSIVE       # noise could flip it
    assert region.judge(Measure.missing("no run")) == INCONCLUSIVE
    assert at_most(0.2).judge(Measure(0.0)) == AGREE and at_most(0.2).judge(Measure(0.4, 0.3, 0.6)) == DISAGREE
    assert between(270, 600).judge(Measure(338, 330, 345)) == AGREE
    assert between(270, 600).judge(Measure(700, 650, 720)) == DISAGREE
    assert combine([AGREE, AGREE]) == AGREE and combine([AGREE, INCONCLUSIVE]) == INCONCLUSIVE
    assert combine([INCONCLUSIVE, DISAGREE]) == DISAGREE and combine([]) == INCONCLUSIVE
    assert combine([OUT_OF_SCOPE, AGREE]) == OUT_OF_SCOPE and combine([OUT_OF_SCOPE, DISAGREE]) == DISAGREE


def anywhere(claim_id: str) -> catalog.Claim:
    """The claim with its source's conditions lifted, so the verdict machinery can be tested on it here."""
    return dataclasses.replace(catalog.BY_ID[claim_id], conditions=Conditions())


# -- synthetic stores: cells written through the real Recorder, as workers write them ------------

def cell(results_dir: str, sweep: str, params: dict, step_times: list[float], accuracy: float | None = None,
         samples: int | None = None, tx: int = 1000, payload: int | None = None, run_id: str | None = None,
         repeat: int = 0, seed: int = 0, device: str = "cpu", evals: dict[int, float] | None = None,
         comm_share: float | None = None, **settings) -> None:
    """One finished sweep cell of two ranks with these step times, held-out accuracy (after the
    last step; ``evals``: step -> accuracy, evaluations before it), the share of each step spent
    communicating (``comm_share``; none recorded by default), bytes sent
    (the interface counters) and payload bytes (gctestbed's accounting; default: the same); run
    with the steps and other settings the claims experiment whose sweep it is gives its cells (the
    judge reads no other), or ``settings``."""
    run_id = run_id or f"r{abs(hash(json.dumps(params, sort_keys=True))) % 10**10}-{repeat}"
    planned = planned_spec(sweep, params)
    if planned is not None:         # one of a claims experiment's cells: the spec its sweep builds for it
        spec = dataclasses.replace(planned, results_dir=results_dir, run_id=run_id, seed=seed, device=device, **settings)
    else:
        spec = RunSpec(nodes=int(params["nodes"]), link=LinkSpec(bw_bps=parse_rate(params["bw"])),
                       compressor=params["compressor"].split(":")[0], workload=params["workload"].split(":")[0],
                       steps=len(step_times), batch_size=int(params["batch_size"]), mode=params["mode"],
                       results_dir=results_dir, run_id=run_id, seed=seed, device=device)
        spec = dataclasses.replace(spec, **{**settings_of(sweep), **settings})
    rec = results.Recorder(results_dir, run_id)
    rec.start_run(spec, {})
    for step, t in enumerate(step_times):
        for rank in range(2):
            rec.step(rank, step, step_s=t, compute_s=t / 2, loss=1.0, tx_bytes=tx, payload_bytes=payload or tx,
                     **({"comm_s": t * comm_share} if comm_share is not None else {}))
    rec.node(0, eval_accuracy=accuracy, eval_samples=samples)
    for step, acc in sorted((evals or {}).items()):
        rec.evaluation(step, 1.0, acc, samples)
    rec.evaluation(len(step_times), 1.0, accuracy, samples)
    rec.finish_run("ok")
    results.mark_cell(rec.conn, sweep, json.dumps(params, sort_keys=True), repeat, "ok", run_id)
    rec.close()


# what a claims experiment gives every cell beside its axes and the judge holds a stored cell to
# (written out here, not read from judge.JUDGED, so a change there cannot change the test's data too)
GIVEN = ("steps", "lr", "eval_every", "bucket_cap_mb", "cpus_per_node", "dilate")


_PLANS: dict[tuple[str, str], dict[str, RunSpec]] = {}


def planned_spec(sweep_name: str, params: dict) -> RunSpec | None:
    """The spec a claims experiment's sweep builds for the cell of ``params`` (a replay's trace
    resolved, its method's options, the dilation; a baseline's cell as ``claims run --baseline``
    adds it), or None where the cell is not one it plans."""
    key = (sweep_name, params["compressor"])
    if key not in _PLANS:
        _PLANS[key] = {}
        for exp in EXPERIMENTS.values():
            for quick in (True, False):
                name = exp.sweep_name(quick)
                if sweep_name == name or sweep_name.startswith(name + "-r"):
                    grid = judge._grid(exp, quick, "unused", baseline=params["compressor"])
                    _PLANS[key] = {c.key: c.spec for c in sweep.plan(grid)}
    return _PLANS[key].get(json.dumps(params, sort_keys=True))


def settings_of(sweep_name: str) -> dict:
    """What the claims experiment whose sweep this is gives every cell (GIVEN), as its grid plans
    it; nothing for another sweep."""
    for exp in EXPERIMENTS.values():
        for quick in (True, False):
            name = exp.sweep_name(quick)
            if sweep_name == name or sweep_name.startswith(name + "-r"):
                spec = sweep.plan(exp.grid(quick, results_dir="unused"))[0].spec
                return {k: getattr(spec, k) for k in GIVEN}
    return {}


def params_of(experiment: str, quick: bool = True, **values) -> dict:
    """A cell's parameters as the experiment's sweep types them, the first value of every other axis."""
    exp = EXPERIMENTS[experiment]
    grid = exp.grid(quick, results_dir="unused")
    out = {axis: v[0] for axis, v in grid.axes.items()}
    out.update({k: exp.fill(quick, v) for k, v in values.items()})
    return out


# the methods of the replayed parameter-server experiment, as its cells type them
PUSHED = {"none": "none", "fp16": "fp16", "twobit": X.TWOBIT_H200}


def ps_cell(results_dir, method: str, step_times: list[float], bw: str = "{high}", latency: str = "0", **kw) -> None:
    """One finished cell of the replayed parameter-server experiment (claims a and c): ``method``
    (none, fp16, twobit) pushed to one server, replayed from its trace with its own payloads."""
    params = params_of("mxnet-ps-replay", bw=bw, latency=latency, compressor=PUSHED[method])
    cell(str(results_dir), EXPERIMENTS["mxnet-ps-replay"].sweep_name(True), params, step_times, **kw)


def judge_c(tmp_path, none_times, twobit_times, none_late=None, twobit_late=None, seeds=(0, 1)) -> dict:
    """Claim c (2-bit helps little with no latency added: speedup at most 1.2; added latency makes it
    help more: its speedup with the latency over without at least 1, at both of the experiment's
    rates) on a made-up store, the same times at both rates and for every seed (paired repeats
    that agree: zero-wide intervals); with the latency added, the times ``*_late`` (default: as
    without)."""
    late = {"none": none_late or none_times, "twobit": twobit_late or twobit_times}
    for method, times in (("none", none_times), ("twobit", twobit_times)):
        for bw in ("{low}", "{high}"):
            for seed in seeds:
                ps_cell(tmp_path, method, times, bw=bw, repeat=seed, seed=seed)
                ps_cell(tmp_path, method, late[method], bw=bw, latency="{lat}", repeat=seed, seed=seed)
    return judge.judge(anywhere("c"), True, str(tmp_path))


def test_a_speed_claim_agrees_disagrees_or_is_inconclusive_by_its_step_times(tmp_path):
    steady = [0.1] * 12
    # 1.0x with no latency added (little benefit), 2.0x with it (latency makes it pay)
    assert judge_c(tmp_path / "same", steady, steady, [0.2] * 12, steady)["verdict"] == AGREE
    assert judge_c(tmp_path / "twice", steady, [0.05] * 12)["verdict"] == DISAGREE         # 2.0x: a clear benefit
    # 1.1x with no latency (little), 1.0x with it: latency takes the benefit away
    less = judge_c(tmp_path / "less", [0.11] * 12, steady, steady, steady)
    assert less["verdict"] == DISAGREE and [p["verdict"] for p in less["parts"]] == [AGREE, DISAGREE, DISAGREE]
    assert less["parts"][1]["value"] == pytest.approx(1 / 1.1)
    # one run a side (seed 0): median 1.2x, the interquartile range of its steps straddling 1.2
    noisy = judge_c(tmp_path / "noisy", [0.10, 0.14] * 6, [0.09, 0.11] * 6, [0.2] * 12, steady, seeds=(0,))
    assert noisy["verdict"] == INCONCLUSIVE
    part = noisy["parts"][0]
    assert part["low"] < 1.2 < part["high"] and "interquartile" in part["detail"]["interval"]
    assert part["verdict"] == INCONCLUSIVE and "repeats were planned" not in part["why"]     # the straddle, not the repeats


def test_a_speed_of_one_run_a_side_is_inconclusive_where_repeats_were_planned(tmp_path):
    """The replayed experiment plans 3 repeats. One run a side reading a clear 2.0x (its steps'
    interquartile range clear of 1.2) is not judged on the spread inside those runs: inconclusive,
    saying so; two seeds a side read the same times disagree. Planted (judge.unpaired skipped):
    the first reads disagree."""
    steady = [0.1] * 12
    # 2.0x with no latency; 8.0x with it, a gain of 4 (planted, ratio_of dropping its parts' n: they read agree)
    one = judge_c(tmp_path / "one", steady, [0.05] * 12, [0.4] * 12, [0.05] * 12, seeds=(0,))["parts"]
    assert one[0]["verdict"] == INCONCLUSIVE and one[0]["value"] == pytest.approx(2.0), one[0]
    assert "3 repeats were planned and fewer than two runs a side are read" in one[0]["why"]
    assert "would read disagree" in one[0]["why"]
    for gain in one[1:]:
        assert gain["verdict"] == INCONCLUSIVE and gain["value"] == pytest.approx(4.0) and "would read agree" in gain["why"]
    two = judge_c(tmp_path / "two", steady, [0.05] * 12, [0.4] * 12, [0.05] * 12)["parts"]
    assert [p["verdict"] for p in two] == [DISAGREE, AGREE, AGREE] and two[0]["detail"]["n"] == 2, two


def test_a_figure_over_several_and_a_speedup_count_independent_runs_a_side(tmp_path):
    """n, which the repeats test reads, is the fewest seeds a side: a median or a share over
    speedups has its parts' fewest (planted, dropped: their n is missing and a one-run part passes),
    and two runs of one seed are one (planted, rows counted: n reads 2)."""
    from gctestbed.claims import figures
    parts = {"a": Measure(2.0, 1.5, 2.5, detail={"n": 1}), "b": Measure(3.0, 2.0, 4.0, detail={"n": 3})}
    assert figures.median_of(parts).detail["n"] == 1
    # every composite by one rule (test_a_composite_figure_counts_the_runs_of_its_thinner_side): no n where a
    # part does not say
    assert "n" not in figures.median_of({**parts, "c": Measure(1.0, 0.9, 1.1)}).detail
    assert figures.share(parts, lambda s: s > 1).detail["n"] == 1
    for repeat in (0, 1):           # two repeats stored with one seed: one independent run a side
        ps_cell(tmp_path, "none", [0.2] * 8, repeat=repeat, seed=0)
        ps_cell(tmp_path, "twobit", [0.1] * 8, repeat=repeat, seed=0)
    rows = cells.load(str(tmp_path), EXPERIMENTS["mxnet-ps-replay"].sweep_name(True))
    fast = figures.speedup(rows, next(r.compressor for r in rows if r.method == "twobit"), "none over ps")
    assert fast.value == pytest.approx(2.0) and fast.detail["n"] == 1, fast.detail


def test_a_speed_leaves_out_a_run_paced_at_its_own_latency_only(tmp_path, monkeypatch):
    """A run the dilation test found paced (Row.dilation_paced, not its counters) at 5 ms: its seed is
    left out there for both methods, and kept with no added latency. Planted (the setting keyed
    without the latency, or only host_bound read): fails."""
    for seed in (0, 1, 2):
        for latency in ("0", "{lat}"):
            ps_cell(tmp_path, "none", [0.2] * 8, latency=latency, repeat=seed, seed=seed)
            ps_cell(tmp_path, "twobit", [0.1] * 8, latency=latency, repeat=seed, seed=seed)
    load = cells.load
    monkeypatch.setattr(cells, "load", lambda d, n: [dataclasses.replace(
        r, dilation_paced=(r.seed == 1 and r.method == "none" and r.latency_s > 0)) for r in load(d, n)])
    parts = judge.judge(anywhere("c"), True, str(tmp_path))["parts"]
    assert parts[0]["detail"]["seeds"] == [0, 1, 2], parts[0]            # no added latency: seed 1 kept
    assert parts[1]["detail"]["numerator"]["seeds"] == [0, 2], parts[1]
    assert "seed 1 at 10gbit and 5ms" in parts[1]["why"], parts[1]["why"]


def test_the_pushed_speedup_finds_each_method_by_its_name_and_refuses_two_of_one(tmp_path):
    """The replayed runs' 2-bit is labelled with every option its trace recorded; the figure finds it
    by its method's name among the runs over ps, and where two labels of 2-bit stand in one store
    it compares neither."""
    judge_c(tmp_path, [0.2] * 8, [0.1] * 8)
    assert judge.judge(anywhere("c"), True, str(tmp_path))["parts"][0]["value"] == pytest.approx(2.0)
    rows = cells.load(str(tmp_path), EXPERIMENTS["mxnet-ps-replay"].sweep_name(True))
    fig = catalog.BY_ID["c"].parts[0].figure
    ctx = catalog.Context(lambda text: EXPERIMENTS["mxnet-ps-replay"].fill(True, text))
    other = [dataclasses.replace(r, compressor="twobit:threshold=0.5 over ps") for r in rows if r.method == "twobit"]
    m = fig(rows + other, ctx)
    assert m.value is None and "compares one label of each method" in m.why, m


def judge_d(tmp_path, none_acc, twobit_acc, samples, control_acc=0.5) -> dict:
    """Claim d (2-bit loses at most about one point of accuracy) on a made-up store, with the
    experiment's positive control (top 0.1 % without accumulation) at ``control_acc``."""
    name = EXPERIMENTS["accuracy-mlp"].sweep_name(True)
    for method, acc in (("none", none_acc), ("twobit:threshold=0.01", twobit_acc), (EXPERIMENTS["accuracy-mlp"].control, control_acc)):
        cell(str(tmp_path), name, params_of("accuracy-mlp", compressor=method), [0.1] * 3, acc, samples)
    return judge.judge(anywhere("d"), True, str(tmp_path))


def judge_d_repeats(tmp_path, none_acc, twobit_acc, seeds) -> dict:
    """Claim d over repeats: run k of each method with seeds[k], the control losing 40 points."""
    name = EXPERIMENTS["accuracy-mlp"].sweep_name(True)
    for method, accs in (("none", none_acc), ("twobit:threshold=0.01", twobit_acc),
                         (EXPERIMENTS["accuracy-mlp"].control, [a - 0.4 for a in none_acc])):
        for k, (acc, seed) in enumerate(zip(accs, seeds)):
            cell(str(tmp_path), name, params_of("accuracy-mlp", compressor=method), [0.1] * 3, acc, 360,
                 repeat=k, seed=seed)
    return judge.judge(anywhere("d"), True, str(tmp_path))


def test_the_control_rule_spares_the_part_that_measures_the_control_itself(tmp_path):
    """f's first part ("top 0.1 % alone loses") measures the control itself: it must be able to
    disagree, not be called too easy by its own figure. A control without an accuracy is not
    measured, and the other parts say so."""
    name = EXPERIMENTS["accuracy-sgd"].sweep_name(True)
    control = EXPERIMENTS["accuracy-sgd"].control
    mlp = EXPERIMENTS["accuracy-mlp"].sweep_name(True)          # d's experiment, with the same control
    for method, acc in (("none", 0.90), (control, 0.90), ("twobit:threshold=0.01", 0.90)):
        cell(str(tmp_path / "flat"), name, params_of("accuracy-sgd", compressor=method), [0.1] * 3, acc, 1_000_000)
        cell(str(tmp_path / "flat"), mlp, params_of("accuracy-mlp", compressor=method), [0.1] * 3, acc, 1_000_000)
    f = judge.judge(catalog.BY_ID["f"], True, str(tmp_path / "flat"))
    assert f["parts"][0]["verdict"] == DISAGREE and f["verdict"] == DISAGREE
    assert judge.judge(catalog.BY_ID["d"], True, str(tmp_path / "flat"))["verdict"] == INCONCLUSIVE   # too easy
    for method, acc in (("none", 0.90), (control, None), ("twobit:threshold=0.01", 0.90)):
        cell(str(tmp_path / "unmeasured"), mlp, params_of("accuracy-mlp", compressor=method), [0.1] * 3, acc, 1_000_000)
    d = judge.judge(catalog.BY_ID["d"], True, str(tmp_path / "unmeasured"))
    assert d["verdict"] == INCONCLUSIVE and "positive control" in d["parts"][0]["why"]


def test_repeats_that_do_not_pair_give_no_interval(tmp_path):
    name = EXPERIMENTS["accuracy-sgd"].sweep_name(True)
    for method, seeds in (("none", (0, 1)), ("twobit:threshold=0.01", (2, 3))):
        for k, seed in enumerate(seeds):
            cell(str(tmp_path), name, params_of("accuracy-sgd", compressor=method), [0.1] * 3, 0.9, 360, repeat=k, seed=seed)
    from gctestbed.claims import figures
    m = figures.accuracy_delta(cells.load(str(tmp_path), name), "twobit:threshold=0.01", "none")
    assert m.value is None and "differ" in m.why
    # one repeat of three missing (failed, diverged, not run): no interval over the survivors
    for k in range(3):
        cell(str(tmp_path / "gap"), name, params_of("accuracy-sgd", compressor="none"), [0.1] * 3, 0.9, 360, repeat=k, seed=k)
    for k in (0, 2):
        cell(str(tmp_path / "gap"), name, params_of("accuracy-sgd", compressor="twobit:threshold=0.01"), [0.1] * 3, 0.9,
             360, repeat=k, seed=k)
    gap = figures.accuracy_delta(cells.load(str(tmp_path / "gap"), name), "twobit:threshold=0.01", "none")
    assert gap.value is None and "seeds [0, 2]" in gap.why


def test_accuracy_over_repeats_is_a_paired_t_interval_and_a_shared_seed_gives_none(tmp_path):
    """By hand: none 90, 92, 88 % and 2-bit 89, 90, 88 % on seeds 0, 1, 2: paired differences -1,
    -2, 0 points, mean -1, standard deviation 1, t(0.975, 2 degrees) = 4.303 (a t table), half
    width 4.303 / sqrt(3) = 2.484: [-3.484, +1.484], across the -1 edge: inconclusive. Differences
    -0.2, -0.3, -0.1: [-0.448, +0.048], inside: agree. The same runs all on seed 0 are one run
    three times, not three: no interval, inconclusive, and the note says why."""
    wide = judge_d_repeats(tmp_path / "wide", [0.90, 0.92, 0.88], [0.89, 0.90, 0.88], [0, 1, 2])
    part = wide["parts"][0]
    assert part["value"] == pytest.approx(-1.0) and part["low"] == pytest.approx(-3.484, abs=1e-3)
    assert part["high"] == pytest.approx(1.484, abs=1e-3) and wide["verdict"] == INCONCLUSIVE
    assert part["detail"]["seeds"] == [0, 1, 2] and "paired" in part["detail"]["interval"]
    tight = judge_d_repeats(tmp_path / "tight", [0.90, 0.92, 0.88], [0.898, 0.917, 0.879], [0, 1, 2])
    assert tight["parts"][0]["low"] == pytest.approx(-0.448, abs=1e-3) and tight["verdict"] == AGREE
    shared = judge_d_repeats(tmp_path / "shared", [0.90, 0.92, 0.88], [0.898, 0.917, 0.879], [0, 0, 0])
    assert shared["verdict"] == INCONCLUSIVE and "share a seed" in shared["parts"][0]["why"]


def test_a_gain_between_two_variants_is_a_paired_t_interval_on_their_own_differences(tmp_path):
    """w's gain (DGC with local clipping over without), by hand: none 90, 80, 70 %, without 85, 76,
    64 %, with 87, 79, 68 % on seeds 0, 1, 2. Per seed, with minus without: 2, 3, 4 points, mean 3,
    standard deviation 1, t(0.975, 2 degrees) = 4.303 (a t table), half width 4.303 / sqrt(3) =
    2.484: [0.516, 5.484], above 0: agree. Planted: the two deltas against none subtracted, their
    intervals too ([-7.484, -2.516] and [-4.484, +0.484]) -> [-1.968, 7.968], inconclusive."""
    name = EXPERIMENTS["accuracy-sgd"].sweep_name(True)
    none = [0.90, 0.80, 0.70]
    for method, accs in (("none", none), (X.DGC_MASK, [0.85, 0.76, 0.64]), (X.DGC_CLIP, [0.87, 0.79, 0.68]),
                         (EXPERIMENTS["accuracy-sgd"].control, [a - 0.6 for a in none])):
        for k, acc in enumerate(accs):
            cell(str(tmp_path), name, params_of("accuracy-sgd", compressor=method), [0.1] * 3, acc, 360,
                 repeat=k, seed=k)
    w = judge.judge(anywhere("w"), True, str(tmp_path))
    part = w["parts"][0]
    assert part["value"] == pytest.approx(3.0) and part["low"] == pytest.approx(0.516, abs=1e-3)
    assert part["high"] == pytest.approx(5.484, abs=1e-3) and part["verdict"] == AGREE and w["verdict"] == AGREE
    assert part["detail"]["seeds"] == [0, 1, 2] and part["detail"]["n"] == 3


def _clipping_store(tmp_path, clip_accs: list[float], clip_evals: dict, *more: tuple) -> None:
    """The accuracy-sgd store w's trend tests judge: three paired seeds of none (90, 80, 70 %), masking
    (85, 76, 64), clipping at ``clip_accs`` with its evaluations at steps 1 and 2, the control 60 points
    under none, and ``more`` (method, accuracies, evaluations)."""
    name, none = EXPERIMENTS["accuracy-sgd"].sweep_name(True), [0.90, 0.80, 0.70]
    for method, accs, evals in (("none", none, {1: [0.5] * 3, 2: [0.6] * 3}),
                                (X.DGC_MASK, [0.85, 0.76, 0.64], {1: [0.5] * 3, 2: [0.6] * 3}),
                                (X.DGC_CLIP, clip_accs, clip_evals), *more,
                                (EXPERIMENTS["accuracy-sgd"].control, [a - 0.6 for a in none], {1: [0.1] * 3, 2: [0.1] * 3})):
        for k, acc in enumerate(accs):
            cell(str(tmp_path), name, params_of("accuracy-sgd", compressor=method), [0.1] * 4, acc, 360,
                 repeat=k, seed=k, evals={step: v[k] for step, v in evals.items()})


@pytest.mark.parametrize("case", ["closing", "crossing"])
def test_a_loss_still_closing_at_the_end_of_the_run_is_inconclusive(tmp_path, case):
    """w's gain, by hand, at the end (step 4): with clipping minus without -3, -4, -2 points on seeds
    0, 1, 2 (mean -3, [-5.484, -0.516]: disagree). At step 2, the evaluation nearest half-way, the
    gain was -8, -10, -7 ("closing": it moved 5, 6, 5, mean 5.333, standard deviation 0.577, t(0.975,
    2) = 4.303, half width 1.434: [3.899, 6.767], above 0, still closing: inconclusive) or -5, -7, 0
    ("crossing": moved 2, 3, -2, mean 1, standard deviation 2.646, [-5.572, 7.572]: across 0, the
    disagreement stands and the note says how it moved). Step 1's evaluation says the opposite of
    step 2's in each case. And s's first part (2-bit without its residual loses at least a point)
    disagrees by losing nothing (+0.5 points), though that gap rose 5.5 points from step 2: a gap
    moving up is no loss closing there, so it stays disagree. Planted: no trend rule, or the first
    evaluation instead of the nearest half-way, or the crossing mean taken as closing, or the rule
    on either side of a region -> a case fails."""
    clip_evals = ({1: [0.47, 0.46, 0.48], 2: [0.52, 0.50, 0.53]} if case == "closing"
                  else {1: [0.42, 0.40, 0.43], 2: [0.55, 0.53, 0.60]})
    _clipping_store(tmp_path, [0.82, 0.72, 0.62], clip_evals,
                    (X.TWOBIT_DISCARD, [0.905, 0.804, 0.706], {1: [0.45] * 3, 2: [0.55] * 3}))
    part = judge.judge(anywhere("w"), True, str(tmp_path))["parts"][0]
    assert part["value"] == pytest.approx(-3.0) and part["high"] == pytest.approx(-0.516, abs=1e-3)
    trend = part["detail"]["trend"]
    assert (trend["from_step"], trend["to_step"], trend["n"]) == (2, 4, 3)
    if case == "closing":
        assert trend["change"] == pytest.approx(16 / 3) and trend["low"] == pytest.approx(3.899, abs=1e-3)
        assert part["verdict"] == INCONCLUSIVE and "still closing" in part["why"], part["why"]
    else:
        assert trend["change"] == pytest.approx(1.0) and trend["low"] == pytest.approx(-5.572, abs=1e-3)
        assert part["verdict"] == DISAGREE and "not shown to be closing" in part["why"], part["why"]
    s_part = judge.judge(anywhere("s"), True, str(tmp_path))["parts"][0]
    assert s_part["value"] == pytest.approx(0.5) and s_part["detail"]["trend"]["change"] == pytest.approx(5.5)
    assert s_part["verdict"] == DISAGREE and "not shown to be closing" not in s_part["why"], s_part


@pytest.mark.parametrize("case", ["toward", "steady"])
def test_an_agreement_whose_gap_was_still_moving_toward_its_edge_is_inconclusive(tmp_path, case):
    """The mirror of the rule above, on w's gain, by hand: with clipping minus without +3, +4, +2
    points at the end (step 4; mean 3, [0.516, 5.484], above 0: agree). At step 2 the gain was +8,
    +10, +7 ("toward": it moved -5, -6, -5 toward the edge 0, [-6.767, -3.899], wholly below 0:
    inconclusive, "still closing", a longer run might disagree) or +1, +2, +5 ("steady": moved +2, +2, -3, mean
    +0.333, away from the edge: agree stands, no "not shown" in the note). Step 1's evaluation says
    the opposite. Planted: the rule on disagreements only -> the "toward" case stays agree."""
    clip_evals = ({1: [0.53, 0.54, 0.52], 2: [0.68, 0.70, 0.67]} if case == "toward"
                  else {1: [0.58, 0.60, 0.57], 2: [0.61, 0.62, 0.65]})
    _clipping_store(tmp_path, [0.88, 0.80, 0.66], clip_evals)
    part = judge.judge(anywhere("w"), True, str(tmp_path))["parts"][0]
    assert part["value"] == pytest.approx(3.0) and part["low"] == pytest.approx(0.516, abs=1e-3)
    trend = part["detail"]["trend"]
    if case == "toward":
        assert trend["change"] == pytest.approx(-16 / 3) and trend["high"] == pytest.approx(-3.899, abs=1e-3)
        assert part["verdict"] == INCONCLUSIVE and "still closing" in part["why"] and "might disagree" in part["why"]
    else:
        assert trend["change"] == pytest.approx(1 / 3)
        assert part["verdict"] == AGREE and "gap moved" in part["why"] and "not shown" not in part["why"], part["why"]


def test_an_accuracy_claim_is_inconclusive_when_its_positive_control_does_not_lose_visibly(tmp_path):
    """The control must lose more than the part's margin (one point), its whole interval clear:
    losing 0.5 points (or 1.5 with an interval reaching past -1) means the task cannot show a
    loss, so "2-bit loses at most a point" says nothing and is inconclusive, not agree."""
    easy = judge_d(tmp_path / "easy", 0.90, 0.90, 1_000_000, control_acc=0.895)
    assert easy["verdict"] == INCONCLUSIVE and "task too easy to tell" in easy["parts"][0]["why"]
    assert "lost 0.50 points" in easy["parts"][0]["why"]
    assert judge_d(tmp_path / "hard", 0.90, 0.90, 1_000_000, control_acc=0.85)["verdict"] == AGREE
    near = judge_d(tmp_path / "near", 0.90, 0.90, 360, control_acc=0.885)        # -1.5 points, +-4.5 on 360
    assert near["verdict"] == INCONCLUSIVE and "task too easy" in near["parts"][0]["why"]


def test_an_accuracy_claim_is_judged_with_the_binomial_error_of_its_held_out_set(tmp_path):
    assert judge_d(tmp_path / "equal", 0.90, 0.90, 1_000_000)["verdict"] == AGREE
    assert judge_d(tmp_path / "worse", 0.90, 0.80, 1_000_000)["verdict"] == DISAGREE
    small = judge_d(tmp_path / "small", 0.90, 0.895, 360)             # -0.5 points, +-4.4 on 360 images
    assert small["verdict"] == INCONCLUSIVE
    assert small["parts"][0]["low"] < -1 < small["parts"][0]["high"]


def judge_g(tmp_path, dgc_tx: list[int], dgc_payload: int | None = None) -> dict:
    """Claim g (DGC sends 270x to 600x fewer bytes than none) on a made-up store: none sends 3.4 MB a
    step on both layouts, DGC ``dgc_tx[i]`` bytes in repeat i (the interface counters)."""
    name = EXPERIMENTS["dgc-bytes"].sweep_name(True)
    for workload in ("{fc}", "{conv}"):
        cell(str(tmp_path), name, params_of("dgc-bytes", workload=workload, compressor="none"), [0.1] * 3, tx=3_400_000)
        for repeat, tx in enumerate(dgc_tx):
            cell(str(tmp_path), name, params_of("dgc-bytes", workload=workload,
                                                compressor="dgc:ratio=0.001,warmup_epochs=0,packing=runlength"),
                 [0.1] * 3, tx=tx, payload=dgc_payload, repeat=repeat)
    return judge.judge(anywhere("g"), True, str(tmp_path))


def test_a_bytes_claim_holds_only_where_the_wire_and_the_believed_payloads_agree(tmp_path):
    """The wire (interface counters) and the methods' payloads (the gradient bytes the sources
    count) judge apart; a payload under 90 % of its wire bytes is not believed. none: 3.4 MB a step
    on both counts. Worked by hand against 270..600:
    - wire 10,000 (340x), payload 3,400 (1000x): not believed, the wire alone: agree;
    - wire 100,000 (34x), payload 11,333 (300x): an accounting that under-reports cannot turn a
      disagree into anything else: disagree;
    - wire 12,000 (283x), payload 11,000 (309x): both inside: agree;
    - wire 13,000 (261.5x, disagree), payload 12,000 (283x, agree): inconclusive, the headers decide;
    - wire 10,000 (340x), payload 20,000 (170x): more than the wire carried, not believed: agree."""
    cases = {"lies": (10_000, 3_400, AGREE), "hides": (100_000, 11_333, DISAGREE), "near": (12_000, 11_000, AGREE),
             "edge": (13_000, 12_000, INCONCLUSIVE), "inflates": (10_000, 20_000, AGREE)}   # 2x the wire: not believed
    for name, (tx, payload, want) in cases.items():
        part = judge_g(tmp_path / name, [tx, tx], dgc_payload=payload)["parts"][0]
        assert part["verdict"] == want, (name, part)
        assert part["value"] == pytest.approx(3_400_000 / tx)                 # the figure shown is the wire's
        assert part["detail"]["payload_ratio"] == pytest.approx(3_400_000 / payload)
        if name == "edge":
            assert part["detail"]["payload_count"]["value"] == pytest.approx(3_400_000 / 12_000)
            assert "the payloads alone agree" in part["why"]


def _counting(claim: catalog.Claim, calls: list) -> catalog.Claim:
    """The claim with every part's figure noting which count it was asked on."""
    def wrap(figure):
        return lambda rows, ctx: (calls.append(ctx.count), figure(rows, ctx))[1]
    return dataclasses.replace(claim, parts=[dataclasses.replace(p, figure=wrap(p.figure)) for p in claim.parts])


def test_only_a_figure_that_read_bytes_is_judged_again_on_the_payloads(tmp_path, monkeypatch):
    """A speed figure reads no bytes: judged once, on the wire alone. A byte figure (g) is read on
    both counts, and so is one that reads bytes inside an accuracy figure (Strom's largest ratio
    among the taus that keep accuracy), which no part's declared needs say."""
    for method in ("none", "twobit"):
        ps_cell(tmp_path / "c", method, [0.1] * 12)
    calls = []
    c = judge.judge(_counting(anywhere("c"), calls), True, str(tmp_path / "c"))
    assert calls == ["wire"] * 3 and "payload_count" not in c["parts"][0]["detail"], (calls, c["parts"][0])
    judge_g(tmp_path / "g", [12_000, 12_000], dgc_payload=11_000)
    calls.clear()
    g = judge.judge(_counting(anywhere("g"), calls), True, str(tmp_path / "g"))
    assert calls == ["wire", "payload"] * 2 and all("payload_count" in p["detail"] for p in g["parts"]), calls
    from gctestbed.claims import figures
    monkeypatch.setattr(figures, "accuracy_delta", lambda rows, m, base: Measure(-0.5, -0.8, -0.2))
    monkeypatch.setattr(figures, "compression", lambda rows, m, base, count="wire", **kw: Measure(10.0, 9.0, 11.0))
    kept, acc = catalog.Context(lambda t: t), catalog.Context(lambda t: t)
    assert catalog._kept_compression(("a", "b"))([], kept).value == 10.0 and kept.counted
    assert catalog._acc("a")([], acc).value == -0.5 and not acc.counted


def judge_t(tmp_path, sizes: dict) -> dict:
    """Claim t's byte part on a made-up store: none sends 1,000,000 bytes a step on both counts,
    variance at alpha 1, 1.5 and 2 the (wire, payload) bytes given; two paired seeds that agree."""
    name, exp = EXPERIMENTS["accuracy-adam"].sweep_name(True), EXPERIMENTS["accuracy-adam"]
    methods = {"none": (0.90, 1_000_000, None), exp.control: (0.50, 10, None),
               **{m: (0.90, *sizes[m]) for m in (X.VARIANCE, X.VARIANCE_15, X.VARIANCE_2)}}
    for method, (acc, tx, payload) in methods.items():
        for seed in (0, 1):
            cell(str(tmp_path), name, params_of("accuracy-adam", compressor=method), [0.1] * 3, acc, 1_000_000, tx=tx,
                 payload=payload, repeat=seed, seed=seed)
    return judge.judge(anywhere("t"), True, str(tmp_path))["parts"][0]


def test_a_composite_byte_figure_is_judged_on_each_count_whole_not_on_a_mix(tmp_path):
    """Claim t's byte part (the byte ratio's smallest growth from alpha 1 to 1.5 to 2). On the wire
    none's 1,000,000 bytes over 10,000 / 9,500 / 9,000 give 100, 105.3, 111.1x (growths 1.053 and
    1.056); on the payloads, 9,100 / 8,600 / 8,200 (each within 90-102 % of its wire), 109.9,
    116.3, 122.0x (growths 1.058 and 1.049): both at least 1, agree. Mixing one method's wire with
    another's payload (105.3 / 109.9 = 0.958) would have made it inconclusive. With alpha 1.5's
    payload at 8,000 (under 90 % of 9,500: not believed) the payload reading is dropped for the
    whole figure, not taken for the other two alone (which would give 0.958 and 1.159): the wire
    judges alone, agree."""
    whole = judge_t(tmp_path / "whole", {X.VARIANCE: (10_000, 9_100), X.VARIANCE_15: (9_500, 8_600),
                                         X.VARIANCE_2: (9_000, 8_200)})
    assert whole["value"] == pytest.approx(10_000 / 9_500, rel=1e-6)
    assert whole["detail"]["payload_count"]["value"] == pytest.approx(8_600 / 8_200, rel=1e-6)
    assert whole["verdict"] == AGREE, whole
    partly = judge_t(tmp_path / "partly", {X.VARIANCE: (10_000, 9_100), X.VARIANCE_15: (9_500, 8_000),
                                           X.VARIANCE_2: (9_000, 8_200)})
    assert partly["verdict"] == AGREE and partly["detail"]["payload_count"].startswith("not read"), partly


def test_the_smallest_growth_has_the_interval_of_a_minimum():
    """Growths 1.25 [1.2, 1.3] and 1.5 [0.9, 2.1]: their minimum lies in [0.9, 1.3] (the smallest
    low, the smallest high), across 1; the older rule kept the first one's [1.2, 1.3]."""
    from gctestbed.claims import catalog as cat
    fake = {"a": Measure(1.0, 1.0, 1.0), "b": Measure(1.25, 1.2, 1.3), "c": Measure(1.875, 1.08, 2.73)}
    real_bytes, real_ratio = cat._bytes, cat.F.ratio_of
    try:
        cat._bytes = lambda m: (lambda rows, ctx: fake[m])
        steps = iter([Measure(1.25, 1.2, 1.3), Measure(1.5, 0.9, 2.1)])
        cat.F.ratio_of = lambda b, a: next(steps)
        m = cat._rises("a", "b", "c")([], None)
    finally:
        cat._bytes, cat.F.ratio_of = real_bytes, real_ratio
    assert (m.value, m.low, m.high) == (1.25, 0.9, 1.3)


def test_an_interval_without_ends_reads_as_none():
    from gctestbed.claims.page import interval
    assert interval({"low": 0.0, "high": math.inf, "unit": "x"}) == "no interval"
    assert interval({"low": -math.inf, "high": math.inf, "unit": "pt"}) == "no interval"
    assert interval({"low": 0.0, "high": math.inf, "unit": "pt"}) == "[0 pt, inf]"
    assert interval({"low": 5.0, "high": math.inf, "unit": "x"}) == "[5x, inf]"
    assert interval({"low": -1.5, "high": 0.25, "unit": "pt"}) == "[-1.5 pt, 0.25 pt]"


def test_claim_g_agrees_disagrees_or_is_inconclusive_by_the_bytes_its_runs_sent(tmp_path):
    """The machinery, on figures made up for each verdict; never what today's measurement gives."""
    assert judge_g(tmp_path / "inside", [10_000, 10_200])["verdict"] == AGREE          # 333x..340x: inside 270..600
    assert judge_g(tmp_path / "little", [100_000, 101_000])["verdict"] == DISAGREE     # 34x: clear of it
    assert judge_g(tmp_path / "much", [3_400, 3_450])["verdict"] == DISAGREE           # 1000x: clear above it
    one = judge_g(tmp_path / "one", [10_000])                                          # 340x, but one run a side:
    assert one["verdict"] == INCONCLUSIVE                                              # no interval to judge by
    assert (one["parts"][0]["low"], one["parts"][0]["high"]) == (0.0, math.inf)
    across = judge_g(tmp_path / "across", [10_000, 15_000])                           # 227x..340x over repeats
    assert across["verdict"] == INCONCLUSIVE
    part = across["parts"][0]
    assert part["low"] == pytest.approx(3_400_000 / 15_000) and part["high"] == pytest.approx(340)
    assert part["detail"]["interval"] == "range over repeats"


def test_a_claim_whose_experiments_have_not_run_is_inconclusive_or_out_of_scope_and_says_so(tmp_path):
    for claim in catalog.CLAIMS:
        r = judge.judge(claim, True, str(tmp_path))
        assert r["verdict"] in (INCONCLUSIVE, OUT_OF_SCOPE) and all(p["why"] for p in r["parts"]), claim.id
        assert r["source_conditions"] or claim.conditions == Conditions(), claim.id


def test_a_claim_measured_outside_its_sources_conditions_is_out_of_scope_and_says_why(tmp_path):
    """MXNet's 2-bit speedups were measured on its parameter server with GPU nodes: measured here
    on a CPU ring (b, on mxnet-speed's real runs), a 3x speedup is not a verdict about the claim.
    The same figure with the conditions matched (lifted here) disagrees."""
    name = EXPERIMENTS["mxnet-speed"].sweep_name(True)
    for method, t in (("none", 0.3), ("twobit:threshold=0.5", 0.1)):
        cell(str(tmp_path), name, params_of("mxnet-speed", workload="{conv}", bw="{low}", compressor=method), [t] * 8)
    here = judge.judge(catalog.BY_ID["b"], True, str(tmp_path))
    assert here["verdict"] == OUT_OF_SCOPE
    (part,) = here["parts"]
    assert part["value"] is None and part["why"].startswith("out of scope here, because ")
    assert "parameter server" in part["why"] and "GPU" in part["why"]
    # the device is the runs' own (a store of CPU runs stays CPU whatever is asked: see the mixed-store test)
    on_gpu = judge.judge(catalog.BY_ID["b"], True, str(tmp_path), device="cuda")
    assert "parameter server" in on_gpu["parts"][0]["why"] and "GPUs; here on CPUs" in on_gpu["parts"][0]["why"]
    assert judge.judge(anywhere("b"), True, str(tmp_path))["verdict"] == DISAGREE
    # an accuracy part does not depend on the device or the links, a speed part does
    assert catalog.BY_ID["f"].conditions.device == "gpu"          # DGC's GPUs: its accuracies are judged on CPUs
    assert judge.in_scope(catalog.BY_ID["f"], True, "cpu") == catalog.BY_ID["f"].parts
    assert judge.in_scope(catalog.BY_ID["l"], True, "cpu") == []


def test_a_replay_of_gpu_traces_pushed_to_a_server_is_judged_in_mxnets_regime_on_a_cpu_host(tmp_path):
    """Claims a (its speed part) and c read MXNet's arrangement replayed: the H200 traces of the
    FC-heavy mlp pushed to one parameter server. Their compute is the GPU's and the model an MLP,
    read from the traces themselves, so on this CPU host they are in scope and judged (a 3x
    speedup disagrees with c's "little benefit"); a's second part (a bigger FC model), b (a CNN) and
    v still read real runs over the ring and stay out of scope. Planted, the replay's device taken
    from the host that ran it (here() ignoring the traces): c out of scope on CPUs, fails."""
    from gctestbed.claims import conditions
    h = judge._here("mxnet-ps-replay", True, "cpu")
    assert (h.device, h.models, h.comms, h.replayed) == ("gpu", ("MLP",), ("ps",), True)
    assert "replayed from traces" in h.describe()
    for claim_id in "ac":
        assert judge.in_scope(catalog.BY_ID[claim_id], True, "cpu")[0].experiment == "mxnet-ps-replay"
    assert judge.in_scope(catalog.BY_ID["c"], False, "cpu") == catalog.BY_ID["c"].parts
    assert judge.in_scope(catalog.BY_ID["b"], True, "cpu") == [] and judge.in_scope(catalog.BY_ID["v"], True, "cpu") == []
    judge_c(tmp_path, [0.3] * 8, [0.1] * 8)
    c = judge.judge(catalog.BY_ID["c"], True, str(tmp_path))
    assert c["verdict"] == DISAGREE and c["parts"][0]["value"] == pytest.approx(3.0), c["parts"][0]
    assert "replayed" in c["conditions_here"]["mxnet-ps-replay"]
    # a trace recorded on a CPU is a CPU's compute: out of scope for a GPU claim, whoever replays it
    cpu_trace = str(tmp_path / "cpu.json")
    job = {"workload": "mlp"}
    with open(cpu_trace, "w") as f:
        json.dump({"format": "gctestbed-trace", "version": 2, "job": job, "recorded": {"device": "cpu"}}, f)
    assert conditions.replayed(f"replay:trace={cpu_trace}") == (("MLP",), ("cpu",))
    assert conditions.replayed("mlp:width=8") is None
    # a trace that cannot be read here: its device and model are not known, and the reason says so (planted:
    # the host's CPU taken for the replay's device, "here on CPUs")
    gone = conditions.here({"bw": ["1gbit"], "latency": ["0"], "nodes": ["2"], "comm": ["ps"],
                            "workload": [f"replay:trace={tmp_path / 'gone'},compute=sleep"]}, "cpu")
    why = conditions.mismatches(catalog.MXNET_PS, gone, conditions.SPEED)
    assert len(why) == 1 and "cannot be read here" in why[0] and "CPUs" not in why[0], why
    assert f"there is no {tmp_path / 'gone'}" in why[0] and "cannot be read here" in gone.describe()
    # a trace without where it was recorded: said so, not a KeyError (planted: the fields read unguarded)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"format": "gctestbed-trace", "version": 2, "job": {"workload": "mlp"}}))
    assert "without its job's workload or where it was recorded" in conditions.unread(f"replay:trace={bare}")
    # a GPU trace whose replay runs some of the job's work on this CPU (the method for real) computed on both
    axes = {"bw": ["1gbit"], "latency": ["0"], "nodes": ["2"], "comm": ["ps"]}
    impure = conditions.here({**axes, "workload": ["replay:trace=@h200/evening,compute=sleep,codec=real"]}, "cpu")
    pure = conditions.here({**axes, "workload": [X.H200_FC]}, "cpu")
    assert conditions.mismatches(catalog.MXNET_PS, pure, conditions.SPEED) == []
    assert impure.device == "cpu+gpu" and conditions.mismatches(catalog.MXNET_PS, impure, conditions.SPEED) == [
        "the source's nodes computed on GPUs; the runs here mix CPU and GPU nodes, and a figure over both is neither's"]
    assert conditions.here({"bw": ["1gbit"], "latency": ["0"], "nodes": ["2"],
                            "workload": [f"replay:trace={cpu_trace}"]}, "cpu").device == "cpu"


def test_a_speed_leaves_out_the_repeats_the_host_paced(tmp_path, monkeypatch):
    """A replayed run marked HOST-BOUND measured this host, not the emulated cluster: a speed part
    leaves its seed out of that setting for both methods (so they still pair by seed) and says so.
    Seed 1's none ran slow (0.5 s) at the low rate and was paced; the other seeds read 2.0x; at the
    high rate seed 1 is kept. Planted (paced runs read): the figure is no longer 2.0x over seeds 0
    and 2."""
    for seed, t in ((0, 0.2), (1, 0.5), (2, 0.2)):
        for bw in ("{low}", "{high}"):
            ps_cell(tmp_path, "none", [t] * 8, bw=bw, repeat=seed, seed=seed)
            ps_cell(tmp_path, "twobit", [0.1] * 8, bw=bw, repeat=seed, seed=seed)
    load = cells.load
    low = parse_rate(EXPERIMENTS["mxnet-ps-replay"].fill(True, "{low}"))
    monkeypatch.setattr(cells, "load", lambda d, n: [dataclasses.replace(
        r, host_bound=(r.seed == 1 and r.method == "none" and r.bw_bps == low)) for r in load(d, n)])
    part = judge.judge(anywhere("a"), True, str(tmp_path))["parts"][0]
    assert part["value"] == pytest.approx(2.0) and part["detail"]["seeds"] == [0, 2], part
    assert "left out, where the host paced a run (1 of 12 runs HOST-BOUND): seed 1 at 1gbit" in part["why"], part["why"]
    high = judge.judge(anywhere("c"), True, str(tmp_path))["parts"][0]       # the high rate: seed 1 kept
    assert high["detail"]["seeds"] == [0, 1, 2], high
    rows = [dataclasses.replace(r, host_bound=None) for r in load(str(tmp_path), EXPERIMENTS["mxnet-ps-replay"].sweep_name(True))]
    assert judge.unpaced(rows) == (rows, "")          # real runs (host_bound None) are never left out


def test_a_baseline_a_replayed_experiment_has_no_trace_of_is_not_planned(tmp_path):
    """--baseline bf16: the replayed experiment's traces hold no bf16 run, so it plans none (its
    sweep would otherwise fail to build) and c's part has no figure; fp16, which it has, is added."""
    judge_c(tmp_path, [0.1] * 8, [0.1] * 8)
    out = judge.judge(anywhere("c"), True, str(tmp_path), baseline="bf16")
    assert out["verdict"] == INCONCLUSIVE and "replays traces and holds none of bf16" in out["parts"][0]["why"]
    exp = EXPERIMENTS["mxnet-ps-replay"]
    assert "fp16" in judge._grid(exp, True, "unused", baseline="fp16").axes["compressor"]
    assert "bf16" not in judge._grid(exp, True, "unused", baseline="bf16").axes["compressor"]
    assert len(sweep.plan(judge._grid(exp, True, "unused", baseline="fp16"))) == 3 * 2 * 2 * 3   # methods, rates, latencies, seeds


def test_the_utility_study_is_out_of_scope_below_ten_gigabits():
    from gctestbed.claims import conditions
    h = conditions.here({"bw": ["100mbit", "2gbit"], "latency": ["0"], "workload": ["resnet50"], "nodes": ["2"]}, "cuda")
    why = conditions.mismatches(catalog.UTILITY_RUNS, h, conditions.SPEED)
    assert why == ["the source spoke of links of 10 Gbit/s to 100 Gbit/s; here the links run at 100 Mbit/s, 2 Gbit/s"]
    fast = conditions.here({"bw": ["10gbit", "25gbit"], "latency": ["0"], "workload": ["resnet50"], "nodes": ["2"]}, "cuda")
    assert conditions.mismatches(catalog.UTILITY_RUNS, fast, conditions.SPEED) == []


def test_a_claim_about_one_class_of_model_is_out_of_scope_on_another():
    """The variance paper's claims were made on convolutional networks (CIFAR-10, ImageNet): judged
    on the text task's LSTM they would be out of scope, with the classes named; on the digits'
    ResNet-18, where i and k are measured, they are judged. DGC's were made on CNNs and LSTMs, so
    the LSTM task is theirs (planted: the gate not read, k's parts on the LSTM are judged)."""
    from gctestbed.claims import conditions
    lstm = conditions.here({"bw": ["1gbit"], "latency": ["0"], "nodes": ["2"], "workload": ["lstm:hidden=128"]}, "cpu")
    conv = conditions.here({"bw": ["1gbit"], "latency": ["0"], "nodes": ["2"], "workload": ["resnet18:scale=0.125"]}, "cpu")
    assert (lstm.models, conv.models) == (("RNN",), ("CNN",))
    assert conditions.mismatches(catalog.VARIANCE_RUNS, lstm, conditions.ACCURACY) == [
        "the source's claim is about CNNs (a VGG-like network on CIFAR-10, ResNet-50 on ImageNet); here RNNs"]
    assert conditions.mismatches(catalog.VARIANCE_RUNS, conv, conditions.ACCURACY) == []
    assert conditions.mismatches(catalog.DGC_RUNS, lstm, conditions.ACCURACY) == []
    # a speed reads the class too: the utility study's ResNets and BERT are not an LSTM
    fast_lstm = conditions.here({"bw": ["25gbit"], "latency": ["0"], "nodes": ["8"], "workload": ["lstm"]}, "cuda")
    assert conditions.mismatches(catalog.UTILITY_RUNS, fast_lstm, conditions.SPEED) == [
        "the source's claim is about CNNs and transformers (V100-class GPU compute (ResNet-50/101, BERT)); here RNNs"]
    # a workload of no known class is its own name, never taken for one of the source's
    own = conditions.here({"bw": ["1gbit"], "latency": ["0"], "nodes": ["2"], "workload": ["mine.train:model"]}, "cpu")
    assert conditions.mismatches(catalog.DGC_RUNS, own, conditions.ACCURACY) != []
    assert conditions.mismatches(catalog.MXNET_ACC, own, conditions.ACCURACY) == []      # MXNet's FAQ names none
    # in the catalogue: i and k are measured on the digits' ResNet-18 (a CNN), h too; e, f and w on the text
    # task's LSTM (their source's LSTMs); on the LSTM, i's and k's parts would be out of scope
    for claim in "ikhefw":
        assert judge.in_scope(catalog.BY_ID[claim], True, "cpu") == catalog.BY_ID[claim].parts, claim
    def on_lstm(claim_id):
        claim = catalog.BY_ID[claim_id]
        return dataclasses.replace(claim, parts=[dataclasses.replace(p, experiment="accuracy-sgd") for p in claim.parts])
    assert judge.in_scope(on_lstm("k"), True, "cpu") == []
    # d, MXNet's 1 %, cites Strom's fully-connected DNNs: on the LSTM it would be out of scope too, not on the MLP
    assert judge.in_scope(catalog.BY_ID["d"], True, "cpu") == catalog.BY_ID["d"].parts
    assert judge.in_scope(on_lstm("d"), True, "cpu") == []
    assert judge.in_scope(on_lstm("s"), True, "cpu") == on_lstm("s").parts     # the residual's mechanism: any model


def test_a_speed_measured_on_a_cluster_size_the_source_did_not_run_is_out_of_scope():
    """DGC's speedups were measured on 4 to 64 GPUs: a speed on 2 nodes is out of scope with the
    sizes named, one on 8 and 16 nodes is not; an accuracy does not read the cluster size (shown
    beside the verdict, not gating it). Planted: the gate not read, the 2-node speed is judged."""
    from gctestbed.claims import conditions
    gpu = dataclasses.replace(catalog.DGC_RUNS, optimizer="any")
    small = conditions.here({"bw": ["1gbit"], "latency": ["0"], "nodes": ["2", "8"], "workload": ["resnet50"]}, "cuda")
    large = conditions.here({"bw": ["1gbit"], "latency": ["0"], "nodes": ["8", "16"], "workload": ["resnet50"]}, "cuda")
    assert conditions.mismatches(gpu, small, conditions.SPEED) == ["the source ran clusters of 4 to 64 nodes; here 2, 8 nodes"]
    assert conditions.mismatches(gpu, large, conditions.SPEED) == []
    assert conditions.mismatches(gpu, small, conditions.ACCURACY) == []
    assert conditions.mismatches(catalog.UTILITY_RUNS, conditions.here(
        {"bw": ["10gbit"], "latency": ["0"], "nodes": ["128"], "workload": ["resnet50"]}, "cuda"), conditions.SPEED) == [
        "the source ran clusters of at most 64 nodes; here 128 nodes"]


def test_every_part_in_scope_reads_methods_its_experiment_runs(tmp_path):
    """Every experiment in scope on CPU filled (the accuracy and byte ones, and the replayed
    parameter-server one), every method of its grid at each rate run twice (seeds 0 and
    1), none at 60 % sending 10,000 bytes a step, the control at 20 %, every other method at 60 %
    sending 1,000: each part in scope on CPU must then have a value. A part whose figure reads a
    method its experiment no longer runs would be "not measured" for ever (planted: Strom's taus
    taken out of variance-sgd, or 2-bit's thresholds out of accuracy-mlp, fail it)."""
    import itertools
    read = {p.experiment for c in catalog.CLAIMS for p in judge.in_scope(c, True, "cpu")}
    assert {"accuracy-mlp", "variance-sgd", "accuracy-sgd"} <= read
    for name in sorted(read):
        exp = EXPERIMENTS[name]
        grid = exp.grid(True, results_dir="unused")
        axes = ("workload", "compressor", "bw", "latency")
        for values in itertools.product(*(grid.axes[a] for a in axes)):
            params = dict(zip(axes, values))
            acc = 0.20 if params["compressor"] == exp.control else 0.60
            for seed in (0, 1):
                cell(str(tmp_path), exp.sweep_name(True), params_of(name, **params), [0.1] * 3, acc, 1_000_000,
                     tx=10_000 if params["compressor"] == "none" else 1_000, repeat=seed, seed=seed)
    for claim in catalog.CLAIMS:
        parts = judge.in_scope(claim, True, "cpu")
        if not parts:
            continue
        out = judge.judge(claim, True, str(tmp_path))
        for part, got in zip(claim.parts, out["parts"]):
            if part in parts:
                assert got["value"] is not None, (claim.id, got["label"], got.get("why"))


def test_cells_an_older_experiment_ran_on_another_task_are_not_read(tmp_path):
    """The Adam experiment moved from the clean digits to the noised ones under the same sweep name:
    a store holding both reads only the noised digits' runs (planted: every finished cell read,
    each seed has two runs of none and the figure is not the noised task's 0.0 points)."""
    name, exp = EXPERIMENTS["accuracy-adam"].sweep_name(True), EXPERIMENTS["accuracy-adam"]
    clean = "resnet18:scale=0.125,image=32,classes=10,data=digits"
    assert params_of("accuracy-adam")["workload"] != clean
    for workload, accs in ((None, {"none": 0.80, X.VARIANCE: 0.80, exp.control: 0.40}),
                           (clean, {"none": 0.97, X.VARIANCE: 0.90, exp.control: 0.90})):
        for method, acc in accs.items():
            for seed in (0, 1):
                params = params_of("accuracy-adam", compressor=method, **({"workload": workload} if workload else {}))
                cell(str(tmp_path), name, params, [0.1] * 3, acc, 1_000_000, repeat=seed, seed=seed,
                     run_id=f"{'old' if workload else 'new'}-{abs(hash(method)) % 10**6}-{seed}")
    out = judge.judge(anywhere("h"), True, str(tmp_path))
    part = out["parts"][1]
    assert part["value"] == pytest.approx(0.0) and part["low"] == pytest.approx(0.0), part
    # the old task's cells are no longer planned: counted apart, never offered to be run again
    assert (out["cells_unplanned"], out["cells_stale"]) == ({name: 6}, {name: 0}) and "not read" not in part["why"]


def test_cells_finished_with_settings_the_experiment_no_longer_gives_are_not_read(tmp_path):
    """The MLP experiment was made longer under the same sweep name: 2-bit's cells, finished with
    fewer steps than it now gives, are not read (the part has no 2-bit runs) until they are run
    again with its steps; a shared seed is not a reason to drop a cell (the figure names it).
    Planted: every cell of the experiment's workloads read (the filter before) -> a value at once."""
    name, exp = EXPERIMENTS["accuracy-mlp"].sweep_name(True), EXPERIMENTS["accuracy-mlp"]
    steps = settings_of(name)["steps"]
    for method, acc in (("none", 0.90), ("twobit:threshold=0.01", 0.85), (exp.control, 0.50)):
        for seed in (0, 1):
            cell(str(tmp_path), name, params_of("accuracy-mlp", compressor=method), [0.1] * 3, acc, 1_000_000,
                 repeat=seed, seed=seed, **({"steps": steps // 2} if method.startswith("twobit") else {}))
    out = judge.judge(anywhere("d"), True, str(tmp_path))
    part = out["parts"][0]
    assert part["value"] is None and "no finished run of twobit" in part["why"], part
    assert "has 2 finished cells not read" in part["why"] and out["cells_stale"] == {name: 2}, (part["why"], out)
    assert out["cells_unplanned"] == {name: 0}
    for seed in (0, 1):                 # run again as the experiment now gives it
        cell(str(tmp_path), name, params_of("accuracy-mlp", compressor="twobit:threshold=0.01"), [0.1] * 3, 0.85,
             1_000_000, repeat=seed, seed=seed, run_id=f"again-{seed}")
    part = judge.judge(anywhere("d"), True, str(tmp_path))["parts"][0]
    assert part["value"] == pytest.approx(-5.0), part
    for seed in (0, 1):                 # both repeats of 2-bit on one seed: read, and named by the figure
        cell(str(tmp_path), name, params_of("accuracy-mlp", compressor="twobit:threshold=0.01"), [0.1] * 3, 0.85,
             1_000_000, repeat=seed, seed=7, run_id=f"shared-{seed}")
    part = judge.judge(anywhere("d"), True, str(tmp_path))["parts"][0]
    assert part["value"] is None and "share a seed" in part["why"], part
    # the control's cells stale, the method's not: the control gate says the control was not measured,
    # and why (planted: the note only where the part itself has no figure -> missing here)
    for method, acc in (("none", 0.90), ("twobit:threshold=0.01", 0.85), (exp.control, 0.50)):
        for seed in (0, 1):
            cell(str(tmp_path / "control"), name, params_of("accuracy-mlp", compressor=method), [0.1] * 3, acc,
                 1_000_000, repeat=seed, seed=seed, **({"steps": steps // 2} if method == exp.control else {}))
    part = judge.judge(anywhere("d"), True, str(tmp_path / "control"))["parts"][0]
    assert part["verdict"] == INCONCLUSIVE and "positive control" in part["why"], part
    assert "has 2 finished cells not read" in part["why"], part["why"]
    # one stale cell is one, and an experiment whose cells are all stale keeps its control's line, saying why
    cell(str(tmp_path / "one"), name, params_of("accuracy-mlp", compressor="none"), [0.1] * 3, 0.9, 1_000_000, steps=steps // 2)
    assert "has 1 finished cell not read" in (w := judge.judge(anywhere("d"), True, str(tmp_path / "one"))["parts"][0]["why"]) \
        and "runs it again" in w, w
    [control] = judge.controls([anywhere("d")], True, str(tmp_path / "one"))
    assert control["value"] is None and control["why"].startswith("no finished run") and "has 1 finished cell" in control["why"]


@pytest.mark.parametrize("setting, other", [("steps", 7), ("lr", 0.123), ("eval_every", 13), ("bucket_cap_mb", 0.5),
                                            ("cpus_per_node", 0.5)])
def test_each_setting_an_experiment_gives_its_cells_decides_whether_a_cell_is_read(tmp_path, setting, other):
    """One of none's two repeats finished with another value of one setting the experiment gives every
    cell: that cell is not read, the other is. Planted: a setting left out of judge.JUDGED -> both
    read. (Not dilate: no claims experiment replays, and a real model's run cannot be dilated.)"""
    name = EXPERIMENTS["accuracy-mlp"].sweep_name(True)
    assert settings_of(name)[setting] != other
    for seed in (0, 1):
        cell(str(tmp_path), name, params_of("accuracy-mlp", compressor="none"), [0.1] * 3, 0.9, 1_000_000,
             repeat=seed, seed=seed, **({setting: other} if seed else {}))
    read = judge._rows(str(tmp_path), EXPERIMENTS["accuracy-mlp"], True)
    assert [r.repeat for r in read.rows] == [0] and [r.repeat for r in read.stale] == [1] and not read.unplanned


def test_a_repeat_run_is_read_with_its_own_count_of_repeats(tmp_path):
    """``claims run --repeat 5`` stores five repeats under its own sweep name: all five are read
    (planted: the grid planned with the experiment's own count of repeats -> those past it dropped)."""
    exp = EXPERIMENTS["accuracy-mlp"]
    assert exp.setup(True).repeat < 5
    for seed in range(5):
        cell(str(tmp_path), judge._sweep(exp, True, 5), params_of("accuracy-mlp", compressor="none"), [0.1] * 3, 0.9,
             1_000_000, repeat=seed, seed=seed)
    read = judge._rows(str(tmp_path), exp, True, repeat=5)
    assert sorted(r.repeat for r in read.rows) == [0, 1, 2, 3, 4] and not read.stale and not read.unplanned


def test_claims_report_writes_a_page_with_a_picture_per_claim(tmp_path):
    judge_c(tmp_path, [0.1] * 12, [0.1] * 12, [0.2] * 12, [0.1] * 12)
    out = here("claims", "report", "c", "s", "--results", str(tmp_path), "--out", str(tmp_path / "out"), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [c["verdict"] for c in report["claims"]] == [AGREE, INCONCLUSIVE] and report["claims"][0]["toy"]
    page = (tmp_path / "out" / "report.html").read_text()
    assert "src=\"claim-c.png" not in page and page.count("data:image/png;base64,") == 2 and "(toy scale)" in page
    assert gct("claims", "run", "--results", str(tmp_path)).returncode == 2          # no id, no --all: a sentence


def test_the_verdicts_are_written_into_a_markdown_page_between_its_markers(tmp_path):
    judge_d(tmp_path, 0.90, 0.90, 1_000_000)
    doc = tmp_path / "claims.md"
    doc.write_text("# intro\n\n<!-- claims:begin (generated by gctestbed claims run/report --doc) -->\nold\n"
                   "<!-- claims:end -->\n\nkept\n")
    out = here("claims", "report", "b", "d", "w", "--results", str(tmp_path), "--out", str(tmp_path / "out"), "--doc", str(doc))
    assert out.returncode == 0, out.stderr
    text = doc.read_text()
    assert "- departures that do not gate the verdict: the paper clips each node's whole gradient" in text   # w's
    control = EXPERIMENTS["accuracy-mlp"].control                  # d's: 50 % against none's 90 %: 40 points, visibly
    assert f"Positive controls (a method that must lose, against none): accuracy-mlp: {control} lost 40.00 points" in text
    assert "over 1 run each (more than 1 point, its whole interval clear)" in text and "accuracy-adam" not in text
    assert text.startswith("# intro") and text.endswith("kept\n") and "\nold\n" not in text
    assert "### b. out of scope here (toy scale)" in text and "### d. agree (toy scale)" in text
    assert "the source's conditions: comm ps; GPU nodes" in text and "a whole interval below -1" in text
    assert "out of scope here, because the source measured workers meeting over a parameter server" in text


@pytest.mark.slow
@pytest.mark.root
def test_claim_g_runs_end_to_end_and_reads_the_kernels_counters(tmp_path, state_dir):
    """DGC's 270-600x, on real 2-node runs of the AlexNet and ResNet-50 layouts packed as the paper's
    (toy width, one seed: under a minute): 'claims run g' runs its experiment and judges it from the
    kernel's counters, whatever the verdict (the verdict rule is tested above on made-up figures).
    The counters agree with the payloads alone, so nothing but gradients crossed the wire (planted:
    ResNet-50 with DDP's buffer broadcast, 64x on the wire against 94x of payload, fails)."""
    out = gct("claims", "run", "g", "--quick", "--repeat", "1", "--json", "--results", str(tmp_path), cwd=str(tmp_path),
              timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    (g,) = json.loads(out.stdout)["claims"]
    assert g["id"] == "g" and g["toy"] and g["verdict"] == INCONCLUSIVE     # one run a side: no interval to judge
    for part in g["parts"]:
        assert part["value"] is not None and part["detail"]["wire_bytes_per_step"] > 0 and part["high"] is None
        # the accounting and the kernel's counters tell the same story, within headers' worth
        assert part["value"] == pytest.approx(part["detail"]["payload_ratio"], rel=0.25)


def test_with_another_baseline_the_speed_parts_compare_against_it(tmp_path):
    for method, t in (("none", 0.3), ("fp16", 0.15), ("twobit", 0.1)):
        for bw in ("{low}", "{high}"):
            for seed in (0, 1):
                ps_cell(tmp_path, method, [t] * 8, bw=bw, repeat=seed, seed=seed)
    against_none = judge.judge(anywhere("c"), True, str(tmp_path))
    against_fp16 = judge.judge(anywhere("c"), True, str(tmp_path), baseline="fp16")
    assert against_none["parts"][0]["value"] == pytest.approx(3.0) and against_none["verdict"] == DISAGREE
    assert against_fp16["parts"][0]["value"] == pytest.approx(1.5) and against_fp16["baseline"] == "fp16"


def test_the_accuracy_interval_is_the_textbook_wald_interval_of_two_proportions(tmp_path):
    """Written from the formula (difference of two binomial proportions, 95 %: 1.96 standard
    errors), not from figures.py: 0.90 and 0.80 on 360 held-out images each."""
    import math
    d = judge_d(tmp_path, 0.90, 0.80, 360)["parts"][0]
    half = 1.96 * math.sqrt(0.9 * 0.1 / 360 + 0.8 * 0.2 / 360)
    assert d["value"] == pytest.approx(-10.0)
    assert d["low"] == pytest.approx(100 * (-0.1 - half)) and d["high"] == pytest.approx(100 * (-0.1 + half))


def test_the_crossover_is_the_log_bandwidth_interpolation_worked_by_hand(tmp_path):
    """none takes 0.2 s a step at 100 Mbit/s and at 1 Gbit/s; the method 0.1 s and 0.4 s: speedups
    2 and 0.5, so it falls through 1 two thirds of the way in log-bandwidth, at
    10^(8 + 2/3) = 464 Mbit/s (computed here from the numbers, not by breakeven.crossing)."""
    from gctestbed.claims import figures
    name = EXPERIMENTS["crossover"].sweep_name(True)
    for bw, (none_s, m_s) in (("100mbit", (0.2, 0.1)), ("1gbit", (0.2, 0.4))):
        for method, t in (("none", none_s), ("topk:ratio=0.01", m_s)):
            cell(str(tmp_path), name, params_of("crossover", bw=bw, compressor=method), [t] * 8)
    x = figures.crossover(cells.load(str(tmp_path), name), "topk:ratio=0.01", "none")
    assert x.value == pytest.approx(10 ** (8 + 2 / 3), rel=1e-6) and x.low <= x.value <= x.high


def test_time_to_accuracy_is_steps_to_the_target_times_step_time_worked_by_hand(tmp_path):
    """Both reach none's final accuracy less a point (0.89) at their one evaluation, after step 8;
    none at 0.1 s a step, DGC at 0.05 s: 0.8 s over 0.4 s, 2x. A DGC that ends at 0.85 never
    reaches it, and the figure says so."""
    from gctestbed.claims import figures
    name = EXPERIMENTS["accuracy-sgd"].sweep_name(True)
    dgc = EXPERIMENTS["accuracy-sgd"].fill(True, "dgc:ratio=0.001,warmup_epochs=4,steps_per_epoch={epoch},clip_norm=1")
    for method, t, acc in (("none", 0.1, 0.90), (dgc, 0.05, 0.90)):
        cell(str(tmp_path / "fast"), name, params_of("accuracy-sgd", compressor=method), [t] * 8, acc, 2048)
    x = figures.time_to_accuracy(cells.load(str(tmp_path / "fast"), name), dgc, "none")
    assert x.value == pytest.approx(2.0) and x.detail["target_accuracy"] == pytest.approx(0.89)
    for method, t, acc in (("none", 0.1, 0.90), (dgc, 0.05, 0.85)):
        cell(str(tmp_path / "short"), name, params_of("accuracy-sgd", compressor=method), [t] * 8, acc, 2048)
    short = figures.time_to_accuracy(cells.load(str(tmp_path / "short"), name), dgc, "none")
    assert short.value is None and "never reached" in short.why


def judge_i(tmp_path, taus: list[tuple], control: float = 0.20) -> dict:
    """Claim i on a made-up store: none at 60 % sending 10,000 bytes a step, the control at 20 %,
    and Strom's tau, in the experiment's order, at the (accuracy, bytes[, spread]) given. Two
    repeats each (seeds 0 and 1, paired): a tau's accuracy is its value -/+ spread in them (none's
    and the control's are the same in both), so with no spread its interval is zero-wide."""
    name, exp = EXPERIMENTS["variance-sgd"].sweep_name(True), EXPERIMENTS["variance-sgd"]
    for method, (acc, tx, *spread) in [("none", (0.60, 10_000)), (exp.control, (control, 10_000)), *zip(STROM_TAUS, taus)]:
        for seed, sign in ((0, -1), (1, 1)):
            cell(str(tmp_path), name, params_of("variance-sgd", compressor=method), [0.1] * 3,
                 acc + sign * (spread or [0.0])[0], 2_000, tx=tx, repeat=seed, seed=seed)
    return judge.judge(catalog.BY_ID["i"], True, str(tmp_path))


def test_claim_i_is_judged_on_the_tau_curve_worked_by_hand(tmp_path):
    """Brittle: the taus that keep accuracy (1e-5 at 1x, 1e-4 at 5x, -0.2 points) compress at most
    5x, and the first tau past 10x (1e-3, 20x) loses 6 points: both parts agree. Not brittle: 1e-3
    keeps accuracy at 20x, so the kept compression is 20x (over 10: disagree) and the first tau past
    10x loses nothing (disagree)."""
    brittle = judge_i(tmp_path / "brittle", [(0.60, 10_000), (0.598, 2_000), (0.54, 500), (0.30, 100), (0.20, 10)])
    kept, first = brittle["parts"]
    assert kept["value"] == pytest.approx(5.0) and kept["verdict"] == AGREE
    assert kept["detail"]["n"] == first["detail"]["n"] == 2     # two paired seeds behind every figure the parts read
    assert first["value"] == pytest.approx(-6.0) and first["detail"]["ratio"] == pytest.approx(20.0)
    assert brittle["verdict"] == AGREE
    robust = judge_i(tmp_path / "robust", [(0.60, 10_000), (0.598, 2_000), (0.60, 500), (0.50, 100), (0.20, 10)])
    kept, first = robust["parts"]
    assert kept["value"] == pytest.approx(20.0) and kept["verdict"] == DISAGREE
    assert first["value"] == pytest.approx(0.0, abs=1e-9) and first["verdict"] == DISAGREE
    # no tau keeps accuracy, not even by its interval: "a small tau compresses little" has no tau to
    # read, so the part is not measured (a 1x would agree by default) and the claim cannot agree
    lost = judge_i(tmp_path / "lost", [(0.50, 10_000), (0.40, 2_000), (0.30, 500), (0.20, 100), (0.20, 10)])
    assert lost["parts"][0]["value"] is None and lost["parts"][0]["verdict"] == INCONCLUSIVE
    assert "does not reach a setting that keeps it" in lost["parts"][0]["why"]
    assert lost["verdict"] != AGREE
    # 1e-3 at 20x loses 0.5 points, 0.6 and 0.4 in its two seeds: -0.5 +- 12.706 x 0.1 = [-1.77, +0.77]
    # points (Student's t, 1 degree of freedom), across the -1 edge. It keeps accuracy by its mean
    # (value 20x) but not by its whole interval (low: 1e-4's 5x), and may keep it (high 20x): [5, 20]
    # across 10, inconclusive
    across = judge_i(tmp_path / "across", [(0.60, 10_000), (0.598, 2_000), (0.595, 500, 0.001), (0.30, 100), (0.20, 10)])
    kept = across["parts"][0]
    assert (kept["value"], kept["low"], kept["high"]) == pytest.approx((20.0, 5.0, 20.0)) and kept["verdict"] == INCONCLUSIVE
    # a task too easy to tell (the control loses nothing): "keeps accuracy" means nothing, both parts inconclusive
    easy = judge_i(tmp_path / "easy", [(0.60, 10_000), (0.60, 2_000), (0.60, 500), (0.60, 100), (0.60, 10)], control=0.60)
    assert [p["verdict"] for p in easy["parts"]] == [INCONCLUSIVE, INCONCLUSIVE]
    assert all("too easy" in p["why"] for p in easy["parts"])


def test_speedups_and_byte_ratios_over_seeds_are_paired_t_intervals_on_log_ratios_worked_by_hand(tmp_path):
    """By hand: on seeds 0, 1, 2 none sends 8,000, 4,000 and 16,000 bytes a step and the method
    4,000, 1,000 and 2,000: paired ratios 2, 4, 8 (paired by size instead: 4, 4, 4). Their
    logarithms are ln 2 x (1, 2, 3): mean 2 ln 2 (the geometric mean, 4), standard deviation ln 2,
    t(0.975, 2 degrees) = 4.3027 (a t table), half width 4.3027 x 0.69315 / sqrt(3) = 1.72189,
    e^1.72189 = 5.5951: [4 / 5.5951, 4 x 5.5951] = [0.7149, 22.380]. Step times a ten-thousandth of
    the bytes give the same speedup. Repeats whose seeds do not pair (0, 1, 0) keep the range over
    repeats: 4,000 / 4,000 = 1 to 16,000 / 1,000 = 16."""
    from gctestbed.claims import figures
    name, method = EXPERIMENTS["accuracy-sgd"].sweep_name(True), "twobit:threshold=0.01"
    for seeds, where in (((0, 1, 2), "paired"), ((0, 1, 0), "shared")):
        for k, (seed, base, tx) in enumerate(zip(seeds, (8000, 4000, 16000), (4000, 1000, 2000))):
            cell(str(tmp_path / where), name, params_of("accuracy-sgd", compressor="none"), [base / 10_000] * 3, 0.9, 360,
                 tx=base, repeat=k, seed=seed)
            cell(str(tmp_path / where), name, params_of("accuracy-sgd", compressor=method), [tx / 10_000] * 3, 0.9, 360,
                 tx=tx, repeat=k, seed=seed)
    rows = cells.load(str(tmp_path / "paired"), name)
    for m in (figures.compression(rows, method), figures.speedup(rows, method, "none")):
        assert (m.value, m.low, m.high) == pytest.approx((4.0, 0.7149, 22.380), rel=1e-4)
        assert m.detail["seeds"] == [0, 1, 2] and "paired" in m.detail["interval"]
    shared = figures.compression(cells.load(str(tmp_path / "shared"), name), method)
    assert (shared.low, shared.high) == pytest.approx((1.0, 16.0)) and "range" in shared.detail["interval"]


_E = EXPERIMENTS
# per experiment: none's (accuracy, bytes a step) and its positive control's, which loses 40 points
_BASE = {name: {"none": (none, 10_000), _E[name].control: (none - 0.40, 10)}
         for name, none in (("accuracy-sgd", 0.60), ("dgc-recipe", 0.60), ("accuracy-adam", 0.90), ("variance-sgd", 0.90),
                            ("accuracy-mlp", 0.60))}

# claim -> (experiment, {case: (methods' (accuracy, bytes a step) beside the base, every part's verdict)}),
# each figure worked by hand from the part's definition (catalog.py), on 10^6 held-out samples
# (intervals a tenth of a point wide) and one run each
PER_CLAIM = {
    # d: 2-bit at its best threshold: 0.01's -0.2 pt (0.5, MXNet's default, loses 20); or at best -5 pt
    "d": ("accuracy-mlp", {"agree": ({X.TWOBIT_THRESHOLDS[0]: (0.40, 625), X.TWOBIT_THRESHOLDS[1]: (0.55, 625),
                                      X.TWOBIT_THRESHOLDS[2]: (0.598, 625), X.TWOBIT_THRESHOLDS[3]: (0.59, 625)}, [AGREE]),
                           "disagree": ({X.TWOBIT_THRESHOLDS[0]: (0.40, 625), X.TWOBIT_THRESHOLDS[1]: (0.55, 625),
                                         X.TWOBIT_THRESHOLDS[2]: (0.50, 625)}, [DISAGREE])}),      # 0.001 never ran
    "e": ("dgc-recipe", {"agree": ({X.DGC_FULL: (0.60, 10)}, [AGREE]),
                           "disagree": ({X.DGC_FULL: (0.50, 10)}, [DISAGREE])}),                    # -10 pt
    # f: the control (top 0.1 % alone, 20 %) loses 40 points; each step's gain is its accuracy minus the one before
    "f": ("accuracy-sgd", {"agree": ({X.DGC_ACC: (0.50, 10), X.DGC_MC: (0.55, 10), X.DGC_MASK: (0.58, 10),
                                      X.DGC_WARM: (0.59, 10)}, [AGREE] * 5),
                           "disagree": ({X.DGC_ACC: (0.15, 10), X.DGC_MC: (0.10, 10), X.DGC_MASK: (0.05, 10),
                                         X.DGC_WARM: (0.01, 10)}, [AGREE] + [DISAGREE] * 4)}),
    "h": ("accuracy-adam", {"agree": ({X.VARIANCE: (0.899, 50)}, [AGREE, AGREE]),                  # 200x, -0.1 pt
                            "disagree": ({X.VARIANCE: (0.80, 1000)}, [DISAGREE, DISAGREE])}),       # 10x, -10 pt
    # j: hybrid's ratio over the better of variance alpha 2's and Strom tau 0.01's: 500 / 250 = 2; 100 / 200 = 0.5
    "j": ("accuracy-adam", {"agree": ({X.HYBRID: (0.89, 20), X.VARIANCE_2: (0.90, 50), X.STROM_LARGE: (0.90, 40)},
                                      [AGREE, AGREE]),
                            "disagree": ({X.HYBRID: (0.80, 100), X.VARIANCE_2: (0.90, 50), X.STROM_LARGE: (0.90, 100)},
                                         [DISAGREE, DISAGREE])}),
    # k: 4-bit at 8x (inside 4-12) or 20x (outside), and the three rows' accuracies
    "k": ("variance-sgd", {"agree": ({X.QSGD_4BIT: (0.898, 1250), X.QSGD_3BIT: (0.898, 1500), X.QSGD_2BIT: (0.897, 600)},
                                     [AGREE] * 4),
                           "disagree": ({X.QSGD_4BIT: (0.85, 500), X.QSGD_3BIT: (0.85, 1500), X.QSGD_2BIT: (0.80, 600)},
                                        [DISAGREE] * 4)}),
    # s: without the residual -20 pt and the residual gains 19; or neither loses nor gains
    "s": ("accuracy-sgd", {"agree": ({X.TWOBIT_DISCARD: (0.40, 625), "twobit:threshold=0.01": (0.59, 625)}, [AGREE] * 2),
                           "disagree": ({X.TWOBIT_DISCARD: (0.60, 625), "twobit:threshold=0.01": (0.60, 625)},
                                        [DISAGREE] * 2)}),
    # t: ratios 100, 200, 500 rise by 2 and 2.5 (smallest 2); 500, 200, 100 fall (0.4, 0.5)
    "t": ("accuracy-adam", {"agree": ({X.VARIANCE: (0.90, 100), X.VARIANCE_15: (0.90, 50), X.VARIANCE_2: (0.899, 20)},
                                      [AGREE, AGREE]),
                            "disagree": ({X.VARIANCE: (0.90, 20), X.VARIANCE_15: (0.90, 50), X.VARIANCE_2: (0.80, 100)},
                                         [DISAGREE, DISAGREE])}),
    "w": ("accuracy-sgd", {"agree": ({X.DGC_MASK: (0.50, 10), X.DGC_CLIP: (0.55, 10)}, [AGREE]),     # +5 pt
                           "disagree": ({X.DGC_MASK: (0.50, 10), X.DGC_CLIP: (0.40, 10)}, [DISAGREE])}),
    # u: momentum SGD, variance alpha 2 at 200x and -0.1 pt; or at 10x and -10 pt
    "u": ("variance-sgd", {"agree": ({X.VARIANCE_2: (0.899, 50)}, [AGREE, AGREE]),
                           "disagree": ({X.VARIANCE_2: (0.80, 1000)}, [DISAGREE, DISAGREE]),
                           "mixed": ({X.VARIANCE_2: (0.80, 50)}, [AGREE, DISAGREE])}),      # 200x but -10 pt
    # z: both reach none's final accuracy less a point at their one evaluation, step 3; full DGC's
    # steps take half of none's (time ratio 2) or twice (0.5)
    "z": ("dgc-recipe", {"agree": ({X.DGC_FULL: (0.60, 10, 0.05)}, [AGREE]),
                         "disagree": ({X.DGC_FULL: (0.60, 10, 0.2)}, [DISAGREE])}),
}


@pytest.mark.parametrize("claim_id, case", [(c, k) for c, (_, cases) in PER_CLAIM.items() for k in cases])
def test_each_claim_of_the_accuracy_tasks_gives_each_verdict_on_measurements_made_for_it(tmp_path, monkeypatch, claim_id, case):
    """Every claim measured on the accuracy tasks, its source's conditions lifted (what is tested is
    its figures, not its scope), fed made-up measurements that must make each of its parts agree,
    and others that must make them disagree (the positive control losing in both). A method the
    experiment no longer runs for an out-of-scope claim (u's alpha 2) is put back in its grid."""
    experiment, cases = PER_CLAIM[claim_id]
    methods, verdicts = cases[case]
    exp = _E[experiment]
    planned = exp.axes["compressor"]
    monkeypatch.setitem(exp.axes, "compressor", planned + [m for m in methods if m not in planned])
    for method, (acc, tx, *step_s) in {**_BASE[experiment], **methods}.items():
        for seed in (0, 1):                     # two paired repeats that agree: zero-wide intervals
            cell(str(tmp_path), exp.sweep_name(True), params_of(experiment, compressor=method),
                 [(step_s or [0.1])[0]] * 3, acc, 1_000_000, tx=tx, repeat=seed, seed=seed)
    out = judge.judge(anywhere(claim_id), True, str(tmp_path))
    assert [p["verdict"] for p in out["parts"]] == verdicts, [(p["label"], p["value"], p.get("why")) for p in out["parts"]]
    for p in out["parts"]:          # the figure shown lies in its own interval
        assert p["low"] is None or p["low"] - 1e-9 <= p["value"] <= p["high"] + 1e-9, p


def test_a_store_whose_runs_mix_cpu_and_gpu_nodes_is_judged_on_neither(tmp_path):
    """A GPU claim (c's figure on the real runs of mxnet-speed, with only its device condition kept)
    is judged on GPU runs, out of scope on CPU runs, and out of scope on a store holding both (its
    first row no longer decides)."""
    claim = catalog.Claim("c", "mxnet", "c on real runs", [catalog.Part(
        "2-bit speedup over none, FC-heavy model, high bandwidth", "mxnet-speed", catalog._speed(X.TWOBIT, "fc", "high"),
        at_most(1.2))], Conditions(device="gpu"))
    name = EXPERIMENTS["mxnet-speed"].sweep_name(True)
    for where, devices in (("gpu", ("cuda", "cuda")), ("cpu", ("cpu", "cpu")), ("mixed", ("cuda", "cpu"))):
        for method, device in zip(("none", "twobit:threshold=0.5"), devices):
            cell(str(tmp_path / where), name, params_of("mxnet-speed", workload="{fc}", bw="{high}", compressor=method),
                 [0.1] * 12, device=device)
    assert judge.judge(claim, True, str(tmp_path / "gpu"))["verdict"] == AGREE
    assert judge.judge(claim, True, str(tmp_path / "cpu"))["verdict"] == OUT_OF_SCOPE
    mixed = judge.judge(claim, True, str(tmp_path / "mixed"))
    assert mixed["verdict"] == OUT_OF_SCOPE and "mix CPU and GPU nodes" in mixed["parts"][0]["why"]
    # 'claims run --device cuda' names the device it runs on; the runs already stored still decide
    assert judge.judge(claim, True, str(tmp_path / "mixed"), device="cuda")["verdict"] == OUT_OF_SCOPE
    assert judge.judge(claim, True, str(tmp_path / "cpu"), device="cuda")["verdict"] == OUT_OF_SCOPE
    # GPU runs the experiment no longer gives its settings are not read, but were still made on GPUs: the
    # part has no figure, not "out of scope on CPUs" (planted: the device taken from the cells read alone)
    for method in ("none", "twobit:threshold=0.5"):
        cell(str(tmp_path / "stale"), name, params_of("mxnet-speed", workload="{fc}", bw="{high}", compressor=method),
             [0.1] * 12, device="cuda", steps=5)
    stale = judge.judge(claim, True, str(tmp_path / "stale"))
    assert stale["verdict"] == INCONCLUSIVE and "finished cells not read" in stale["parts"][0]["why"], stale["parts"][0]


def test_lambda_is_fitted_per_repeat_with_a_t_interval_and_one_repeat_gives_none(tmp_path, monkeypatch):
    """Golden case by hand: three repeats made with λ = 1.1, 1.2, 1.3 fit those λ; their mean is 1.2
    and Student's t (2 degrees of freedom, 4.303) gives 1.2 ± 4.303 × 0.1 / √3 = [0.952, 1.448].
    A single repeat has no interval, so 'between 1 and 1.15' cannot judge it. Planted: λ fitted on
    the pooled cells with no interval -> the bounds differ."""
    import synthetic
    from gctestbed.claims import figures
    for seed, lam in ((1, 1.1), (2, 1.2), (3, 1.3)):
        monkeypatch.setattr(synthetic, "LAMBDA", lam)
        synthetic.fill(str(tmp_path), sweep=f"s{seed}", methods=("none",), seed=seed)
    rows = cells.load(str(tmp_path))
    m = figures.model_lambda(rows)
    assert m.detail["per_seed"] == pytest.approx({1: 1.1, 2: 1.2, 3: 1.3}, abs=0.011)
    assert (m.value, m.low, m.high) == pytest.approx((1.2, 0.952, 1.448), abs=0.02)
    one = figures.model_lambda([r for r in rows if r.seed == 2])
    assert one.value == pytest.approx(1.2, abs=0.011) and one.low == -float("inf")
    assert between(1.0, 1.15).judge(one) == INCONCLUSIVE
    # written out, an interval with no end is null: strict JSON (JavaScript's parser, jq), not Infinity
    from gctestbed.claims import page

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    assert json.loads(page.to_json({"low": one.low, "high": one.high}), parse_constant=refuse) == {"low": None, "high": None}


def test_a_repeat_whose_lambda_is_not_identified_gives_no_lambda(tmp_path):
    """A repeat measured only where communication hides none's compute (10 Mbit/s) fits every λ
    as well: the tie-break's 1.0 is not a measurement, so it is left out of the mean and named;
    with no other repeat there is no figure, and the reason names the seed and its range; with one
    identified repeat, its own λ and no interval. Planted: the tie-break's λ kept -> per_seed holds seed 3 and the
    first assertion fails."""
    import synthetic
    from gctestbed.claims import figures
    for seed, bws in ((1, synthetic.BWS), (2, synthetic.BWS), (3, (10e6,))):
        synthetic.fill(str(tmp_path), sweep=f"s{seed}", methods=("none",), seed=seed, bws=bws)
    rows = cells.load(str(tmp_path))
    m = figures.model_lambda(rows)
    assert set(m.detail["per_seed"]) == {1, 2} and set(m.detail["unidentified_seeds"]) == {3}
    assert m.value == pytest.approx(synthetic.LAMBDA, abs=0.011)
    alone = figures.model_lambda([r for r in rows if r.seed == 3])
    assert alone.value is None and "not identified on any repeat: seed 3: every λ the fit tries fits none's overlap cells as well" in alone.why
    one = figures.model_lambda([r for r in rows if r.seed in (1, 3)])
    assert set(one.detail["per_seed"]) == {1} and set(one.detail["unidentified_seeds"]) == {3}
    assert one.value == one.detail["per_seed"][1] and one.low == -float("inf")


def test_the_controls_line_says_what_each_control_lost_and_why_one_was_not_judged():
    """The sentence above the verdicts: a control that loses visibly, one that does not (with the
    judge's note on stale cells, which only claims.json carried before), and one not measured."""
    from gctestbed.claims import page
    line = page.control_lines({"controls": [
        {"experiment": "a", "control": "c", "value": -3.0, "low": -4.0, "high": -2.0, "n": 5, "loses": True, "why": ""},
        {"experiment": "b", "control": "c", "value": -0.5, "low": -1.5, "high": 0.5, "n": 5, "loses": False,
         "why": "x has 1 finished cell not read"},
        {"experiment": "d", "control": "c", "value": None, "low": None, "high": None, "n": None, "loses": False,
         "why": "no finished run of c"}]})
    assert "a: c lost 3.00 points [2.00, 4.00] over 5 runs each (more than 1 point, its whole interval clear)" in line
    assert "b: c lost 0.50 points [-0.50, 1.50] over 5 runs each (not clearly more than 1 point: its accuracy parts " \
           "are inconclusive; x has 1 finished cell not read)" in line
    assert "d: its control (c) was not measured: no finished run of c" in line


def test_judging_every_claim_reads_each_experiment_once_and_judges_as_one_by_one(tmp_path, monkeypatch):
    """Several claims read one experiment (here two versions of d and the controls line all read the
    MLP's): a report reads each sweep's cells once, and its verdicts are those of judging each claim
    alone (planted: no sharing -> the MLP's cells read three times)."""
    judge_d(tmp_path, 0.90, 0.85, 1_000_000)
    alone = [judge.judge(c, True, str(tmp_path)) for c in (catalog.BY_ID["d"], anywhere("d"))]
    read = []
    real = judge._rows
    monkeypatch.setattr(judge, "_rows", lambda *a, **k: read.append(a[1].name) or real(*a, **k))
    together, controls = judge.judge_all([catalog.BY_ID["d"], anywhere("d")], True, str(tmp_path))
    assert read == ["accuracy-mlp"], read
    strip = [{k: v for k, v in r.items() if k != "judged_at"} for r in alone]
    assert [{k: v for k, v in r.items() if k != "judged_at"} for r in together] == strip
    assert controls == judge.controls([catalog.BY_ID["d"]], True, str(tmp_path))


def test_the_run_time_line_counts_each_sweep_once_however_many_claims_read_it():
    """By hand: sweep a read by two claims (2 cells, 120 s), sweep b by one (1 cell, 30 s), sweep c
    read with no cell: a 2.0 min, b 0.5 min, in all 2.5 min, c not named. Planted: summing each
    claim's figures (a counted twice) -> 4.5 min in all."""
    from gctestbed.claims import page
    report = {"claims": [{"cells": {"a": 2}, "run_s": {"a": 120.0}},
                         {"cells": {"a": 2, "b": 1, "c": 0}, "run_s": {"a": 120.0, "b": 30.0, "c": 0.0}}]}
    line = page.run_time_line(report)
    assert "a: 2 cells, 2.0 min; b: 1 cell, 0.5 min; in all 2.5 min." in line and "c:" not in line, line
    assert page.run_time_line({"claims": [{"cells": {}, "run_s": {}}]}) == ""


def test_a_composite_figure_counts_the_runs_of_its_thinner_side():
    """A gain (one difference against none minus another) or a ratio of two ratios shows n: the fewer
    runs of its two figures (by hand: 5 and 3 -> 3), none where either side does not say (planted: no n,
    the page's n column left blank for f's gains, j's ratio, t's growth and w)."""
    from gctestbed.claims import figures
    five, three = Measure(2.0, 1.0, 3.0, detail={"n": 5}), Measure(0.5, 0.25, 1.0, detail={"n": 3})
    d, r = figures.difference(five, three), figures.ratio_of(five, three)
    assert (d.value, d.low, d.high, d.detail["n"]) == (1.5, 0.0, 2.75, 3)
    assert (r.value, r.low, r.high, r.detail["n"]) == (4.0, 1.0, 12.0, 3)
    assert "n" not in figures.difference(five, Measure(0.5, 0.25, 1.0)).detail


@pytest.mark.parametrize("lam_range, elsewhere, words", [
    ((1.0, 1.0), True, "seed 7: λ 1.000 fits none's overlap cells best; other λ apart from these fit as well"),
    ((0.25, 0.255), False, "seed 7: best at the edge of the λ the fit tries (0.250), so the best may lie beyond"),
    ((3.995, 4.0), False, "seed 7: best at the edge of the λ the fit tries (4.000), so the best may lie beyond"),
    ((0.25, 2.0), False, "seed 7: every λ up to 2.000 fits none's overlap cells as well"),
    ((0.5, 2.0), False, "seed 7: every λ from 0.500 to 2.000 fits none's overlap cells as well")])
def test_the_claim_on_lambda_says_why_by_the_models_own_rule(monkeypatch, lam_range, elsewhere, words):
    """The claim names each case the report's label does (model.why_unidentified: two grid steps at
    the edge are one λ there; a single λ with ties apart is not the edge). Planted: 'hi > lo' for
    one_lambda's rule -> the second case reads as a range."""
    from gctestbed.analysis import model
    from gctestbed.claims import figures
    monkeypatch.setattr(model, "fit", lambda rows, variant="tail", **k: model.Fit(
        "tail", lam_range[0], 0.0, 1.0, lam_range=lam_range, lam_ties_elsewhere=elsewhere))
    row = types.SimpleNamespace(seed=7)
    assert figures.model_lambda([row]).why == "λ is not identified on any repeat: " + words
