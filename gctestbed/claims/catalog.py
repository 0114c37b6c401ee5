"""The claims: each an id, its source, the sentence it makes, and the parts it is judged on.

A part names the experiment it is measured on (claims/experiments.py), the figure (claims/figures.py)
computed from that experiment's rows, and the region where the claim holds (claims/verdict.py).
Thresholds read the sentence as a practitioner would: "about 2x" holds from 1.5x, "little benefit"
means at most 1.2-1.3x, "about 1 % or less" means a loss of at most one point of accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..analysis.cells import Row
from . import experiments as E
from . import figures as F
from .verdict import Measure, Region, at_least, at_most, between



@dataclass
class Context:
    """What a figure may ask besides the rows: the experiment's roles filled in at this scale
    (``fill("{fc}")``, or a method that names one), and the baseline speedups are taken against
    (none unless --baseline says fp16 or bf16)."""

    fill: Callable[[str], str]
    baseline: str = "none"

    def role(self, name: str) -> str:
        return self.fill("{" + name + "}")


Figure = Callable[[list[Row], Context], Measure]


@dataclass
class Part:
    label: str
    experiment: str
    figure: Figure
    region: Region
    unit: str = "x"


@dataclass
class Claim:
    id: str
    source: str
    sentence: str
    parts: list[Part]

    def experiments(self) -> list[str]:
        return list(dict.fromkeys(p.experiment for p in self.parts))


SOURCES = {
    "mxnet": "MXNet documentation, Gradient Compression FAQ (2-bit compression)",
    "dgc": "Lin et al., Deep Gradient Compression, ICLR 2018 (and its talk)",
    "variance": "Tsuzuku et al., Variance-based Gradient Compression for Efficient Distributed Deep Learning, ICLR workshop 2018",
    "utility": "Agarwal et al., On the Utility of Gradient Compression in Distributed Training Systems, MLSys 2022",
    "hotnets": "Beyond Throughput and Compression Ratios, HotNets 2024",
}
SGD, ADAM = "accuracy-sgd", "accuracy-adam"
ALLREDUCE, ALLGATHER = ("fp16", E.POWERSGD), (E.TOPK, E.TWOBIT)
COMPRESSED = ("fp16", E.POWERSGD, E.TOPK, E.DGC, E.TWOBIT)


def _speed(method: str, workload: str, bw: str, **more) -> Figure:
    return lambda rows, ctx: F.speedup(rows, method, ctx.baseline, workload=ctx.role(workload), bw=ctx.role(bw), **more)


def _acc(method: str) -> Figure:
    """Held-out accuracy against none's, whatever the speed baseline."""
    return lambda rows, ctx: F.accuracy_delta(rows, ctx.fill(method), "none")


def _bytes(method: str, workload: str | None = None) -> Figure:
    return lambda rows, ctx: F.compression(rows, ctx.fill(method), "none",
                                           **({"workload": ctx.role(workload)} if workload else {}))


def _gain_step(a: Figure, b: Figure) -> Figure:
    """How many accuracy points variant ``b`` gains over variant ``a``."""
    return lambda rows, ctx: F.difference(b(rows, ctx), a(rows, ctx))


def _share_faster(bw: str) -> Figure:
    return lambda rows, ctx: F.share({m: F.speedup(rows, m, ctx.baseline, bw=ctx.role(bw), mode="overlap")
                                      for m in COMPRESSED if m != ctx.baseline},
                                      lambda s: s > 1)


def _coding_bound(rows, ctx):
    return F.share({m: F.coding_share(rows, m, bw=ctx.role("high")) for m in COMPRESSED}, lambda s: s >= 1)


def _retention(methods: tuple[str, ...]) -> Figure:
    def figure(rows, ctx):
        per = {m: F.ratio_of(F.speedup(rows, m, ctx.baseline, nodes=8), F.speedup(rows, m, ctx.baseline, nodes=2))
               for m in methods if m != ctx.baseline}
        return F.median_of(per)
    return figure


def _batch_gain(rows, ctx):
    return F.median_of({m: F.difference(F.speedup(rows, m, ctx.baseline, batch_size=int(ctx.role("large"))),
                                        F.speedup(rows, m, ctx.baseline, batch_size=int(ctx.role("small"))))
                        for m in (E.POWERSGD, E.TWOBIT)})


