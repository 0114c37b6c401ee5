"""--optimizer: sgd, adam and adamw with their options, and the methods that apply momentum themselves."""

from __future__ import annotations

import pytest
import torch

from gctestbed import compress, flags, optimizers
from gctestbed.spec import SpecError


def test_each_optimizer_is_torchs_own_with_the_options_typed():
    p = [torch.nn.Parameter(torch.zeros(3))]
    sgd = optimizers.build(*optimizers.resolve("sgd:momentum=0.5,nesterov=true"), p, lr=0.1)
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == 0.5 and sgd.defaults["nesterov"]
    adam = optimizers.build(*optimizers.resolve("adam:beta2=0.98"), p, lr=1e-3)
    assert type(adam) is torch.optim.Adam and adam.defaults["betas"] == (0.9, 0.98)
    adamw = optimizers.build(*optimizers.resolve("adamw"), p, lr=1e-3)
    assert type(adamw) is torch.optim.AdamW and adamw.defaults["weight_decay"] == 0.01
    # a method with momentum inside gets SGD without momentum: not twice
    assert optimizers.build("sgd", {}, p, 0.1, momentum_inside=True).defaults["momentum"] == 0.0


def test_bad_optimizers_and_options_are_one_sentence():
    with pytest.raises(SpecError, match="unknown optimizer 'lamb'; available: sgd, adam, adamw"):
        optimizers.resolve("lamb")
    with pytest.raises(SpecError, match="optimizer 'adam' has no option 'momentum'"):
        optimizers.resolve("adam:momentum=0.9")
    with pytest.raises(SpecError, match="beta2 must be in"):
        optimizers.resolve("adam:beta2=1.5")


def test_methods_with_momentum_inside_refuse_adam_unless_it_is_turned_off():
    with pytest.raises(SpecError, match="dgc applies momentum itself.*momentum_correction=false"):
        flags.build_spec(compressor="dgc", optimizer="adam")
    with pytest.raises(SpecError, match="signum applies momentum itself"):
        flags.build_spec(compressor="signum", optimizer="adamw")
    spec = flags.build_spec(compressor="dgc:momentum_correction=false", optimizer="adam:beta2=0.98", eval_every="5")
    assert spec.optimizer == "adam" and spec.optimizer_options["beta2"] == 0.98 and spec.eval_every == 5
    assert flags.build_spec().optimizer == "sgd"         # the default, momentum 0.9 as before


def test_warm_up_starts_at_lr_over_n_and_rises_linearly_to_lr():
    """Golden case by hand (Goyal et al.'s gradual warm-up, as DGC's training applies it: the
    share at fractional epoch e < W is (e (N - 1) / W + 1) / N): 2 nodes, 4 warm-up steps, lr 0.4
    -> 0.2, 0.25, 0.3, 0.35, then 0.4 from step 4 on."""
    assert [optimizers.warmup_factor(s, 4, 2) for s in range(6)] == [0.5, 0.625, 0.75, 0.875, 1.0, 1.0]
    p = [torch.nn.Parameter(torch.zeros(3))]
    name, options = optimizers.resolve("sgd:warmup_steps=4")
    sgd = optimizers.build(name, options, p, lr=0.4)
    schedule = optimizers.warmup(sgd, options, nodes=2)
    used = []
    for _ in range(6):
        used.append(sgd.param_groups[0]["lr"])
        sgd.step()
        schedule.step()
    assert used == pytest.approx([0.2, 0.25, 0.3, 0.35, 0.4, 0.4])
    assert optimizers.warmup(sgd, optimizers.resolve("adam")[1], nodes=2) is None      # off by default
    with pytest.raises(SpecError, match="warmup_steps must be 0 or more"):
        optimizers.resolve("adam:warmup_steps=-1")


def test_clipping_holds_the_averaged_gradients_global_norm_unless_the_method_clips_locally():
    """By hand: gradients (3) and (4) have a global L2 norm of 5; held to 1 they are 0.6 and 0.8.
    A method that clips each node's gradient itself (DGC) replaces this clipping: left as is."""
    def grads(clip_text, clips_locally=False):
        params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
        params[0].grad, params[1].grad = torch.tensor([3.0]), torch.tensor([4.0])
        optimizers.clip(params, optimizers.resolve(clip_text)[1], clips_locally)
        return [float(p.grad) for p in params]

    assert grads("sgd:clip_norm=1") == pytest.approx([0.6, 0.8])
    assert grads("adam:clip_norm=10") == pytest.approx([3.0, 4.0])          # under the limit
    assert grads("sgd") == [3.0, 4.0]                                        # off by default
    assert grads("sgd:clip_norm=1", clips_locally=True) == [3.0, 4.0]
    assert compress.create("dgc", compress.resolve("dgc:clip_norm=0.25")[1]).clips_locally
    assert not compress.create("dgc", compress.resolve("dgc")[1]).clips_locally


def test_clipping_a_velocity_is_refused_and_local_clipping_is_not():
    """A method with momentum inside hands the optimizer a velocity: clip_norm would clip the update."""
    with pytest.raises(SpecError, match="dgc applies momentum itself.*dgc:clip_norm"):
        flags.build_spec(compressor="dgc", optimizer="sgd:clip_norm=0.25")
    with pytest.raises(SpecError, match="signum applies momentum itself"):
        flags.build_spec(compressor="signum", optimizer="sgd:clip_norm=0.25")
    assert flags.build_spec(compressor="dgc:clip_norm=0.25", optimizer="sgd:clip_norm=0.25").optimizer_options["clip_norm"] == 0.25
    assert flags.build_spec(compressor="topk", optimizer="sgd:clip_norm=0.25").optimizer == "sgd"
