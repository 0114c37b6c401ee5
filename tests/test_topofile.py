"""Topology files load into the network they describe, and every mistake names file, line and field."""

from __future__ import annotations

import pathlib

import pytest

from gctestbed import flags, topofile
from gctestbed.spec import SpecError, TopologySpec

TOPOLOGIES = pathlib.Path(__file__).resolve().parent.parent / "gctestbed" / "topologies"


@pytest.mark.parametrize("name, nodes, switches, one_way_s, bottleneck_bps", [
    ("star4", 4, ["s0"], 0.0005, 1_000_000_000),
    ("two-racks", 8, ["rack0", "rack1"], 0.0002, 1_000_000_000),
    ("straggler", 4, ["s0"], 0.00225, 100_000_000),
    ("two-sites", 4, ["east", "west"], 0.0102, 200_000_000),
    ("asymmetric", 2, ["s0"], 0.010, 20_000_000),
])
def test_shipped_topologies(name, nodes, switches, one_way_s, bottleneck_bps):
    topo = topofile.load(str(TOPOLOGIES / f"{name}.toml"))
    path = topo.path(0, nodes - 1)
    assert len(topo.nodes) == nodes and topo.switches == switches and topo.name == name
    assert sum(d.delay_s for d in path) == pytest.approx(one_way_s)
    assert min(d.rate_bps for d in path) == bottleneck_bps


def test_asymmetric_directions():
    topo = topofile.parse({"nodes": [{"bw_up": "20mbit", "bw_down": "100mbit"}]})
    assert (topo.nodes[0].hop.ab.rate_bps, topo.nodes[0].hop.ba.rate_bps) == (20_000_000, 100_000_000)


def _load(tmp_path, text):
    f = tmp_path / "t.toml"
    f.write_text(text)
    with pytest.raises(SpecError) as e:
        topofile.load(str(f))
    return str(e.value).replace(str(f), "FILE")


@pytest.mark.parametrize("text, expected", [
    ('[defaults]\nbw = "1gbit"\n\n[[nodes]]\ncount = 2\n\n[[nodes]]\nbw = "1g"\n', "FILE, line 8, nodes[1].bw: bandwidth '1g'"),
    ('[[nodes]]\nbw = "1gbit"\nlatncy = "1ms"\n', "FILE, line 3, nodes[0].latncy: unknown field; valid fields: bw,"),
    ('[[nodes]]\nbw = "1gbit"\ncount = 0\n', "FILE, line 3, nodes[0].count: must be a whole number of at least 1"),
    ('[[nodes]]\nbw = "1gbit"\nloss = "120%"\n', "FILE, line 3, nodes[0].loss: loss '120%' must be at least 0% and below 100%"),
    ('[[nodes]]\nbw = "1gbit"\nlatency = "1ms"\njitter = "2ms"\n', "FILE, line 4, nodes[0].jitter: cannot exceed latency"),
    ('[[nodes]]\ncount = 2\n', "FILE, line 1, nodes[0].bw: no rate given here or in [defaults]"),
    ('[[nodes]]\nbw = "1gbit"\n[[trunks]]\na = "s0"\nb = "mars"\nbw = "1gbit"\n', "FILE, line 5, trunks[0].b: switch 'mars' has no nodes"),
    ('[[nodes]]\nbw = "1gbit"\n[[nodes]]\nswitch = "x"\nbw = "1gbit"\n', "switch x cannot be reached from s0; add a trunk"),
    ('[[nodes]\nbw = 1\n', "FILE: not valid TOML"),
    ('bogus = 1\n[[nodes]]\nbw = "1gbit"\n', "FILE, line 1, bogus: unknown field"),
    ('name = "x"\n', "FILE, nodes: at least one [[nodes]] table is needed"),
])
def test_mistakes_name_file_line_and_field(tmp_path, text, expected):
    message = _load(tmp_path, text)
    assert message.startswith(expected) or expected in message, message
    assert "\n" not in message


def test_missing_file():
    with pytest.raises(SpecError, match="cannot read topology file"):
        topofile.load("/nonexistent/topology.toml")


def test_cli_rejects_a_bad_topology_with_exit_2(tmp_path):
    from click.testing import CliRunner

    from gctestbed.cli import main
    f = tmp_path / "t.toml"
    f.write_text('[[nodes]]\nbw = "fast"\n')
    result = CliRunner().invoke(main, ["run", "--topology", str(f), "--results", str(tmp_path)])
    assert result.exit_code == 2 and "line 2, nodes[0].bw" in result.output and "Traceback" not in result.output


def test_shipped_topologies_by_name(tmp_path, monkeypatch):
    """``--topology NAME`` finds a shipped file from any directory; ``star`` is the flags' own star;
    a path that exists wins over a name; an unknown name lists the names."""
    monkeypatch.chdir(tmp_path)
    assert topofile.locate("two-racks") == str(TOPOLOGIES / "two-racks.toml")
    assert topofile.locate("star") is None
    spec = flags.build_spec(nodes="3", bw="100mbit", latency="5ms", compressor="none", workload="mlp", steps="2",
                            batch_size="8", lr="0.05", seed="0", bucket_cap_mb="25", timeout="300s", results_dir="r",
                            topology_file="star")
    assert spec.topology is None and spec.network() == TopologySpec.star(3, spec.link)
    (tmp_path / "straggler").write_text((TOPOLOGIES / "two-sites.toml").read_text())
    assert topofile.locate("straggler") == "straggler"
    with pytest.raises(SpecError, match="neither a file nor a shipped topology.*star, star4, straggler, two-racks"):
        topofile.locate("three-racks")
