"""--optimizer: sgd, adam and adamw with their options, and the methods that apply momentum themselves."""

from __future__ import annotations

import pytest
import torch

from gctestbed import flags, optimizers
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
