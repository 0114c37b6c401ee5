"""Every method against its definition: formats, wire sizes, error feedback, unbiasedness, ranks."""

from __future__ import annotations

import math

import pytest
import torch

from gctestbed import compress
from gctestbed.compress import bitpack
from gctestbed.compress.base import Bucket
from gctestbed.compress.dgc import sampled_threshold_select
from gctestbed.spec import SpecError

from simulate import exchange, make

ALL = compress.names()


def test_every_method_of_the_issue_is_registered():
    assert set(ALL) == {"none", "fp16", "bf16", "powersgd", "topk", "randomk", "threshold", "twobit", "onebit", "dgc",
                        "variance", "hybrid", "qsgd", "terngrad", "signsgd", "efsignsgd", "signum"}


@pytest.mark.parametrize("bits", bitpack.WIDTHS)
@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 33, 1000])
def test_bitpack_round_trips(bits, n):
    codes = torch.randint(0, 2 ** bits, (n,))
    packed = bitpack.pack(codes, bits)
    assert packed.dtype == torch.int32 and packed.numel() == bitpack.words(n, bits)
    assert torch.equal(bitpack.unpack(packed, bits, n), codes)


def test_two_bit_golden_vector():
    # MXNet's layout: 4 codes per byte, the first in its top two bits, bytes in memory order
    # (tests/test_mxnet_format.py checks it against MXNet's rules at many sizes)
    g = torch.tensor([0.6, -0.7, 0.1, 0.5, -0.5, 0.0] + [0.0] * 10 + [0.9], dtype=torch.float32)
    (c,) = make("twobit", "threshold=0.5")
    bucket = Bucket(0, [g.shape])
    payload = c.encode(g, bucket)
    words = payload.gather[0]
    assert words.dtype == torch.int32 and words.numpy().tobytes() == bytes.fromhex("e3800000" "c0000000")
    decoded = c.decode_local(payload, bucket, g.numel())
    assert decoded.tolist()[:6] == [0.5, -0.5, 0.0, 0.5, -0.5, 0.0] and decoded[16] == 0.5
    assert torch.allclose(c.residuals.of((0, 0)), g - decoded)


def _payload_bytes(name, text, n, shapes=None, step=0):
    (c,) = make(name, text)
    g = torch.randn(n) * 0.01
    _, sent = exchange([c], [g], shapes, step=step)
    return sent[0]


@pytest.mark.parametrize("name, text, n, expected", [
    ("none", "", 1000, 4000),
    ("fp16", "", 1000, 2000),
    ("bf16", "", 1000, 2000),
    ("topk", "ratio=0.01", 1000, 10 * (4 + 4)),
    ("randomk", "ratio=0.01", 1000, 10 * 4),                  # indices come from the shared seed
    ("twobit", "", 1000, math.ceil(1000 / 16) * 4),
    ("onebit", "", 1000, math.ceil(1000 / 32) * 4),
    ("signsgd", "", 1000, math.ceil(1000 / 32) * 4),
    ("signum", "", 1000, math.ceil(1000 / 32) * 4),
    ("efsignsgd", "", 1000, math.ceil(1000 / 32) * 4 + 4),
    ("qsgd", "levels=7,bucket_size=512", 1000, math.ceil(1000 / 8) * 4 + 2 * 4),
    ("qsgd", "levels=1,bucket_size=100", 1000, math.ceil(1000 / 16) * 4 + 10 * 4),
    ("terngrad", "", 1000, 4 + math.ceil(1000 / 16) * 4),   # the shared scale, then 2-bit codes
])
def test_wire_size_formula(name, text, n, expected):
    assert _payload_bytes(name, text, n) == expected


def test_threshold_sends_one_word_per_element_above_tau():
    (c,) = make("threshold", "tau=0.5")
    g = torch.tensor([0.6, -0.7, 0.1, 0.49, -0.5, 3.0])
    bucket = Bucket(0, [g.shape])
    payload = c.encode(g, bucket)
    assert payload.nbytes == 4 * 4
    assert c.decode_local(payload, bucket, 6).tolist() == [0.5, -0.5, 0.0, 0.0, -0.5, 0.5]


def test_powersgd_sizes_and_plain_start():
    shapes = [torch.Size([64, 32]), torch.Size([32]), torch.Size([4, 4])]   # 4x4 is not worth compressing
    n = sum(s.numel() for s in shapes)
    assert _payload_bytes("powersgd", "rank=2,start_iter=1", n, shapes, step=0) == n * 4
    p_round = (64 * 2 + 32 + 16) * 4
    q_round = 32 * 2 * 4
    assert _payload_bytes("powersgd", "rank=2,start_iter=1", n, shapes, step=1) == p_round + q_round


