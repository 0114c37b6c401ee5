"""Topology TOML files (docs/topologies.md) read into a TopologySpec.

``--topology`` takes a file's path, or the name of one shipped with the package
(``gctestbed/topologies/``: ``two-racks``, ``straggler``, ...), so an installed gctestbed reaches
them from any directory. The name ``star`` is the network a run builds without ``--topology``:
``--nodes`` nodes on their own ``--bw``/``--latency`` cables to one switch.

Every value is parsed with the same unit rules as the command line, and a mistake is reported
with the file, the line and the field it sits on, so a user can go straight to it.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

from .spec import (Direction, Hop, NodeAttach, SpecError, TopologySpec, Trunk, parse_duration, parse_percent,
                   parse_rate)

CABLE_KEYS = {"bw", "bw_up", "bw_down", "latency", "jitter", "loss"}
TRUNK_KEYS = {"a", "b", "bw", "bw_ab", "bw_ba", "latency", "jitter", "loss"}
NODE_KEYS = CABLE_KEYS | {"switch", "count"}
TOP_KEYS = {"name", "description", "defaults", "nodes", "trunks"}


class _Located(Exception):
    def __init__(self, table: str, index: int | None, key: str | None, message: str):
        super().__init__(message)
        self.table, self.index, self.key, self.message = table, index, key, message


BUILT_IN_DIR = Path(__file__).resolve().parent / "topologies"
STAR = "star"           # no file: the command line's own star (TopologySpec.star)


def built_in() -> list[str]:
    """The names ``--topology`` knows: ``star`` and the topology files shipped with gctestbed."""
    return sorted([STAR] + [p.stem for p in BUILT_IN_DIR.glob("*.toml")])


def locate(name_or_path: str) -> str | None:
    """The file ``--topology`` means: an existing path as given, else a shipped topology's file;
    None for ``star``, which the flags describe."""
    if os.path.exists(name_or_path) or os.sep in name_or_path or name_or_path.endswith(".toml"):
        return name_or_path
    if name_or_path == STAR:
        return None
    if name_or_path in built_in():
        return str(BUILT_IN_DIR / f"{name_or_path}.toml")
    raise SpecError(f"--topology {name_or_path!r} is neither a file nor a shipped topology: give a TOML file's path "
                    f"or one of {', '.join(built_in())}.")


def load(path: str) -> TopologySpec:
    """Read a topology file; any mistake becomes one SpecError naming file, line and field."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise SpecError(f"cannot read topology file {path}: {e.strerror}.") from None
    text = raw.decode("utf-8", errors="replace")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: not valid TOML: {e}.") from None
    try:
        topo = parse(data, default_name=path.rsplit("/", 1)[-1].removesuffix(".toml"))
    except _Located as e:
        where = _line_of(text, e.table, e.index, e.key)
        field = ".".join(filter(None, [e.table + (f"[{e.index}]" if e.index is not None else ""), e.key]))
        raise SpecError(f"{path}, line {where}, {field}: {e.message.rstrip('.')}." if where else
                        f"{path}, {field}: {e.message.rstrip('.')}.") from None
    try:
        topo.validate()
    except SpecError as e:
        raise SpecError(f"{path}: {e}") from None
    return topo


def parse(data: dict[str, Any], default_name: str = "topology") -> TopologySpec:
    _known("", None, data, TOP_KEYS)
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise _Located("defaults", None, None, "must be a table")
    _known("defaults", None, defaults, CABLE_KEYS)
    nodes: list[NodeAttach] = []
    entries = data.get("nodes")
    if not isinstance(entries, list) or not entries:
        raise _Located("nodes", None, None, "at least one [[nodes]] table is needed")
    for i, entry in enumerate(entries):
        _known("nodes", i, entry, NODE_KEYS)
        count = entry.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise _Located("nodes", i, "count", f"must be a whole number of at least 1, got {count!r}")
        switch = entry.get("switch", "s0")
        if not isinstance(switch, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", switch):
            raise _Located("nodes", i, "switch", f"must be a name of letters, digits, '_', '.', '-', got {switch!r}")
        merged = {**defaults, **entry}
        hop = _hop("nodes", i, merged, up_key="bw_up", down_key="bw_down")
        nodes += [NodeAttach(switch, hop) for _ in range(count)]
    trunks = []
    for j, entry in enumerate(data.get("trunks", [])):
        _known("trunks", j, entry, TRUNK_KEYS)
        for end in ("a", "b"):
            if not isinstance(entry.get(end), str):
                raise _Located("trunks", j, end, "must name a switch")
        trunks.append(Trunk(entry["a"], entry["b"], _hop("trunks", j, entry, up_key="bw_ab", down_key="bw_ba")))
    switches = {n.switch for n in nodes}
    for j, t in enumerate(trunks):
        for end, name in (("a", t.a), ("b", t.b)):
            if name not in switches:
                raise _Located("trunks", j, end, f"switch '{name}' has no nodes; known switches: {', '.join(sorted(switches))}")
    return TopologySpec(name=str(data.get("name", default_name)), nodes=nodes, trunks=trunks)


def _hop(table: str, index: int, entry: dict, up_key: str, down_key: str) -> Hop:
    def value(key: str, parser, default):
        if key not in entry:
            return default
        try:
            return parser(str(entry[key]))
        except SpecError as e:
            raise _Located(table, index, key, str(e)) from None
    bw = value("bw", parse_rate, None)
    up, down = value(up_key, parse_rate, bw), value(down_key, parse_rate, bw)
    if up is None or down is None:
        raise _Located(table, index, "bw", "no rate given here or in [defaults]")
    latency = value("latency", parse_duration, 0.0)
    jitter = value("jitter", parse_duration, 0.0)
    loss = value("loss", parse_percent, 0.0)
    if jitter > latency:
        raise _Located(table, index, "jitter", "cannot exceed latency")
    return Hop(ab=Direction(up, latency, jitter, loss), ba=Direction(down, latency, jitter, loss))


def _known(table: str, index: int | None, entry: Any, keys: set[str]) -> None:
    if not isinstance(entry, dict):
        raise _Located(table, index, None, "must be a table")
    for key in entry:
        if key not in keys:
            raise _Located(table, index, key, f"unknown field; valid fields: {', '.join(sorted(keys))}")


def _line_of(text: str, table: str, index: int | None, key: str | None) -> int | None:
    """The line of ``key`` inside the ``index``-th ``[[table]]`` (or ``[table]``, or top level)."""
    current, seen = "", {}
    header = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.-]+)\s*\]\]?")
    fallback = None
    for number, line in enumerate(text.splitlines(), start=1):
        m = header.match(line)
        if m:
            current = m.group(1)
            seen[current] = seen.get(current, -1) + 1
            if current == table and (index is None or seen[current] == index) and fallback is None:
                fallback = number
            continue
        if current != table or (index is not None and seen.get(current) != index):
            continue
        if key and re.match(rf"^\s*{re.escape(key)}\s*=", line):
            return number
    return fallback
