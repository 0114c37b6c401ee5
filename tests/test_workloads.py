"""Built-in workloads, users' own (pkg.module:function), and users' own DDP scripts (-- CMD)."""

from __future__ import annotations

import dataclasses
import sqlite3
import textwrap

import pytest
import torch

from gctestbed import results, trace as tracing, workloads
from gctestbed.workloads import text
from helpers import SMALL, gctestbed, kept_runs, leftovers, show

TINY = {"mlp": {"width": 64, "depth": 2, "input_dim": 32}, "cnn": {"width": 8}, "lstm": {"hidden": 32, "layers": 1, "seq_len": 16, "corpus_mb": 0.2},
        "transformer": {"d_model": 32, "layers": 1, "heads": 2, "seq_len": 16, "corpus_mb": 0.2}}

USER_MODULE = textwrap.dedent('''
    import torch
    from torch import nn

    def make(rank, world, batch_size, seed):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
        g = torch.Generator().manual_seed(1000 + rank)
        def batches():
            while True:
                x = torch.randn(batch_size, 20, generator=g)
                yield x, (x[:, 0] > 0).long()
        return model, batches(), nn.functional.cross_entropy
''')


@pytest.mark.parametrize("name", sorted(TINY))
def test_builtin_workloads_learn_and_start_identical(name):
    opts = dataclasses.asdict(workloads.options_class(name)(**TINY[name]))
    a = workloads.build(name, opts, seed=3, rank=0, batch_size=8)
    b = workloads.build(name, opts, seed=3, rank=1, batch_size=8)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)                              # replicas start identical
    xa, _ = next(a.batches)
    xb, _ = next(b.batches)
    assert not torch.equal(xa, xb)                              # each rank its own data
    opt = torch.optim.SGD(a.model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(25):
        x, y = next(a.batches)
        loss = a.loss_fn(a.model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) < sum(losses[:5])
    metrics = a.evaluate(a.model)
    assert 0 <= metrics["accuracy"] <= 1 and metrics["loss"] > 0


def test_language_models_read_the_standard_library():
    data = bytes(text.corpus(200_000).tolist())
    assert len(data) == 200_000 and b"def " in data and b"import " in data


def test_out_of_range_options_are_refused():
    with pytest.raises(ValueError, match="heads must divide"):
        workloads.options_class("transformer")(d_model=30, heads=4)


def test_user_workload_contract(tmp_path, monkeypatch):
    (tmp_path / "mywork.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert workloads.is_user_code("mywork:make") and not workloads.is_user_code("mlp:width=3")
    w = workloads.build("mywork:make", {}, seed=0, rank=1, batch_size=4, world=2)
    x, y = next(w.batches)
    assert x.shape == (4, 20) and w.evaluate(w.model) == {"loss": None, "accuracy": None}
    with pytest.raises(ValueError, match="has no function nope"):
        workloads.user_function("mywork:nope")


def test_cli_names_a_missing_user_module_in_one_sentence(tmp_path):
    proc = gctestbed("run", "--workload", "no_such_module:make", "--results", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "cannot import no_such_module" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.root
@pytest.mark.slow
def test_user_workload_trains_on_real_nodes(tmp_path, state_dir):
    (tmp_path / "mywork.py").write_text(USER_MODULE)
    proc = gctestbed("run", "--nodes", "2", "--bw", "1gbit", "--workload", "mywork:make", "--steps", "5",
                     "--no-calibrate", "--results", str(tmp_path / "r"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    s = show(tmp_path / "r")
    assert s["status"] == "ok" and s["steps_recorded"] == 5 and s["params_identical"] is True
    assert s["workload"] == "mywork:make"


TRAIN_SCRIPT = textwrap.dedent('''
    """An ordinary DDP script: the only gctestbed line is install()."""
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import gctestbed

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.BatchNorm1d(512, affine=False), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 4)), broadcast_buffers=False)
    gctestbed.install(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(6):
        x = torch.randn(32, 256, generator=g)
        loss = torch.nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("done", dist.get_rank())
    dist.destroy_process_group()
''')


@pytest.mark.root
@pytest.mark.slow
def test_a_users_own_ddp_script_runs_unchanged_with_the_compressor(tmp_path, state_dir):
    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    proc = gctestbed("run", "--nodes", "2", "--bw", "1gbit", "--compressor", "fp16", "--steps", "6", "--no-calibrate",
                     "--results", str(tmp_path / "r"), "--", "python", "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    s = show(tmp_path / "r")
    assert s["status"] == "ok" and s["steps_recorded"] == 6 and s["workload"] == "command"
    grads = 256 * 512 + 512 + 512 * 4 + 4
    assert s["payload_bytes_per_step"] == grads * 2                 # fp16 on the wire: the hook is installed
    assert s["params_identical"] is True
    assert leftovers(s["run_id"]) == []
    # every rank's steps are recorded, not only rank 0's
    conn = sqlite3.connect(tmp_path / "r" / "gctestbed.sqlite")
    assert conn.execute("SELECT COUNT(*) FROM steps WHERE rank=1").fetchone()[0] == 6
    # each step's bytes are the kernel's counters over that step's window (worker.ByteWindow, opened at the
    # first forward): on a ring of 2 every rank sends the fp16 payload once a step, plus headers; summed
    # over steps 1-5, where a tail that drains after a step's last counter lands in the next
    for rank in (0, 1):
        (sent,) = conn.execute("SELECT SUM(tx_bytes) FROM steps WHERE rank=? AND step>=1", (rank,)).fetchone()
        assert 0.98 * 5 * grads * 2 <= sent <= 1.2 * 5 * grads * 2, (rank, sent)
    # its trace knows the script's own model: batch norm's buffers, kept local as the script asked of DDP
    trace = tracing.extract(results.connect(str(tmp_path / "r")), s["run_id"])
    assert trace["broadcast_buffers"] is False
    assert trace["buffers"] == [["1.running_mean", [512], "float32"], ["1.running_var", [512], "float32"],
                                ["1.num_batches_tracked", [], "int64"]]


def test_a_buffer_record_leaves_out_what_ddp_was_told_to_ignore(single_rank_group):
    """DDP sends no buffer named in its parameters_to_ignore, so a trace must not list it; whether
    it sends rank 0's buffers before every forward is read from the wrapped model (a real one-rank
    DDP, as torch sets its attributes)."""
    import json
    from torch.nn.parallel import DistributedDataParallel as DDP
    from gctestbed.worker import buffer_record, local_buffers

    def module():
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4, affine=False))
    told = module()
    DDP._set_params_and_buffers_to_ignore_for_model(told, ["1.running_mean"])
    record = json.loads(buffer_record(DDP(told, **local_buffers())))
    assert record == {"broadcast": False, "buffers": [["1.running_var", [4], "float32"], ["1.num_batches_tracked", [], "int64"]]}
    record = json.loads(buffer_record(DDP(module())))        # DDP's default: rank 0's buffers before every forward
    assert record["broadcast"] is True and [b[0] for b in record["buffers"]] == \
        ["1.running_mean", "1.running_var", "1.num_batches_tracked"]


def test_install_does_nothing_outside_gctestbed(monkeypatch):
    import gctestbed
    monkeypatch.delenv("GCTESTBED_SPEC", raising=False)
    assert gctestbed.install(object()) is None


def test_serial_mode_with_a_command_is_refused():
    """flags.build_spec's sentence, which the CLI prints (its exit 2 with one line is checked by
    test_cli_names_a_missing_user_module_in_one_sentence), without a CLI start's import of torch."""
    from gctestbed import flags
    from gctestbed.spec import SpecError
    with pytest.raises(SpecError, match="only overlap"):
        flags.build_spec(mode="serial", command=["python", "train.py"])


@pytest.mark.root
@pytest.mark.slow
def test_serial_mode_times_each_phase_and_trains_exactly_like_overlap(tmp_path, state_dir):
    runs = {}
    with kept_runs() as run:
        for mode in ("overlap", "serial"):
            run_id = run(nodes="2", bw="20mbit", workload=SMALL, compressor="twobit", steps="5", mode=mode,
                         results_dir=str(tmp_path))
            runs[mode] = show(tmp_path, run_id)
    conn = sqlite3.connect(tmp_path / "gctestbed.sqlite")
    losses = {m: [r[0] for r in conn.execute("SELECT loss FROM steps WHERE run_id=? AND rank=0 ORDER BY step", (s["run_id"],))]
              for m, s in runs.items()}
    assert losses["overlap"] == losses["serial"]
    s = runs["serial"]
    assert s["mode"] == "serial" and s["params_identical"] is True
    assert s["median_encode_s"] > 0 and s["median_decode_s"] > 0 and s["median_comm_s"] > 0
    # serial: on every rank the phases add up to its step (compute, encode, collectives, decode,
    # optimizer, and a little glue between them)
    ratios = sorted((r[1] + r[2] + r[3] + r[4] + r[5]) / r[0] for r in conn.execute(
        "SELECT step_s, compute_s, encode_s, comm_s, decode_s, optim_s FROM steps WHERE run_id=? AND step>0",
        (s["run_id"],)))
    assert 0.9 <= ratios[len(ratios) // 2] <= 1.0, ratios


# The sources' architectures at scale 1 have the published parameter counts (torchvision's
# model cards; GPT-2 small's 124,439,808; Zaremba et al.'s large LSTM, 66 M): the layouts DDP
# buckets and the compressors see are the real ones.
PUBLISHED = {"alexnet": 61_100_840, "vgg16": 138_357_544, "resnet18": 11_689_512, "resnet50": 25_557_032,
             "gpt2": 124_439_808}


def full_size(name: str) -> torch.nn.Module:
    from gctestbed.workloads import alexnet, resnet, transformer, vgg
    make = {"alexnet": lambda: alexnet.make_model(alexnet.AlexNetOptions()),
            "vgg16": lambda: vgg.make_model(vgg.VGG16Options()),
            "resnet18": lambda: resnet.make_model(resnet.ResNet18Options(), resnet.Basic, (2, 2, 2, 2)),
            "resnet50": lambda: resnet.make_model(resnet.ResNet50Options(), resnet.Bottleneck, (3, 4, 6, 3)),
            "gpt2": lambda: transformer.ByteGPT(transformer.GPT2Options().layout())}
    with torch.device("meta"):          # shapes only: no memory, no initialisation
        return make[name]()


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_sources_architectures_have_their_published_size(name):
    assert sum(p.numel() for p in full_size(name).parameters()) == PUBLISHED[name]


def test_zaremba_large_lstm_and_scaled_networks_keep_their_layers():
    from gctestbed.workloads import alexnet, lstm as lstm_
    with torch.device("meta"):
        lstm = lstm_.ByteLSTM(lstm_.LSTMOptions(hidden=1500, layers=2, vocab=10000))
    assert round(sum(p.numel() for p in lstm.parameters()) / 1e6) == 66
    full = alexnet.make_model(alexnet.AlexNetOptions())
    small = alexnet.make_model(alexnet.AlexNetOptions(scale=0.25, image=64, classes=10))
    assert [type(m) for m in full] == [type(m) for m in small]        # the same layers, narrower
    assert [tuple(p.shape) for p in small.parameters()][-6] == (1024, 64 * 36)


@pytest.mark.sklearn
def test_digits_are_real_images_with_a_fixed_held_out_fifth():
    from gctestbed import workloads
    w = workloads.build("resnet18", {"scale": 0.125, "image": 32, "classes": 10, "data": "digits"}, 3, 1, 16)
    x, y = next(w.batches)
    assert x.shape == (16, 3, 32, 32) and 0 <= int(y.min()) and int(y.max()) <= 9
    a = w.evaluate(w.model)
    b = workloads.build("resnet18", {"scale": 0.125, "image": 32, "classes": 10, "data": "digits"}, 7, 0, 16).evaluate
    assert a["samples"] == 360                # 1,797 digits, the last fifth of a fixed shuffle, whatever the seed
    assert b(w.model)["accuracy"] == pytest.approx(a["accuracy"])


@pytest.mark.sklearn
def test_noised_digits_add_the_stated_pixel_noise_fixed_on_the_held_out_ones():
    """pixel_noise=2: each 8x8 digit gets Gaussian noise of twice the digits' standard deviation
    before it is scaled up (at 8 pixels, where scaling is the identity, the standardised noisy
    images differ from the clean ones by noise of standard deviation 2); every training draw is
    noised afresh; the held-out digits carry one draw, fixed by the run's seed (planted: no noise,
    training draws left clean, one noise for every draw, or held-out noise from the global
    generator, each fails)."""
    from gctestbed.workloads import images
    pick = torch.arange(0, 1000)
    clean = images.digit_images(images._split()[0][pick], 8)[0]
    g = torch.Generator().manual_seed(1)
    noisy, again = (images.digit_images(images._split()[0][pick], 8, 2.0, g)[0] for _ in range(2))
    assert float((noisy - clean).std()) == pytest.approx(2.0, rel=0.02)
    assert float((again - noisy).std()) == pytest.approx(2.0 * 2 ** 0.5, rel=0.02)     # a fresh draw, not the same
    assert torch.equal(images.digit_images(images._split()[0][pick], 32)[0], images.digits(32)[0][0][:1000])   # 0: the digits as they are
    o = images.VisionOptions(image=32, classes=10, data="digits", pixel_noise=2.0)
    plain = images.VisionOptions(image=32, classes=10, data="digits")
    (x, y), (x0, y0) = next(images._batches(o, 5, 0, 64)), next(images._batches(plain, 5, 0, 64))
    assert torch.equal(y, y0) and float((x - x0).abs().mean()) > 0.5           # the same picks, noised
    torch.manual_seed(123)
    held, held_y = images.held_out(o, 5)
    torch.manual_seed(456)
    assert torch.equal(images.held_out(o, 5)[0], held)                          # fixed, whatever else ran
    clean_held, clean_y = images.held_out(plain, 5)
    assert torch.equal(held_y, clean_y) and float((held - clean_held).abs().mean()) > 0.5
    assert not torch.equal(images.held_out(o, 6)[0], held)                       # each run's seed its own draw
    # the draw the stores made before held_out stopped noising the training set to reach it (the claims'
    # full tier among them): after the training set's noise, as digits() draws both (planted: not skipped)
    assert torch.equal(held, images.digits(32, 2.0, torch.Generator().manual_seed(5 * 1_000_003 + 999_983))[1][0])
    with pytest.raises(ValueError, match="pixel_noise is for data=digits"):
        images.VisionOptions(image=32, classes=10, pixel_noise=1.0)
    from gctestbed import workloads
    with pytest.raises(ValueError, match="pixel_noise must be 0..10"):
        workloads.build("resnet18", {"scale": 0.125, "image": 32, "classes": 10, "data": "digits", "pixel_noise": 11},
                        5, 0, 16)


def test_vision_options_refuse_what_the_network_cannot_take():
    from gctestbed import flags
    from gctestbed.spec import SpecError
    with pytest.raises(SpecError, match="image must be 63..512 pixels"):
        flags.resolve_workload("alexnet:image=32")
    with pytest.raises(SpecError, match="data=digits has 10 classes"):
        flags.resolve_workload("vgg16:data=digits,classes=5")
    with pytest.raises(SpecError, match="data must be one of synthetic, digits"):
        flags.resolve_workload("resnet50:data=imagenet")