def _fp16_left(rows, ctx):
    """Per method, its speedup over fp16 as a share of its speedup over none (the median)."""
    return F.median_of({m: F.ratio_of(F.speedup(rows, m, "fp16", bw=ctx.role("low"), mode="overlap"),
                                      F.speedup(rows, m, "none", bw=ctx.role("low"), mode="overlap"))
                        for m in (E.POWERSGD, E.TOPK, E.DGC, E.TWOBIT)})


def _more_than(a: Figure, *others: Figure) -> Figure:
    """a's figure over the largest of the others'."""
    def figure(rows, ctx):
        best = max((o(rows, ctx) for o in others), key=lambda m: -1 if m.value is None else m.value)
        return F.ratio_of(a(rows, ctx), best)
    return figure


CLAIMS: list[Claim] = [
    Claim("a", "mxnet", "2-bit compression speeds up large fully-connected models about 2x at low bandwidth, and more "
                        "for bigger models.", [
        Part("2-bit speedup over none, FC-heavy model, low bandwidth", "mxnet-speed", _speed(E.TWOBIT, "fc", "low"),
             at_least(1.5)),
        Part("the bigger FC model's speedup minus the smaller's", "mxnet-speed",
             lambda rows, ctx: F.difference(_speed(E.TWOBIT, "fc_big", "low")(rows, ctx),
                                             _speed(E.TWOBIT, "fc", "low")(rows, ctx)), at_least(0.0))]),
    Claim("b", "mxnet", "Convolutional networks benefit little from 2-bit compression.", [
        Part("2-bit speedup over none, ResNet, low bandwidth", "mxnet-speed", _speed(E.TWOBIT, "conv", "low"), at_most(1.3))]),
    Claim("c", "mxnet", "On fast, low-latency links 2-bit compression brings little benefit.", [
        Part("2-bit speedup over none, FC-heavy model, high bandwidth", "mxnet-speed", _speed(E.TWOBIT, "fc", "high"),
             at_most(1.2))]),
    Claim("d", "mxnet", "2-bit compression loses about 1 % of accuracy or less, because small updates are delayed "
                        "(kept in the residual), not dropped.", [
        Part("held-out accuracy, 2-bit minus none (points)", SGD, _acc("twobit:threshold=0.01"), at_least(-1.0), "pt")]),
    Claim("e", "dgc", "Sending 0.1 % of the gradient keeps accuracy near the baseline with local accumulation, momentum "
                      "correction, local clipping, factor masking and warm-up.", [
        Part("held-out accuracy, full DGC at 0.1 % minus none (points)", SGD, _acc(E.DGC_FULL), at_least(-1.0), "pt")]),
    Claim("f", "dgc", "Ablation: top 0.1 % without accumulation loses accuracy; accumulation recovers most of it; "
                      "momentum correction, factor masking and warm-up each recover more.", [
        Part("top 0.1 % alone, minus none (points)", SGD, _acc(E.DGC_TOP), at_most(-1.0), "pt"),
        Part("gain from accumulation (points)", SGD, _gain_step(_acc(E.DGC_TOP), _acc(E.DGC_ACC)), at_least(0.0), "pt"),
        Part("gain from momentum correction (points)", SGD, _gain_step(_acc(E.DGC_ACC), _acc(E.DGC_MC)), at_least(0.0), "pt"),
        Part("gain from factor masking (points)", SGD, _gain_step(_acc(E.DGC_MC), _acc(E.DGC_MASK)), at_least(0.0), "pt"),
        Part("gain from warm-up (points)", SGD, _gain_step(_acc(E.DGC_MASK), _acc(E.DGC_WARM)), at_least(0.0), "pt")]),
    Claim("g", "dgc", "DGC compresses gradients 270x to 600x.", [
        Part("bytes sent, none over DGC 0.1 %, AlexNet layout (interface counters)", "dgc-bytes", _bytes(E.DGC, "fc"),
             between(270, 600)),
        Part("bytes sent, none over DGC 0.1 %, VGG-16 layout (interface counters)", "dgc-bytes", _bytes(E.DGC, "vgg"),
             between(270, 600))]),
    Claim("h", "variance", "With Adam, variance-based compression reaches hundreds-fold compression at accuracy equal "
                           "to no compression.", [
        Part("bytes sent, none over variance (interface counters)", ADAM, _bytes(E.VARIANCE), at_least(100)),
        Part("held-out accuracy, variance minus none, Adam (points)", ADAM, _acc(E.VARIANCE), at_least(-1.0), "pt")]),
    Claim("i", "variance", "Strom's fixed threshold is brittle: a small tau compresses little, a large tau collapses "
                           "accuracy under momentum SGD.", [
        Part("bytes sent, none over threshold with the small tau", SGD, _bytes(E.STROM_SMALL), at_most(10)),
        Part("held-out accuracy, threshold with the large tau minus none (points)", SGD, _acc(E.STROM_LARGE),
             at_most(-5.0), "pt")]),
    Claim("j", "variance", "The hybrid (variance and threshold together) compresses further than either alone, at a "
                           "small cost in accuracy.", [
        Part("hybrid's compression over the better of variance's and threshold's", ADAM,
             _more_than(_bytes(E.HYBRID), _bytes(E.VARIANCE), _bytes(E.STROM_SMALL)), at_least(1.0)),
        Part("held-out accuracy, hybrid minus none (points)", ADAM, _acc(E.HYBRID), at_least(-2.0), "pt")]),
    Claim("k", "variance", "QSGD at 2 to 4 bits keeps accuracy at 4x to 12x compression.", [
        Part("bytes sent, none over 4-bit QSGD", SGD, _bytes(E.QSGD_4BIT), between(4, 12)),
        Part("held-out accuracy, 4-bit QSGD minus none (points)", SGD, _acc(E.QSGD_4BIT), at_least(-1.0), "pt"),
        Part("held-out accuracy, 2-bit QSGD minus none (points)", SGD, _acc(E.QSGD_2BIT), at_least(-1.0), "pt")]),
    Claim("l", "utility", "With computation and communication overlapped, compression rarely beats plain DDP except "
                          "at low bandwidth.", [
        Part("share of methods faster than none at high bandwidth", "utility", _share_faster("high"), at_most(0.2), ""),
        Part("share of methods faster than none at low bandwidth", "utility", _share_faster("low"), at_least(0.6), "")]),
    Claim("m", "utility", "About 4x compression is enough; higher ratios buy little.", [
        Part("speedup with 64x fewer bytes over speedup with 4x", "ratios",
             lambda rows, ctx: F.ratio_of(F.speedup(rows, "topk:ratio=0.0078125", ctx.baseline),
                                          F.speedup(rows, "topk:ratio=0.125", ctx.baseline)), at_most(1.25))]),
    Claim("n", "utility", "Encode and decode time, not bytes, bounds the gain.", [
        Part("share of methods whose encode + decode time reaches their communication time (serial, high bandwidth)",
             "utility", _coding_bound, at_least(0.5), "")]),
    Claim("o", "utility", "All-reduce-compatible methods (fp16, PowerSGD) hold their gain as nodes grow; "
                          "all-gather-based ones (top-k, 2-bit) lose it (2, 4 and 8 nodes).", [
        Part("all-reduce methods: speedup at 8 nodes over speedup at 2 (median)", "scaling", _retention(ALLREDUCE),
             at_least(0.9)),
        Part("all-gather methods: speedup at 8 nodes over speedup at 2 (median)", "scaling", _retention(ALLGATHER),
             at_most(0.9))]),
    Claim("p", "utility", "The performance model predicts step time closely (lambda about 1.04 to 1.1).", [
        Part("the model's median |error| on cells it did not fit", "utility",
             lambda rows, ctx: F.model_error(rows), at_most(0.1), ""),
        Part("fitted lambda", "utility", lambda rows, ctx: F.model_lambda(rows), between(1.0, 1.15), "")]),
    Claim("q", "utility", "Larger batches make compression look better.", [
        Part("speedup at the large batch minus at the small (median of PowerSGD and 2-bit)", "batch", _batch_gain,
             at_least(0.0))]),
    Claim("r", "hotnets", "Against an fp16 baseline the gains of compression shrink or vanish.", [
        Part("speedup over fp16 as a share of speedup over none (median of PowerSGD, top-k, DGC, 2-bit; low bandwidth)",
             "utility", _fp16_left, at_most(0.8), "")]),
]
BY_ID = {c.id: c for c in CLAIMS}