def test_dgc_sizes_dense_small_tensors_and_warmup():
    shapes = [torch.Size([200, 100]), torch.Size([100])]
    (c,) = make("dgc", "ratio=0.001,warmup_epochs=4,steps_per_epoch=1,min_numel=1024")
    assert [c.density(s) for s in range(6)] == [0.25, 0.0625, 0.015625, 0.25 ** 4, 0.001, 0.001]
    n = 20100
    g = torch.randn(n)
    _, sent = exchange([c], [g], shapes, step=5)
    k = sent[0] - 100 * 4                              # the 1-D tensor goes dense
    assert 0.8 * 20 * 8 <= k <= 1.3 * 20 * 8


def test_dgc_run_length_packing_is_the_papers_six_bytes_an_element_worked_by_hand():
    """§3.1 of the DGC paper: each value with the 16-bit count of zeros before it. By hand:
    positions 0, 3, 70000 are runs 0, 2, then 69,996 zeros, more than 65,535, so an entry of value
    0 at 65,539 (run 65,535) and 70000 after 4,460 more. Planted: runs counted from the previous
    position (off by one) -> the positions decode one further each."""
    from gctestbed.compress.dgc import from_runs, to_runs
    runs, values = to_runs(torch.tensor([0, 3, 70000], dtype=torch.int32), torch.tensor([1.0, 2.0, 3.0]))
    assert runs.dtype == torch.int16 and (runs.to(torch.int64) & 0xFFFF).tolist() == [0, 2, 65535, 4460]
    assert values.tolist() == [1.0, 2.0, 0.0, 3.0]
    assert from_runs(runs).tolist() == [0, 3, 65539, 70000]
    # the edges, by hand: a gap of exactly 65,535 needs no cut, 65,536 one (an entry of value 0 right
    # before); a first position past 65,535 is cut too; fp16 values stay fp16; nothing selected is empty
    for positions, runs_by_hand in (([65535], [65535]), ([65536], [65535, 0]), ([0, 65536], [0, 65535]),
                                    ([1, 131074], [1, 65535, 65535, 0]), ([], [])):
        idx = torch.tensor(positions, dtype=torch.int32)
        runs, values = to_runs(idx, torch.ones(len(positions), dtype=torch.float16))
        assert (runs.to(torch.int64) & 0xFFFF).tolist() == runs_by_hand and values.dtype == torch.float16
        decoded = from_runs(runs)
        assert decoded[values != 0].tolist() == positions and (values == 0).sum() == len(runs_by_hand) - len(positions)
    # a whole exchange: the same selection as the int32-index packing, 6 bytes an entry instead of 8
    shapes = [torch.Size([200, 100]), torch.Size([100])]
    g = [torch.randn(20100, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    out = {}
    for packing in ("index", "runlength"):
        comps = make("dgc", f"ratio=0.01,warmup_epochs=0,packing={packing}", world=2)
        out[packing] = exchange(comps, [x.clone() for x in g], shapes, step=3)
    (idx_sums, idx_bytes), (run_sums, run_bytes) = out["index"], out["runlength"]
    assert all(torch.equal(a, b) for a, b in zip(idx_sums, run_sums))
    assert [(b - 400) * 6 for b in idx_bytes] == [(b - 400) * 8 for b in run_bytes]       # 400: the dense bias
    with pytest.raises(ValueError, match="packing must be one of"):
        make("dgc", "packing=rle")


def test_dgc_clips_each_parameters_local_gradient_to_its_share_of_the_threshold():
    """Golden case by hand (DGC, local gradient clipping; the authors' code clips each named
    gradient): 2 nodes, clip_norm 1, so each parameter's local gradient is held to 1/sqrt(2).
    Parameter a's local gradient (3, 4) has norm 5: scaled to (3, 4) * 0.70711 / 5 = (0.42426,
    0.56569). Parameter b's (0.3, 0.4) has norm 0.5, under the limit: unchanged. The hook's
    gradient is the local one over the world size. (Clipping the bucket as a whole, norm 5.0249,
    would shrink b too.)"""
    (dgc,) = make("dgc", "ratio=1,warmup_epochs=0,clip_norm=1,momentum_correction=false,accumulate=false")
    bucket = Bucket(0, [torch.Size([2]), torch.Size([2])], world=2)
    local = torch.tensor([3.0, 4.0, 0.3, 0.4])
    expected = torch.tensor([0.42426, 0.56569, 0.3, 0.4]) / 2
    assert torch.allclose(dgc.clip(local / 2, bucket), expected, atol=1e-5)
    sent = dgc.encode(local / 2, bucket)           # 1-D tensors go dense: what is sent is the clipped gradient
    assert torch.allclose(sent.reduce[0], expected, atol=1e-5)
    (off,) = make("dgc", "ratio=1,warmup_epochs=0,clip_norm=0,momentum_correction=false,accumulate=false")
    assert torch.equal(off.encode(local / 2, bucket).reduce[0], local / 2)


def test_dgc_selection_is_close_to_top_k_and_masks_momentum():
    v = torch.randn(100_000)
    idx = sampled_threshold_select(v, 0.001, 0.01, torch.Generator().manual_seed(0))
    assert 80 <= idx.numel() <= 130
    exact = set(torch.topk(v.abs(), 100).indices.tolist())
    assert len(exact & set(idx.tolist())) >= 70
    (c,) = make("dgc", "warmup_epochs=0,min_numel=1")
    shapes = [torch.Size([100, 1000])]
    bucket = Bucket(0, shapes, step=0)
    payload = c.encode(v, bucket)
    sent = payload.gather[0].long()
    velocity, accumulated = c.velocity.of((0, 0)), c.accumulated.of((0, 0))
    assert torch.all(velocity[sent] == 0) and torch.all(accumulated[sent] == 0)
    # momentum correction: what was not sent accumulates velocity
    unsent = torch.ones(v.numel(), dtype=torch.bool)
    unsent[sent] = False
    assert torch.allclose(accumulated[unsent], v[unsent])


@pytest.mark.parametrize("name", ["topk", "randomk", "threshold", "twobit", "onebit", "efsignsgd"])
def test_error_feedback_invariant(name):
    """After any number of steps: everything sent + the residual == everything put in."""
    (c,) = make(name)
    bucket_shapes = [torch.Size([3000])]
    total_in, total_sent = torch.zeros(3000), torch.zeros(3000)
    for step in range(5):
        g = torch.randn(3000) * 0.01
        bucket = Bucket(0, bucket_shapes, step=step)
        payload = c.encode(g, bucket)
        total_in += g
        total_sent += c.decode_local(payload, bucket, 3000)
    assert torch.allclose(total_sent + c.residuals.of((0, 0)), total_in, atol=1e-5)


def test_powersgd_error_feedback_invariant_and_exactness_at_full_rank():
    (c,) = make("powersgd", "rank=8,start_iter=0")
    m = torch.randn(16, 8)
    out, _ = exchange([c], [m.reshape(-1)], [m.shape])
    assert torch.allclose(out[0], m.reshape(-1), atol=1e-4)          # rank 8 of a 16 x 8 matrix: exact
    (c,) = make("powersgd", "rank=1,start_iter=0")
    out, _ = exchange([c], [m.reshape(-1)], [m.shape])
    assert torch.allclose(out[0] + c.errors.of((0, 0)), m.reshape(-1), atol=1e-5)


@pytest.mark.parametrize("name, text", [("qsgd", "levels=3,bucket_size=64"), ("terngrad", "clip=0"),
                                        ("randomk", "ratio=0.1,unbiased=true")])
def test_unbiased_methods_are_unbiased(name, text):
    torch.manual_seed(0)
    g = torch.randn(256)
    trials = 3000
    mean = torch.zeros(256)
    for t in range(trials):
        (c,) = make(name, text + (("," if text else "") + f"seed={t}"))
        out, _ = exchange([c], [g])
        mean += out[0] / trials
    # each element's estimate has a standard error of about spread / sqrt(trials)
    err = (mean - g).abs().max().item()
    assert err < 6 * g.abs().max().item() * (1 if name != "randomk" else 3) / math.sqrt(trials), err


@pytest.mark.parametrize("name", ALL)
def test_every_rank_gets_the_same_result(name):
    world = 3
    torch.manual_seed(1)
    shapes = [torch.Size([64, 48]), torch.Size([48])]
    n = 64 * 48 + 48
    compressors = make(name, {"powersgd": "start_iter=0", "variance": "estimate=microbatch",
                              "hybrid": "estimate=microbatch"}.get(name, ""), world=world)
    if name in ("variance", "hybrid"):
        for c in compressors:
            c.sample_stats = _FakeStats(n)
    for step in range(3):
        grads = [torch.randn(n) * 0.01 / world for _ in range(world)]
        out, _ = exchange(compressors, grads, shapes, step=step)
        for o in out[1:]:
            assert torch.equal(o, out[0])
        assert torch.isfinite(out[0]).all()


class _FakeStats:
    """Micro-batch squares for the variance family (estimate=microbatch) without a model: a fixed small spread."""

    def __init__(self, n, squares=None):
        self.n, self.squares = n, squares

    def take(self, params):
        return torch.full((self.n,), 1e-6) if self.squares is None else self.squares.clone()


def test_majority_vote():
    cs = make("signsgd", "scale=1", world=3)
    grads = [torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.tensor([1.0, 1.0, -1.0, -1.0]), torch.tensor([-1.0, 1.0, 1.0, -1.0])]
    out, _ = exchange(cs, grads)
    assert out[0].tolist() == [1.0, 1.0, 1.0, -1.0]


def test_variance_sends_unambiguous_elements_only():
    (c,) = make("variance", "alpha=1,estimate=microbatch")
    c.sample_stats = _FakeStats(4)
    bucket = Bucket(0, [torch.Size([4])])
    # squares 1e-6 per micro-batch: elements with mean^2 well above the variance are sent
    payload = c.encode(torch.tensor([0.5, 0.0001, -0.3, 0.00001]), bucket)
    assert sorted(payload.gather[0].tolist()) == [0, 2]
    decoded = c.decode_local(payload, bucket, 4)
    assert decoded[0] == 0.5 and decoded[2] == pytest.approx(-0.25)    # 4-bit: -0.5 * 2^-1


@pytest.mark.parametrize("residual, steps_sent", [("true", [3, 5]), ("false", [])])
def test_two_bit_without_its_residual_discards_what_it_does_not_send(residual, steps_sent):
    """threshold 0.5, the same gradient 0.2 every step. With MXNet's residual it accumulates
    0.2, 0.4, 0.6: sent (+0.5) at step 3, 0.1 left; 0.3, 0.5: sent at step 5, 0 left. Without it
    nothing ever reaches the threshold, so nothing is sent: the information is discarded."""
    (c,) = make("twobit", f"threshold=0.5,residual={residual}")
    bucket = Bucket(0, [torch.Size([1])])
    sent = [step for step in range(1, 7)
            if c.decode_local(c.encode(torch.tensor([0.2]), bucket), bucket, 1).item() == 0.5]
    assert sent == steps_sent


@pytest.mark.parametrize("alpha, sent", [(1, [0, 2]), (4, [0])])
def test_variance_judges_by_the_per_sample_variance_within_the_batch(alpha, sent):
    """The paper's criterion, alpha·Var_z[g_z]/B < (g_B)², on the per-sample gradients of a
    batch, computed by hand. A linear model y = w·x at w = 0 with squared error: each sample's
    gradient is g_z = -2·y·x_z (y = 1), so with these four samples
      element  x_z over the samples    g_z                  mean g    Var_z/B (unbiased)   g²
      0        1, 1, 1, 1              -2, -2, -2, -2       -2        0                    4
      1        1, -1, 1, -0.9          -2, 2, -2, 1.8       -0.05     15.23 / 3 / 4 = 1.27  0.0025
      2        1, 1, 1, -0.5           -2, -2, -2, 1        -1.25     2.25 / 4 = 0.5625    1.5625
    alpha 1 sends 0 and 2; alpha 4 (4 x 0.5625 = 2.25 > 1.5625) sends 0 only."""
    x = torch.tensor([[1.0, 1.0, 1.0], [1.0, -1.0, 1.0], [1.0, 1.0, 1.0], [1.0, -0.9, -0.5]])
    y = torch.ones(4, 1)
    model = torch.nn.Linear(3, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    loss_fn = torch.nn.functional.mse_loss
    (c,) = make("variance", f"alpha={alpha},microbatches=2")     # the micro-batch count plays no part here
    assert c.microbatches == 1 and c.reads_batch          # one backward a step; the batch read before it
    c.attach(model)
    c.observe(model, loss_fn, x, y)
    loss_fn(model(x), y).backward()
    g = model.weight.grad.reshape(-1).clone()
    assert g.tolist() == pytest.approx([-2.0, -0.05, -1.25])
    payload = c.encode(g, Bucket(0, [model.weight.shape], params=[model.weight]))
    assert sorted(payload.gather[0].tolist()) == sent


def test_per_sample_squares_match_one_backward_per_sample_with_the_batch_statistics_held():
    """compress.samples against the slow way: each sample's loss backpropagated alone, through a
    copy of the model whose batch norms normalise with the whole batch's statistics; the model's
    own running statistics and the training's random stream are left as they were."""
    import copy

    from gctestbed.compress import samples
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(4 * 4 * 4, 3))
    x, y = torch.randn(5, 2, 6, 6), torch.tensor([0, 1, 2, 1, 0])
    loss_fn = torch.nn.functional.cross_entropy
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = torch.random.get_rng_state()
    got = samples.squares(model, loss_fn, x, y)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert model.training and model[4].training
    with torch.no_grad():
        h = model[0](x)
    mean, var = h.mean((0, 2, 3)), h.var((0, 2, 3), unbiased=False)
    slow = copy.deepcopy(model).eval()
    slow[1].running_mean.copy_(mean)
    slow[1].running_var.copy_(var)
    want = [torch.zeros_like(p) for p in slow.parameters()]
    for i in range(5):
        slow.zero_grad()
        loss_fn(slow(x[i:i + 1]), y[i:i + 1]).backward()
        for w, p in zip(want, slow.parameters()):
            w += (p.grad / 5).square()
    for (param, sq), w in zip(got.items(), want):
        assert torch.allclose(sq, w, rtol=1e-4, atol=1e-9), param.shape


def test_the_per_sample_variance_is_taken_around_the_per_sample_mean_with_batch_norm_and_dropout():
    """With batch norm (held at the batch's statistics in the per-sample pass) and dropout (off
    there), the step's gradient is not the mean of the per-sample gradients. The variance must be
    that of the per-sample gradients around their own mean, here computed the slow way: one
    backward per sample, (sum_z g_z² - B·mean²) / (B - 1) / B."""
    import copy
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(4 * 4 * 4, 3))
    x, y = torch.randn(6, 2, 6, 6), torch.tensor([0, 1, 2, 1, 0, 2])
    loss_fn = torch.nn.functional.cross_entropy
    (c,) = make("variance")
    c.attach(model)
    c.observe(model, loss_fn, x, y)
    loss_fn(model(x), y).backward()                  # the training step: batch statistics, dropout on
    weight = model[0].weight
    got = c._step_variance(weight.grad.reshape(-1).clone(), Bucket(0, [weight.shape], params=[weight]))
    with torch.no_grad():
        h = model[0](x)
    slow = copy.deepcopy(model).eval()
    slow[1].running_mean.copy_(h.mean((0, 2, 3)))
    slow[1].running_var.copy_(h.var((0, 2, 3), unbiased=False))
    per = []
    for i in range(6):
        slow.zero_grad()
        loss_fn(slow(x[i:i + 1]), y[i:i + 1]).backward()
        per.append(slow[0].weight.grad.reshape(-1).clone())
    per = torch.stack(per)
    want = (per.square().sum(0) - 6 * per.mean(0).square()) / 5 / 6
    assert not torch.allclose(per.mean(0), weight.grad.reshape(-1), rtol=1e-3)   # the two means do differ here
    assert torch.allclose(got, want, rtol=1e-3, atol=1e-10)


def test_a_per_sample_estimate_without_its_means_is_an_error_not_the_micro_batch_formula():
    """The per-sample variance is centred on the samples' own mean; a step whose means are missing
    (observe never ran, or a bucket's taken twice) must fail, not fall back to centring on the
    step's gradient, which is the micro-batch estimate's formula."""
    model = torch.nn.Linear(3, 2)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    (c,) = make("variance")
    c.attach(model)
    c.observe(model, torch.nn.functional.cross_entropy, x, y)
    c.sample_stats.means.clear()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    bucket = Bucket(0, [model.weight.shape], params=[model.weight])
    with pytest.raises(KeyError):
        c._step_variance(model.weight.grad.reshape(-1).clone(), bucket)


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=pytest.mark.compiler)], ids=["torch", "native"])
def test_hybrid_sends_what_both_criteria_pass_and_nothing_else(native):
    """The source's hybrid (Tsuzuku et al.: 1942x against variance's 913x and Strom's 230x) sends
    an element only when it is unambiguous (alpha·v < r², v the variance of the mean gradient)
    *and* |r| >= tau. By hand, one rank, m = 4 micro-batches, alpha = 1, tau = 0.1; g_j are the
    micro-batches' mean gradients, v = sum_j (g_j - g)^2 / (m - 1) / m:
      element  g_j                   r = g   v      unambiguous (v < r²)   |r| >= tau   sent
      0        0.5, 0.5, 0.5, 0.5    0.5     0      yes                    yes          yes
      1        0.05 each             0.05    0      yes                    no           no
      2        0.2 each              0.2     0      yes                    yes          yes
      3        0.8, 0.8, -0.4, -0.4  0.2     0.12   no (0.12 > 0.04)       yes          no
    Variance alone sends 0, 1, 2; Strom's threshold alone 0, 2, 3; either of them all four."""
    (c,) = make("hybrid", "alpha=1,tau=0.1,estimate=microbatch")
    if native:
        from gctestbed import kernels
        c.ops = kernels.build()
    g = torch.tensor([0.5, 0.05, 0.2, 0.2])
    per_micro = torch.tensor([[0.5, 0.05, 0.2, 0.8], [0.5, 0.05, 0.2, 0.8], [0.5, 0.05, 0.2, -0.4], [0.5, 0.05, 0.2, -0.4]])
    assert torch.allclose(per_micro.mean(0), g)
    c.sample_stats = _FakeStats(4, (per_micro / 4).square().sum(0))   # each backward's gradient is g_j / m
    payload = c.encode(g.clone(), Bucket(0, [torch.Size([4])]))
    assert sorted(payload.gather[0].tolist()) == [0, 2]
    assert c.v.bucket(Bucket(0, [torch.Size([4])]), g)[3].item() == pytest.approx(0.12 * 0.999)   # kept, decayed by zeta


