"""The trace file's format: a versioned JSON object (gzip-compressed when its name ends in .gz).

What it holds is gctestbed.trace's (extracted from a run) and docs/replay.md's to describe; this
module only writes and reads it, so the replay workload can read a trace without the store.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
from typing import Any, Iterable

from .spec import UserError

SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "traces")
FORMAT = "gctestbed-trace"
VERSION = 2            # 2: layouts per rank (1 held rank 0's alone)


def buffer_layout(named_buffers: Iterable[tuple[str, Any]], leave_out: Iterable[str] = ()) -> list[list]:
    """``[name, shape, dtype]`` of each buffer, as a trace holds them (its ``buffers``), from a
    module's ``named_buffers()`` less the names in ``leave_out`` (those DDP was told to ignore, and
    so never sends): one list for what a worker records and what a trace is rebuilt from."""
    skip = set(leave_out)
    return [[name, list(b.shape), str(b.dtype).removeprefix("torch.")] for name, b in named_buffers if name not in skip]


def path_of(text: str) -> str:
    """A replay's ``trace=`` as an absolute path: ``@NAME`` is NAME under the traces shipped with
    gctestbed (``gctestbed/traces``: the GPU traces, which a claim's replayed experiment names the
    same way wherever gctestbed is installed), anything else a path as typed."""
    return os.path.join(SHIPPED, text[1:]) if text.startswith("@") else os.path.abspath(text)


def stamp(path: str) -> tuple | None:
    """What tells a trace file or a directory of traces as it stands from an earlier or later state
    of it: each file's name, inode, size and times (None: nothing there)."""
    def one(p: str):
        try:
            st = os.stat(p)
        except OSError:
            return None
        return (os.path.basename(p), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) if stat.S_ISREG(st.st_mode) else None
    if not os.path.isdir(path):
        return one(path)
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return None
    return tuple(x for f in names if f.endswith((".json", ".json.gz")) for x in [one(os.path.join(path, f))] if x is not None)


def in_dir(path: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    """(file, trace) for each trace directly in directory ``path``, by name (a file that is not a
    trace of this version, or is gone, is passed over): a directory of traces stands for one job's,
    one per method. Read again whenever a file's name, size or times change; the traces are
    shared, for reading."""
    now, key = stamp(path), os.path.abspath(path)
    if not os.path.isdir(path) or now is None:
        raise UserError(f"{path} is not a directory of traces this host can read.")
    if _DIRS.get(key, (None,))[0] != now:
        found = []
        for f, *_ in now:
            try:
                trace = load(os.path.join(path, f))
            except (UserError, OSError):
                continue
            if isinstance(trace.get("job"), dict) and {"workload", "compressor"} <= trace["job"].keys():
                found.append((os.path.join(path, f), trace))
        _DIRS.pop(key, None)
        while len(_DIRS) >= 4:                 # the directories read last, a few at a time
            _DIRS.pop(next(iter(_DIRS)))
        _DIRS[key] = (now, tuple(found))
    return _DIRS[key][1]


_DIRS: dict[str, tuple[tuple, tuple]] = {}


def save(trace: dict[str, Any], path: str) -> None:
    """Write ``trace`` to ``path``; a name ending in .gz is gzip-compressed. One UserError when it
    cannot be written."""
    text = json.dumps(trace, separators=(",", ":"))
    opener = gzip.open if path.endswith(".gz") else open
    partial = f"{path}.partial"
    try:
        with opener(partial, "wt", encoding="utf-8") as f:
            f.write(text)
        os.replace(partial, path)                # a failed write leaves no truncated trace behind
    except OSError as e:
        if os.path.exists(partial):
            os.remove(partial)
        raise UserError(f"cannot write trace {path}: {e.strerror or e}.") from None


def read_json(path: str, what: str = "trace") -> Any:
    """The JSON in ``path`` (gzip-compressed when its name ends in .gz): one UserError, naming
    ``what`` it was, when it cannot be read."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, EOFError, ValueError) as e:
        raise UserError(f"cannot read {what} {path}: {getattr(e, 'strerror', None) or e}.") from None


def load(path: str) -> dict[str, Any]:
    """A trace from ``path``, checked for its format and version: anything else is one UserError."""
    trace = read_json(path)
    if not isinstance(trace, dict) or trace.get("format") != FORMAT:
        raise UserError(f"{path} is not a gctestbed trace (no \"format\": \"{FORMAT}\").")
    if trace.get("version") != VERSION:
        raise UserError(f"{path} is a version {trace.get('version')} trace; this gctestbed reads version {VERSION}.")
    return trace
