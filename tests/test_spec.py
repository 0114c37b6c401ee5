"""Units follow tc, everything else a user types is checked with a one-sentence error."""

from __future__ import annotations

import dataclasses

import pytest

from gctestbed.spec import LinkSpec, RunSpec, SpecError, parse_choice, parse_duration, parse_rate, resolve_options


@pytest.mark.parametrize("text, bps", [
    ("100mbit", 100_000_000), ("1gbit", 1_000_000_000), ("1.5gbit", 1_500_000_000), ("100Mbit", 100_000_000),
    ("64kbit", 64_000), ("1tbit", 10**12), ("1mibit", 2**20), ("500bit", 500),
    ("12.5mbps", 100_000_000),            # tc: mbps are megaBYTES per second
    ("1kbps", 8_000), ("2gbps", 16_000_000_000), (" 10mbit ", 10_000_000), ("1e2mbit", 100_000_000),
])
def test_rates_follow_tc(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("text, fragment", [
    ("0mbit", "greater than zero"), ("-5mbit", "negative"), ("100", "bare number"), ("100mb", "unit 'mb'"),
    ("fast", "not a number"), ("1e400mbit", "finite"), ("", "not a number"), ("1 0mbit", "not a number"),
    ("nanmbit", "not a number"), ("100 gigabit", "unit 'gigabit'"), ("1e300tibps", "too large"),
    ("3e19gbps", "too large"),
])
def test_bad_rates_are_one_sentence(text, fragment):
    with pytest.raises(SpecError) as e:
        parse_rate(text)
    message = str(e.value)
    assert fragment in message
    assert "mbit" in message and "\n" not in message


@pytest.mark.parametrize("text, seconds", [("5ms", 0.005), ("250us", 250e-6), ("1s", 1.0), ("0", 0.0), ("0ms", 0.0),
                                           ("1.5msec", 0.0015)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5", "-1ms", "5min", "soon", "inf"])
def test_bad_durations(text):
    with pytest.raises(SpecError):
        parse_duration(text)


def test_runspec_json_round_trip():
    spec = RunSpec(nodes=4, link=LinkSpec(bw_bps=100_000_000, latency_s=0.005), compressor="fp16",
                   workload_options={"width": 64}, steps=3, run_id="abc123")
    again = RunSpec.from_json(spec.to_json())
    assert again == spec


@pytest.mark.parametrize("change, fragment", [
    ({"nodes": 0}, "--nodes"), ({"nodes": 65}, "--nodes"), ({"steps": 0}, "--steps"), ({"batch_size": -1}, "--batch-size"),
    ({"backend": "mpi"}, "--backend"), ({"backend": "nccl"}, "needs --device cuda"), ({"lr": float("nan")}, "lr"),
])
def test_runspec_validation(change, fragment):
    spec = dataclasses.replace(RunSpec(nodes=2, link=LinkSpec(bw_bps=1)), **change)
    with pytest.raises(SpecError, match=fragment):
        spec.validate()


def test_runspec_json_garbage_is_a_spec_error():
    with pytest.raises(SpecError):
        RunSpec.from_json('{"nodes": 2}')
    with pytest.raises(SpecError):
        RunSpec.from_json("not json")


@dataclasses.dataclass
class _Opts:
    ratio: float = 0.01
    warmup: int = 4
    fp16_values: bool = False

    def __post_init__(self):
        if not 0 < self.ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio}")


def test_options_are_typed_and_defaulted():
    name, raw = parse_choice("dgc:ratio=0.001,fp16_values=yes", "compressor")
    assert name == "dgc"
    assert resolve_options("dgc", _Opts, raw) == {"ratio": 0.001, "warmup": 4, "fp16_values": True}


@pytest.mark.parametrize("text, fragment", [
    ("dgc:bogus=1", "no option 'bogus'; valid options: ratio"), ("dgc:ratio=abc", "not a valid float"),
    ("dgc:ratio=2", "ratio must be in"), ("dgc:warmup=1.5", "not a valid int"), ("dgc:ratio", "not key=value"),
    ("dgc:ratio=1,ratio=2", "given twice"), (":ratio=1", "has no name"),
])
def test_bad_options(text, fragment):
    with pytest.raises(SpecError, match=fragment):
        name, raw = parse_choice(text, "compressor")
        resolve_options(name, _Opts, raw)
