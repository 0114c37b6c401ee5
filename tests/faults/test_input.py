"""Bad input everywhere a user types: every rejection is one SpecError sentence, never another
exception (property-based: hypothesis generates the input)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gctestbed import compress, topofile
from gctestbed.spec import RunSpec, SpecError, parse_duration, parse_percent, parse_rate

UNITS = ["", "bit", "kbit", "mbit", "gbit", "tbit", "bps", "kbps", "mbps", "gbps", "mb", "g", "ms", "us", "s", "%", "e9"]
NUMBERS = st.one_of(st.integers(-10**30, 10**30).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.text(max_size=12))
TYPED = st.one_of(st.builds(lambda n, u: f"{n}{u}", NUMBERS, st.sampled_from(UNITS)), st.text(max_size=30))


def _one_sentence(e: Exception) -> None:
    text = str(e)
    assert text and "\n" not in text and "Traceback" not in text


@settings(max_examples=400, deadline=None)
@given(TYPED)
def test_rates_parse_or_refuse_in_one_sentence(text):
    try:
        assert parse_rate(text) > 0
    except SpecError as e:
        _one_sentence(e)


@settings(max_examples=400, deadline=None)
@given(TYPED)
def test_durations_and_percentages_parse_or_refuse(text):
    for parse in (parse_duration, parse_percent):
        try:
            value = parse(text)
            assert value >= 0
        except SpecError as e:
            _one_sentence(e)


OPTION = st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["ratio", "rank", "threshold", "levels", "seed", "x", ""]),
                   st.one_of(NUMBERS, st.sampled_from(["true", "no", "1e400", "-0", ""])))


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(compress.names() + ["nope", ""]), st.lists(OPTION, max_size=3),
       st.sampled_from([":", ",", ":,", ""]))
def test_compressor_option_strings_resolve_or_refuse(name, options, sep):
    text = name + (":" + ",".join(options) if options else "") + (sep if not options else "")
    try:
        resolved, values = compress.resolve(text)
        compress.create(resolved, values)
    except SpecError as e:
        _one_sentence(e)


TOML_VALUE = st.one_of(st.integers(-5, 70).map(str), st.sampled_from(['"100mbit"', '"5ms"', '"x"', '"-1mbit"', "[]", "{}"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["nodes", "bw", "latency", "switch", "name", "loss"]), TOML_VALUE), max_size=5),
       st.booleans())
def test_topology_files_load_or_refuse(tmp_path_factory, pairs, node_table):
    body = "\n".join(f"{k} = {v}" for k, v in pairs)
    text = (f"[[node]]\n{body}\n" if node_table else body + "\n")
    path = tmp_path_factory.mktemp("topo") / "t.toml"
    path.write_text(text)
    try:
        topofile.load(str(path))
    except SpecError as e:
        _one_sentence(e)


JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10, 10**12), st.floats(), st.text(max_size=8)),
                       lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=8), c, max_size=3)),
                       max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["nodes", "link", "steps", "batch_size", "lr", "compressor", "mode", "launcher",
                                        "command", "topology", "kernels", "timeout_s"]), JSONISH, max_size=6))
def test_runspec_json_loads_or_refuses(fields):
    base = json.loads(RunSpec(nodes=2, link=__import__("gctestbed.spec", fromlist=["LinkSpec"]).LinkSpec(bw_bps=10**8)).to_json())
    base.update(fields)
    try:
        RunSpec.from_json(json.dumps(base))
    except SpecError as e:
        _one_sentence(e)


class _Accepted(Exception):
    """Raised instead of running: the command line was accepted."""


FLAG_VALUES = {
    "--nodes": st.one_of(st.integers(-3, 80).map(str), TYPED),
    "--bw": TYPED, "--bw-down": TYPED, "--latency": TYPED, "--jitter": TYPED, "--loss": TYPED,
    "--steps": st.one_of(st.integers(-2, 10**12).map(str), TYPED), "--batch-size": TYPED, "--lr": TYPED,
    "--timeout": TYPED, "--bucket-cap-mb": TYPED, "--seed": TYPED,
    "--compressor": st.one_of(st.sampled_from(compress.names()), st.builds(lambda n, o: f"{n}:{o}",
                              st.sampled_from(compress.names()), OPTION), st.text(max_size=20)),
    "--workload": st.one_of(st.sampled_from(["mlp", "cnn", "lstm", "transformer", "mlp:width=64", "os:path",
                                             "no.such.module:fn", "mlp:depth=0"]), st.text(max_size=20)),
    "--fault": st.one_of(st.builds(lambda k, n, a, f, p: f"{k}:node={n},at={a},for={f},pct={p}",
                                   st.sampled_from(["link-down", "loss", "flap", ""]), st.integers(-1, 70),
                                   TYPED, TYPED, TYPED),
                         st.builds(lambda k, n, a: f"{k}:node={n},at={a}", st.sampled_from(["link-down", "loss"]),
                                   st.integers(0, 3), TYPED), st.text(max_size=30)),
}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(sorted(FLAG_VALUES)), min_size=1, max_size=4, unique=True).flatmap(
    lambda flags: st.tuples(*[st.tuples(st.just(f), FLAG_VALUES[f]) for f in flags])))
def test_the_command_line_accepts_or_exits_2_in_one_sentence(monkeypatch_module, pairs):
    """``gctestbed run`` with what hypothesis types into its flags: the run starts, or stderr holds
    exactly one 'gctestbed: ...' line and the exit status is 2 — never a traceback."""
    from click.testing import CliRunner
    from gctestbed.cli import main
    args = ["run", "--no-calibrate"] + [x for flag, value in pairs for x in (flag, value)]
    result = CliRunner().invoke(main, args)
    if isinstance(result.exception, _Accepted):
        return
    assert result.exit_code == 2, (args, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gctestbed: "), (args, result.stderr)
    assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def monkeypatch_module():
    """The runner and the host check replaced for this module: an accepted command line raises
    _Accepted instead of building a network."""
    from gctestbed import runner

    def accepted(*args, **kwargs):
        raise _Accepted()
    mp = pytest.MonkeyPatch()
    mp.setattr(runner, "run", accepted)
    yield mp
    mp.undo()