def test_a_runs_seed_moves_the_methods_random_streams_and_seed_zero_leaves_them():
    """QSGD's stochastic rounding on one gradient: runs of seed 0 round as the option's seed says
    (the golden vectors elsewhere stay valid); a sweep's repeat of seed 1 rounds differently, and
    the same way each time the method is made for it (every rank and server of a run makes it
    from the same spec)."""
    from gctestbed import flags
    g = torch.linspace(-1, 1, 4096)
    bucket = Bucket(0, [g.shape])

    def codes(run_seed):
        c = compress.for_run(flags.build_spec(compressor="qsgd:levels=1", seed=str(run_seed)), kernels="torch")
        return c.decode_local(c.encode(g.clone(), bucket), bucket, g.numel())
    (plain,) = make("qsgd", "levels=1")
    assert torch.equal(codes(0), plain.decode_local(plain.encode(g.clone(), bucket), bucket, g.numel()))
    assert not torch.equal(codes(0), codes(1)) and torch.equal(codes(1), codes(1))


@pytest.mark.parametrize("text, fragment", [
    ("topk:ratio=2", "ratio must be in (0, 1]"),
    ("topk:k=3", "has no option 'k'; valid options: ratio (default 0.01)"),
    ("dgc:momentum=1.5", "momentum must be in [0, 1)"),
    ("qsgd:levels=0", "levels must be 1..127"),
    ("powersgd:rank=zero", "not a valid int"),
    ("variance:microbatches=1", "at least 2"),
    ("variance:estimate=batch", "estimate must be one of sample, microbatch"),
    ("fp16:x=1", "valid options: none"),
])
def test_bad_options_name_the_valid_ones(text, fragment):
    with pytest.raises(SpecError) as e:
        compress.resolve(text)
    assert fragment in str(e.value)


def test_compressors_command_lists_every_method_with_options_and_paper():
    import json

    from click.testing import CliRunner

    from gctestbed.cli import main
    result = CliRunner().invoke(main, ["compressors", "--json"])
    assert result.exit_code == 0
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert set(rows) == set(ALL)
    assert {o["name"] for o in rows["dgc"]["options"]} >= {"ratio", "warmup_epochs", "momentum", "clip_norm",
                                                           "min_numel", "sample_ratio", "fp16_values"}
    assert {o["name"] for o in rows["powersgd"]["options"]} >= {"rank", "start_iter", "min_compression_rate",
                                                                "orthogonalization_epsilon", "warm_start"}
    assert all(r["paper"] for n, r in rows.items() if n != "none")
    assert rows["topk"]["collective"] == "allgather" and rows["powersgd"]["collective"] == "allreduce"
