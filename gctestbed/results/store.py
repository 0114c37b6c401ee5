"""The results store: one SQLite file per results directory, shared by the runner and all workers.

WAL mode lets every worker commit its steps while the runner reads progress, and each step is
its own transaction, so a node that dies loses nothing it had recorded. Analysis reads only this
store, never logs, so a report can be rebuilt at any time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import sqlite3
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from ..spec import LOCAL_COMMS, RunSpec, UserError

DB_NAME = "gctestbed.sqlite"
SCHEMA_VERSION = 12
STEP_FIELDS = ("step_s", "compute_s", "optim_s", "comm_s", "encode_s", "decode_s", "loss",
               "tx_bytes", "rx_bytes", "payload_bytes", "gather_bytes", "expected_tx_bytes", "reduce_calls",
               "gather_calls", "buckets", "tail_tx_bytes", "push_s", "pull_s", "sync_s")
SERVER_STEP_FIELDS = ("sum_s", "wait_s", "send_s", "messages", "push_bytes", "pull_bytes", "tx_bytes", "rx_bytes")

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id      TEXT PRIMARY KEY,
    created_at  REAL NOT NULL,
    finished_at REAL,
    status      TEXT NOT NULL CHECK (status IN ('running', 'ok', 'failed')),
    error       TEXT,
    spec        TEXT NOT NULL,
    environment TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS nodes (
    run_id       TEXT NOT NULL REFERENCES runs(run_id),
    rank         INTEGER NOT NULL,
    name         TEXT,
    address      TEXT,
    exit_code    INTEGER,
    role         TEXT,           -- worker | server (parameter servers)
    param_sha256 TEXT,
    eval_loss    REAL,           -- the workload's held-out evaluation after the last step
    eval_accuracy REAL,
    eval_samples INTEGER,        -- how many held-out samples (or tokens) the accuracy counts
    cpu_s        REAL,           -- CPU time the node's process used (user + system), start to end
    wall_s       REAL,           -- and the wall time it lived
    rss_bytes    INTEGER,        -- its peak resident set (the kernel's ru_maxrss)
    pss_bytes    INTEGER,        -- at its end, its proportional share of the pages it maps (shared pages split)
    uss_bytes    INTEGER,        -- at its end, the pages only it maps (what its exit would free)
    PRIMARY KEY (run_id, rank)
);
CREATE TABLE IF NOT EXISTS evals (         -- held-out loss and accuracy during training (rank 0's replica)
    run_id   TEXT NOT NULL REFERENCES runs(run_id),
    step     INTEGER NOT NULL,       -- steps done when it was taken
    loss     REAL,
    accuracy REAL,
    samples  INTEGER,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE IF NOT EXISTS steps (
    run_id        TEXT NOT NULL REFERENCES runs(run_id),
    rank          INTEGER NOT NULL,
    step          INTEGER NOT NULL,
    t             REAL NOT NULL,
    step_s        REAL NOT NULL,
    compute_s     REAL,
    optim_s       REAL,
    comm_s        REAL,
    encode_s      REAL,
    decode_s      REAL,
    loss          REAL,
    tx_bytes      INTEGER,
    rx_bytes      INTEGER,
    payload_bytes INTEGER,
    gather_bytes  INTEGER,       -- the part of payload_bytes every rank must see (all-gathered)
    expected_tx_bytes INTEGER,   -- what the collectives' algorithms send for those payloads
    reduce_calls  INTEGER,       -- all-reduce and all-gather calls issued: each costs latency
    gather_calls  INTEGER,
    buckets       INTEGER,
    tail_tx_bytes INTEGER,       -- expected_tx_bytes of the bucket backward finishes last
    push_s        REAL,          -- parameter servers: sending the step's pushes, summed over buckets
    pull_s        REAL,          -- ... and waiting for the pulls after them (server sums included)
    sync_s        REAL,          -- local SGD, DiLoCo: averaging the model after the optimizer step
    PRIMARY KEY (run_id, rank, step)
);
CREATE TABLE IF NOT EXISTS server_steps (  -- a parameter server's share of each step
    run_id     TEXT NOT NULL REFERENCES runs(run_id),
    rank       INTEGER NOT NULL,
    step       INTEGER NOT NULL,
    t          REAL NOT NULL,
    sum_s      REAL NOT NULL,        -- decoding, summing and (compressed pull) re-encoding
    wait_s     REAL NOT NULL,        -- waiting for and receiving the workers' pushes
    send_s     REAL NOT NULL,        -- sending the pulls back
    messages   INTEGER NOT NULL,     -- pushes received
    push_bytes INTEGER NOT NULL,     -- bytes of those pushes (envelopes, headers, payloads)
    pull_bytes INTEGER NOT NULL,     -- bytes of the pulls sent back
    tx_bytes   INTEGER,              -- the server's interface counters over the step
    rx_bytes   INTEGER,
    PRIMARY KEY (run_id, rank, step)
);
CREATE TABLE IF NOT EXISTS exchanges (     -- every bucket a rank exchanged in a step
    run_id        TEXT NOT NULL REFERENCES runs(run_id),
    rank          INTEGER NOT NULL,
    step          INTEGER NOT NULL,
    seq           INTEGER NOT NULL,          -- its place among the step's exchanges
    bucket        INTEGER NOT NULL,          -- DDP's bucket index
    layout        INTEGER NOT NULL,          -- the parameters it held (layouts)
    numel         INTEGER NOT NULL,
    sent          INTEGER,                   -- elements the payload carried, for methods that choose them
    rounds        INTEGER NOT NULL,          -- rounds that issued collectives
    reduce_calls  INTEGER NOT NULL,
    gather_calls  INTEGER NOT NULL,
    payload_bytes INTEGER NOT NULL,
    gather_bytes  INTEGER NOT NULL,
    expected_tx_bytes INTEGER NOT NULL,
    PRIMARY KEY (run_id, rank, step, seq)
);
CREATE TABLE IF NOT EXISTS layouts (       -- the parameters of a bucket, in its order
    run_id  TEXT NOT NULL REFERENCES runs(run_id),
    rank    INTEGER NOT NULL,
    layout  INTEGER NOT NULL,
    params  TEXT NOT NULL,                  -- JSON [[name, [shape...]], ...]
    PRIMARY KEY (run_id, rank, layout)
);
CREATE TABLE IF NOT EXISTS calibrations (
    run_id       TEXT NOT NULL,          -- the run, or the cluster calibrated on its own
    t            REAL NOT NULL,
    src          INTEGER NOT NULL,
    dst          INTEGER NOT NULL,
    tool         TEXT NOT NULL,
    target_bps   INTEGER NOT NULL,
    target_rtt_s REAL NOT NULL,
    wire_bps     REAL,
    goodput_bps  REAL,
    rtt_idle_s   REAL,
    rtt_loaded_s REAL,
    miss         TEXT,
    PRIMARY KEY (run_id, src, dst, t)
);
CREATE TABLE IF NOT EXISTS faults (
    run_id  TEXT NOT NULL REFERENCES runs(run_id),
    idx     INTEGER NOT NULL,        -- its place among the run's --fault flags
    kind    TEXT NOT NULL,           -- link-down | loss
    node    INTEGER NOT NULL,
    pct     REAL,
    started REAL,                    -- when it was applied (NULL: the run ended first)
    ended   REAL,                    -- when it was lifted, or the run ended with it on
    PRIMARY KEY (run_id, idx)
);
CREATE TABLE IF NOT EXISTS sweep_cells (
    sweep   TEXT NOT NULL,
    cell    TEXT NOT NULL,           -- canonical JSON of the cell's parameters
    repeat  INTEGER NOT NULL,
    run_id  TEXT,                    -- the run that measured it (the latest attempt)
    status  TEXT NOT NULL CHECK (status IN ('running', 'ok', 'failed', 'interrupted')),
    updated REAL NOT NULL,
    PRIMARY KEY (sweep, cell, repeat)
);
"""
EXCHANGE_FIELDS = ("seq", "bucket", "layout", "numel", "sent", "rounds", "reduce_calls", "gather_calls", "payload_bytes",
                   "gather_bytes", "expected_tx_bytes")
CALIBRATION_FIELDS = ("src", "dst", "tool", "target_bps", "target_rtt_s", "wire_bps", "goodput_bps",
                      "rtt_idle_s", "rtt_loaded_s", "miss")


def db_path(results_dir: str) -> str:
    return os.path.join(os.path.abspath(results_dir), DB_NAME)


BUSY_TIMEOUT_S = 30.0          # how long a writer waits for another process's lock before giving up
MIN_FREE_BYTES = 4 << 20       # a run needs room for its steps, spec and logs: refuse to start with less


class StoreError(UserError):
    """The store cannot be read or written (no space, locked, read-only, damaged); one sentence.
    SQLite's transactions and WAL keep what was stored before intact."""


def store_error(path: str, error: Exception) -> StoreError:
    """One sentence for what went wrong with the store at ``path``, and what to do."""
    text = str(error)
    low = text.lower()
    try:
        no_room = shutil.disk_usage(os.path.dirname(path)).free < (256 << 10)
    except OSError:
        no_room = False
    if "full" in low or getattr(error, "errno", None) == 28 or no_room:
        why = "the disk is full; free space and run again"
    elif "locked" in low or "busy" in low:
        why = (f"another process has held it locked for more than {BUSY_TIMEOUT_S:g} s; "
               "let it finish, or use another --results directory")
    elif "readonly" in low or "read-only" in low or "permission" in low or getattr(error, "errno", None) in (13, 30):
        why = "it is not writable here; check the directory's permissions or mount, or use another --results directory"
    elif "malformed" in low or "not a database" in low or "corrupt" in low or "disk i/o" in low:
        why = "the file is damaged or not a gctestbed store; move it aside (keep it: SQLite's .recover may save rows) or use another --results directory"
    else:
        why = "check the directory is writable and the file is a gctestbed store"
    return StoreError(f"results store {path}: {text}: {why}; nothing already stored was changed.")


def connect(results_dir: str, create: bool = True) -> sqlite3.Connection:
    """Open (and if asked create) the store of ``results_dir``."""
    path = db_path(results_dir)
    if not create and not os.path.exists(path):
        raise UserError(f"there is no results store at {path}: run 'gctestbed run' first or pass --results DIR.")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fresh = not os.path.exists(path)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        if fresh:
            os.chmod(path, 0o600)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA foreign_keys=ON")
        if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:    # new or older: no write otherwise
            with conn:
                conn.executescript(SCHEMA)
                _migrate(conn)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    except (OSError, sqlite3.Error) as e:
        raise store_error(path, e) from None
    return conn


def check_writable(results_dir: str) -> None:
    """Before a run builds anything: the store opens, is sound, and can take a write now."""
    path = db_path(results_dir)
    conn = connect(results_dir)
    try:
        if shutil.disk_usage(os.path.dirname(path)).free < MIN_FREE_BYTES:
            raise sqlite3.OperationalError(f"less than {MIN_FREE_BYTES >> 20} MB free: database or disk is full")
        bad = conn.execute("PRAGMA quick_check").fetchone()[0]
        if bad != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed ({bad})")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    except sqlite3.Error as e:
        raise store_error(path, e) from None
    finally:
        conn.close()


def _migrate(conn: sqlite3.Connection) -> None:
    """Columns added since a store was created (additive only: old rows read as NULL)."""
    for table, column, kind in (("steps", "expected_tx_bytes", "INTEGER"), ("nodes", "eval_loss", "REAL"),
                                ("nodes", "eval_accuracy", "REAL"), ("steps", "gather_bytes", "INTEGER"),
                                ("steps", "reduce_calls", "INTEGER"), ("steps", "gather_calls", "INTEGER"),
                                ("steps", "tail_tx_bytes", "INTEGER"), ("nodes", "eval_samples", "INTEGER"),
                                ("steps", "push_s", "REAL"), ("steps", "pull_s", "REAL"), ("steps", "sync_s", "REAL"),
                                ("nodes", "role", "TEXT"), ("nodes", "cpu_s", "REAL"), ("nodes", "wall_s", "REAL"),
                                ("nodes", "rss_bytes", "INTEGER"), ("nodes", "pss_bytes", "INTEGER"),
                                ("nodes", "uss_bytes", "INTEGER")):
        if column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
            try:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            except sqlite3.OperationalError as e:     # another process (a node) added it in the meantime
                if "duplicate column" not in str(e):
                    raise


class Recorder:
    """Writes one run's rows. The runner owns the run row; each worker writes its own steps."""

    def __init__(self, results_dir: str, run_id: str):
        self.conn = connect(results_dir)
        self.run_id = run_id
        self.path = db_path(results_dir)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One transaction; any SQLite failure becomes one StoreError sentence (and is rolled back)."""
        try:
            with self.conn:
                yield self.conn
        except sqlite3.Error as e:
            raise store_error(self.path, e) from None

    def close(self) -> None:
        self.conn.close()

    def start_run(self, spec: RunSpec, environment: dict) -> None:
        with self._writing():
            self.conn.execute("INSERT INTO runs (run_id, created_at, status, spec, environment) VALUES (?, ?, 'running', ?, ?)",
                              (self.run_id, time.time(), spec.to_json(), json.dumps(environment)))

    def update_environment(self, **items: Any) -> None:
        with self._writing():
            row = self.conn.execute("SELECT environment FROM runs WHERE run_id=?", (self.run_id,)).fetchone()
            env = {**json.loads(row["environment"]), **items}
            self.conn.execute("UPDATE runs SET environment=? WHERE run_id=?", (json.dumps(env), self.run_id))

    def finish_run(self, status: str, error: str | None = None) -> None:
        with self._writing():
            self.conn.execute("UPDATE runs SET status=?, error=?, finished_at=? WHERE run_id=?",
                              (status, error, time.time(), self.run_id))

    def node(self, rank: int, **fields: Any) -> None:
        """Insert or update the row of node ``rank`` (name, address, exit_code, param_sha256)."""
        with self._writing():
            self.conn.execute("INSERT OR IGNORE INTO nodes (run_id, rank) VALUES (?, ?)", (self.run_id, rank))
            for key, value in fields.items():
                if key not in ("name", "address", "role", "exit_code", "param_sha256", "eval_loss", "eval_accuracy",
                               "eval_samples", "cpu_s", "wall_s", "rss_bytes", "pss_bytes", "uss_bytes"):
                    raise KeyError(key)
                self.conn.execute(f"UPDATE nodes SET {key}=? WHERE run_id=? AND rank=?", (value, self.run_id, rank))

    def evaluation(self, step: int, loss: float | None, accuracy: float | None, samples: int | None) -> None:
        """The held-out figures after ``step`` steps (a NaN loss is kept as NULL, as in steps)."""
        with self._writing():
            self.conn.execute("INSERT OR REPLACE INTO evals (run_id, step, loss, accuracy, samples) VALUES (?, ?, ?, ?, ?)",
                              (self.run_id, step, loss, accuracy, samples))

    def calibration(self, path: dict[str, Any]) -> None:
        """Store one measured path (net.calibrate.PathResult.to_dict())."""
        values = [path.get(k) for k in CALIBRATION_FIELDS]
        with self._writing():
            self.conn.execute(f"INSERT INTO calibrations (run_id, t, {', '.join(CALIBRATION_FIELDS)}) "
                              f"VALUES (?, ?, {', '.join('?' * len(CALIBRATION_FIELDS))})",
                              (self.run_id, time.time(), *values))

    def fault(self, idx: int, kind: str, node: int, pct: float, **times: float) -> None:
        """Record when fault ``idx`` of the run started or ended (``started=``/``ended=`` wall times)."""
        with self._writing():
            self.conn.execute("INSERT OR IGNORE INTO faults (run_id, idx, kind, node, pct) VALUES (?, ?, ?, ?, ?)",
                              (self.run_id, idx, kind, node, pct))
            for key, value in times.items():
                if key not in ("started", "ended"):
                    raise KeyError(key)
                self.conn.execute(f"UPDATE faults SET {key}=? WHERE run_id=? AND idx=?", (value, self.run_id, idx))

    def server_step(self, rank: int, step: int, **values: Any) -> None:
        """Commit one parameter server's share of one step (SERVER_STEP_FIELDS)."""
        if set(values) != set(SERVER_STEP_FIELDS):
            raise KeyError(sorted(set(values) ^ set(SERVER_STEP_FIELDS)))
        cols = ["run_id", "rank", "step", "t", *values]
        with self._writing():
            self.conn.execute(f"INSERT INTO server_steps ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                              (self.run_id, rank, step, time.time(), *values.values()))

    def step(self, rank: int, step: int, exchanges: Iterable[dict] = (), layouts: Iterable[dict] = (),
             **values: Any) -> None:
        """Commit one step of one rank, with its buckets' exchanges and the bucket layouts first seen
        in it (compress.hook's take_step_stats); unknown fields are an error, missing ones are NULL."""
        unknown = set(values) - set(STEP_FIELDS)
        if unknown:
            raise KeyError(sorted(unknown))
        cols = ["run_id", "rank", "step", "t", *values]
        with self._writing():
            self.conn.execute(f"INSERT INTO steps ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                              (self.run_id, rank, step, time.time(), *values.values()))
            self.conn.executemany("INSERT INTO layouts (run_id, rank, layout, params) VALUES (?, ?, ?, ?)",
                                  [(self.run_id, rank, lay["layout"], json.dumps(lay["params"])) for lay in layouts])
            self.conn.executemany(
                f"INSERT INTO exchanges (run_id, rank, step, {', '.join(EXCHANGE_FIELDS)}) "
                f"VALUES (?, ?, ?, {', '.join('?' * len(EXCHANGE_FIELDS))})",
                [(self.run_id, rank, step, *(ex[k] for k in EXCHANGE_FIELDS)) for ex in exchanges])


def cell_status(conn: sqlite3.Connection, sweep: str, cell: str, repeat: int) -> str | None:
    """How sweep ``sweep`` left this cell: None (never started), running (its sweep died), ok,
    failed or interrupted."""
    row = conn.execute("SELECT status FROM sweep_cells WHERE sweep=? AND cell=? AND repeat=?",
                       (sweep, cell, repeat)).fetchone()
    return row["status"] if row else None


def mark_cell(conn: sqlite3.Connection, sweep: str, cell: str, repeat: int, status: str,
              run_id: str | None = None) -> None:
    with conn:
        conn.execute("INSERT INTO sweep_cells (sweep, cell, repeat, run_id, status, updated) VALUES (?, ?, ?, ?, ?, ?) "
                     "ON CONFLICT (sweep, cell, repeat) DO UPDATE SET status=excluded.status, updated=excluded.updated, "
                     "run_id=COALESCE(excluded.run_id, run_id)", (sweep, cell, repeat, run_id, status, time.time()))


def sweep_runs(conn: sqlite3.Connection, sweep: str | None = None) -> list[sqlite3.Row]:
    """The runs of the finished cells of ``sweep`` (or of every sweep), with their sweep and cell."""
    query = "SELECT sweep, cell, repeat, run_id FROM sweep_cells WHERE status='ok'"
    return conn.execute(query + (" AND sweep=?" if sweep else "") + " ORDER BY updated",
                        (sweep,) if sweep else ()).fetchall()


RANK_TABLES = ("steps", "exchanges", "layouts", "nodes", "server_steps")     # what each rank writes of a run


def export_rank(conn: sqlite3.Connection, run_id: str, rank: int) -> dict[str, list[dict]]:
    """Everything rank ``rank`` recorded for ``run_id``: its steps, exchanges, layouts and node row."""
    return {table: [dict(r) for r in conn.execute(f"SELECT * FROM {table} WHERE run_id=? AND rank=?", (run_id, rank))]
            for table in RANK_TABLES}


def import_rows(conn: sqlite3.Connection, exported: list[dict[str, list[dict]]]) -> None:
    """Add other hosts' rows (from ``export_rank``) to this store; rows it has already are kept."""
    with conn:
        for part in exported:
            for table in RANK_TABLES:
                for row in part.get(table, []):
                    _insert_new(conn, table, row)


def _insert_new(conn: sqlite3.Connection, table: str, row: dict) -> None:
    """Add ``row`` to ``table`` unless a row with its key is there already."""
    conn.execute(f"INSERT OR IGNORE INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                 tuple(row.values()))


RUN_TABLES = ("runs", "evals", "calibrations", "faults") + RANK_TABLES     # every table a run's rows live in


def copy_run(src: sqlite3.Connection, dst: sqlite3.Connection, run_id: str) -> bool:
    """Copy every row of ``run_id`` from store ``src`` into ``dst`` (a host's store into a sweep's);
    rows ``dst`` has already are kept. False when ``src`` has no such run."""
    if src.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone() is None:
        return False
    with dst:
        for table in RUN_TABLES:
            for row in src.execute(f"SELECT * FROM {table} WHERE run_id=?", (run_id,)):
                _insert_new(dst, table, dict(row))
    return True


def find_run(conn: sqlite3.Connection, run: str | None) -> sqlite3.Row:
    """The run whose id starts with ``run``, or the latest run when ``run`` is None."""
    if run is None:
        row = conn.execute("SELECT * FROM runs ORDER BY created_at DESC LIMIT 1").fetchone()
        if row is None:
            raise UserError("the results store has no runs yet: start one with 'gctestbed run'.")
        return row
    rows = conn.execute("SELECT * FROM runs WHERE run_id LIKE ? ORDER BY created_at DESC", (f"{run}%",)).fetchall()
    if not rows:
        raise UserError(f"no run matches '{run}': 'gctestbed show --all' lists the stored runs.")
    if len(rows) > 1:
        raise UserError(f"'{run}' matches {len(rows)} runs: give more characters of the run id.")
    return rows[0]


def list_runs(conn: sqlite3.Connection) -> list[sqlite3.Row]:
    return conn.execute("SELECT run_id FROM runs ORDER BY created_at").fetchall()


def exchanges_of(conn: sqlite3.Connection, run_id: str) -> list[dict]:
    """Every bucket exchange of a run, every rank's."""
    return [dict(r) for r in conn.execute("SELECT * FROM exchanges WHERE run_id=? ORDER BY step, rank, seq", (run_id,))]


def layouts_of(conn: sqlite3.Connection, run_id: str) -> dict[tuple[int, int], list]:
    """(rank, layout) -> the bucket's parameters, [[name, shape], ...]."""
    return {(r["rank"], r["layout"]): json.loads(r["params"])
            for r in conn.execute("SELECT * FROM layouts WHERE run_id=?", (run_id,))}


def contract_check(conn: sqlite3.Connection, run_id: str, spec: RunSpec, model_numel: int | None = None) -> dict | None:
    """The run's steps against its method's contract (gctestbed.contracts; over the ring, or
    pushed to parameter servers), or None for a run that recorded no exchanges (a user's script
    that never installed gctestbed's hook)."""
    from .. import contracts
    exchanges = exchanges_of(conn, run_id)
    if not exchanges:
        return None
    steps = [dict(r) for r in conn.execute("SELECT rank, step, tx_bytes FROM steps WHERE run_id=?", (run_id,))]
    if spec.comm == "ps":
        server_steps = [dict(r) for r in conn.execute("SELECT * FROM server_steps WHERE run_id=?", (run_id,))]
        return contracts.judge_ps(spec.compressor, spec.compressor_options, spec.comm_options, spec.nodes, steps,
                                  exchanges, layouts_of(conn, run_id), server_steps, model_numel)
    return contracts.judge(spec.compressor, spec.compressor_options, spec.nodes, steps, exchanges,
                           layouts_of(conn, run_id), model_numel)


def last_step(conn: sqlite3.Connection, run_id: str, rank: int = 0) -> sqlite3.Row | None:
    return conn.execute("SELECT * FROM steps WHERE run_id=? AND rank=? ORDER BY step DESC LIMIT 1",
                        (run_id, rank)).fetchone()


def steps_per_rank(conn: sqlite3.Connection, run_id: str, rank: int | None = None) -> dict[int, int]:
    """How many steps each rank (or only ``rank``) has recorded."""
    rows = conn.execute("SELECT rank, COUNT(*) FROM steps WHERE run_id=? AND (? IS NULL OR rank=?) GROUP BY rank",
                        (run_id, rank, rank)).fetchall()
    return {r[0]: r[1] for r in rows}


def has_calibration(conn: sqlite3.Connection, run_id: str) -> bool:
    return conn.execute("SELECT 1 FROM calibrations WHERE run_id=? LIMIT 1", (run_id,)).fetchone() is not None


def run_status(conn: sqlite3.Connection, run_id: str) -> str | None:
    row = conn.execute("SELECT status FROM runs WHERE run_id=?", (run_id,)).fetchone()
    return row["status"] if row else None


def ok_run_ids(conn: sqlite3.Connection) -> list[str]:
    """The runs that ended well, oldest first."""
    return [r["run_id"] for r in conn.execute("SELECT run_id FROM runs WHERE status='ok' ORDER BY created_at")]


def sweep_names(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT DISTINCT sweep FROM sweep_cells")]


def losses(conn: sqlite3.Connection, run_id: str, rank: int = 0) -> list[float | None]:
    """Rank ``rank``'s loss per step (None where SQLite kept a NaN as NULL)."""
    return [r["loss"] for r in conn.execute("SELECT loss FROM steps WHERE run_id=? AND rank=? ORDER BY step",
                                            (run_id, rank))]


def curve(conn: sqlite3.Connection, run_id: str) -> tuple[list[float | None], list[float]]:
    """Rank 0's loss per step and the wall time at the end of each step (slowest rank's step times)."""
    out_losses, wall, t = [], [], 0.0
    for r in conn.execute("SELECT step, MAX(step_s) AS s, SUM(CASE WHEN rank=0 THEN loss END) AS loss "
                          "FROM steps WHERE run_id=? GROUP BY step ORDER BY step", (run_id,)):
        t += r["s"]
        out_losses.append(r["loss"])
        wall.append(t)
    return out_losses, wall


def phases(conn: sqlite3.Connection, run_id: str, rank: int = 0) -> list[dict[str, Any]]:
    """Rank ``rank``'s timed phases per step (serial mode times each): encode_s, comm_s, decode_s."""
    return [dict(r) for r in conn.execute("SELECT step, encode_s, comm_s, decode_s FROM steps WHERE run_id=? AND rank=? "
                                          "ORDER BY step", (run_id, rank))]


def evaluations(conn: sqlite3.Connection, run_id: str) -> list[dict[str, Any]]:
    """The run's held-out evaluations in step order: step, loss, accuracy, samples."""
    return [dict(r) for r in conn.execute("SELECT step, loss, accuracy, samples FROM evals WHERE run_id=? ORDER BY step",
                                          (run_id,))]


def latest_run_since(conn: sqlite3.Connection, since: float) -> sqlite3.Row | None:
    """The newest run created at or after ``since``."""
    return conn.execute("SELECT * FROM runs WHERE created_at >= ? ORDER BY created_at DESC LIMIT 1",
                        (since,)).fetchone()


def fault_effect(spec: RunSpec, fault: sqlite3.Row, steps: dict[int, list[sqlite3.Row]]) -> dict[str, Any]:
    """What a fault did, from the step records: the steps that ran while it was on, and the median
    step time (and bytes the faulted node sent: retransmissions show there) during it against the
    median of the other steps (step 0, with DDP's start-up traffic, left out of both)."""
    planned = spec.faults[fault["idx"]] if fault["idx"] < len(spec.faults) else None
    out = {"fault": planned.describe() if planned else f"{fault['kind']} on node {fault['node']}",
           "kind": fault["kind"], "node": fault["node"], "pct": fault["pct"], "started": fault["started"],
           "ended": fault["ended"], "steps": [], "median_step_s_during": None, "median_step_s_outside": None,
           "median_tx_bytes_during": None, "median_tx_bytes_outside": None}
    if fault["started"] is None:
        return out
    end = fault["ended"] if fault["ended"] is not None else math.inf
    during, outside, tx_during, tx_outside = [], [], [], []
    for step, rows in sorted(steps.items()):
        begun, finished = min(r["t"] - r["step_s"] for r in rows), max(r["t"] for r in rows)
        hit = begun <= end and finished >= fault["started"]
        if hit:
            out["steps"].append(step)
        if step > 0:
            (during if hit else outside).append(max(r["step_s"] for r in rows))
            (tx_during if hit else tx_outside).extend(r["tx_bytes"] for r in rows if r["rank"] == fault["node"])
    out["median_step_s_during"], out["median_step_s_outside"] = _median(during), _median(outside)
    out["median_tx_bytes_during"], out["median_tx_bytes_outside"] = _median(tx_during), _median(tx_outside)
    return out


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


@dataclass(frozen=True)
class RunSummary:
    """The figures of one run, from its stored rows only (``show --json`` prints ``to_dict()``;
    docs/running.md says what each field means). Step figures are medians over complete steps."""

    run_id: str
    status: str
    error: str | None
    compressor: str
    compressor_options: dict[str, Any]
    kernels: str
    mode: str
    workload: str
    workload_options: dict[str, Any]
    batch_size: int
    nodes: int
    topology: str | None
    bw_bps: int
    latency_s: float
    steps: int
    steps_recorded: int
    median_step_s: float | None
    samples_per_s: float | None
    median_compute_s: float | None
    median_comm_s: float | None
    median_encode_s: float | None
    median_decode_s: float | None
    median_optim_s: float | None
    wire_bytes_per_step: float | None
    payload_bytes_per_step: float | None
    gather_bytes_per_step: float | None
    expected_tx_bytes_per_step: float | None
    reduce_calls_per_step: float | None
    gather_calls_per_step: float | None
    tail_tx_bytes_per_step: float | None
    buckets_per_step: float | None
    sent_fraction: float | None
    contract: dict[str, Any] | None
    busbw_bps: float | None
    bottleneck_bps: int
    busbw_fraction_of_link: float | None
    final_loss: float | None
    eval_loss: float | None
    eval_accuracy: float | None
    eval_samples: int | None
    params_identical: bool | None
    latency_impl: str | None
    environment: dict[str, Any]
    calibration: list[dict[str, Any]]
    calibration_missed: bool
    faults: list[dict[str, Any]]
    created_at: float
    finished_at: float | None
    comm: str = "allreduce"                  # how the workers met (--comm) and its options
    comm_options: dict[str, Any] = field(default_factory=dict)
    median_push_s: float | None = None       # parameter servers: the workers' pushes and pulls per step
    median_pull_s: float | None = None
    median_sync_s: float | None = None       # local SGD, DiLoCo: averaging time, over the steps that averaged
    servers: list[dict[str, Any]] = field(default_factory=list)   # each server's per-step figures
    bottleneck: str | None = None            # parameter servers: the link or phase that bounds a step
    amortised: dict[str, Any] | None = None  # local SGD, DiLoCo: means over whole periods (see _amortised)
    cpu: dict[str, Any] | None = None        # each node's CPU time against wall time, the cap, contention (see _cpu)
    phases: dict[str, Any] | None = None     # where the run's wall time went, and its fixed cost (see _phases)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _identical(nodes: list) -> bool | None:
    """Whether every worker's parameters hashed alike (servers hold no model)."""
    if not nodes:
        return None
    return len({r["param_sha256"] for r in nodes}) == 1 and all(r["param_sha256"] for r in nodes)


def _servers(conn: sqlite3.Connection, run_id: str, spec: RunSpec, measured: list[int]) -> list[dict[str, Any]]:
    """Each parameter server's medians over the measured steps, and its run totals."""
    out = []
    for k in range(spec.servers):
        rows = [dict(r) for r in conn.execute("SELECT * FROM server_steps WHERE run_id=? AND rank=? ORDER BY step",
                                              (run_id, spec.nodes + k))]
        picked = [r for r in rows if r["step"] in measured] or rows
        out.append({"server": k, "rank": spec.nodes + k, "steps": len(rows),
                    **{f"median_{f}": _median(r[f] for r in picked) for f in SERVER_STEP_FIELDS},
                    "total_push_bytes": sum(r["push_bytes"] for r in rows), "total_pull_bytes": sum(r["pull_bytes"] for r in rows),
                    "total_tx_bytes": sum(r["tx_bytes"] or 0 for r in rows), "total_rx_bytes": sum(r["rx_bytes"] or 0 for r in rows)})
    return out


def _ps_bottleneck(spec: RunSpec, per_step: list, servers: list[dict]) -> str | None:
    """Which link or phase bounds a parameter-server step: each link's median bytes per step at its
    shaped rate, against the servers' summing time."""
    net = spec.network()
    candidates = []
    for rank in range(spec.nodes):            # each worker's pushes through its own uplink (a topology may differ)
        push = _median(r["expected_tx_bytes"] for rs in per_step for r in rs if r["rank"] == rank)
        if push:
            candidates.append((push * 8 / net.nodes[rank].hop.ab.rate_bps,
                               f"worker {rank}'s uplink (pushes, {push / 1e6:.3g} MB per step)"))
    for s in servers:
        hop = net.nodes[s["rank"]].hop
        if s["median_push_bytes"]:
            candidates.append((s["median_push_bytes"] * 8 / hop.ba.rate_bps,
                               f"server {s['server']}'s downlink ({spec.nodes} workers' pushes, {s['median_push_bytes'] / 1e6:.3g} MB per step)"))
        if s["median_pull_bytes"]:
            candidates.append((s["median_pull_bytes"] * 8 / hop.ab.rate_bps,
                               f"server {s['server']}'s uplink (pulls to {spec.nodes} workers, {s['median_pull_bytes'] / 1e6:.3g} MB per step)"))
        if s["median_sum_s"]:
            candidates.append((s["median_sum_s"], f"server {s['server']}'s summing"))
    if not candidates:
        return None
    seconds, where = max(candidates)
    return f"{where}: {seconds:.3g} s per step at the shaped rate"


def _amortised(per_step: list) -> dict[str, Any]:
    """Local SGD and DiLoCo exchange only on the steps that average, so their median step is a
    local one that sends nothing: step time, bytes and collectives are compared as means instead,
    with the share of steps that averaged. The means are over whole periods, from the step after
    the first average to the last: before it the workers have not met since they started, and the
    first collective waits for the slowest one's start (every measured step if fewer than two
    averaged)."""
    averaged = [i for i, rs in enumerate(per_step) if any(r["sync_s"] for r in rs)]
    if len(averaged) >= 2:
        per_step = per_step[averaged[0] + 1:averaged[-1] + 1]
    return {"step_s": _mean(max(r["step_s"] for r in rs) for rs in per_step),
            "expected_tx_bytes": _mean(_mean(r["expected_tx_bytes"] or 0 for r in rs) for rs in per_step),
            "reduce_calls": _mean(_mean(r["reduce_calls"] or 0 for r in rs) for rs in per_step),
            "averaged_share": _mean(float(any(r["sync_s"] for r in rs)) for rs in per_step),
            "steps": len(per_step)}


def _cpu(spec: RunSpec, nodes: list, env: dict) -> dict[str, Any]:
    """How the nodes shared this host's CPUs (and memory): the cap (--cpus-per-node, 0 for
    none), whether more nodes than cores ran uncapped (then compute times depend on the
    scheduler), each node's CPU time over its wall time and its memory as the node measured them,
    and the kernel's throttling counters of each node's cgroup where there were any."""
    cores = env.get("cpus")
    per_node = [{"rank": r["rank"], "cpu_s": r["cpu_s"], "wall_s": r["wall_s"],
                 "cpu_share": r["cpu_s"] / r["wall_s"] if r["cpu_s"] is not None and r["wall_s"] else None,
                 "rss_bytes": r["rss_bytes"], "pss_bytes": r["pss_bytes"], "uss_bytes": r["uss_bytes"]}
                for r in nodes]
    return {"cpus_per_node": spec.cpus_per_node, "host_cpus": cores,
            "contended": bool(cores and spec.world > cores and not spec.cpus_per_node), "nodes": per_node,
            "cgroups": (env.get("qdisc_stats") or {}).get("cpu_shares")}


def _phases(env: dict, rows: list) -> dict[str, Any] | None:
    """The seconds each phase of the run took as its runner timed them (building the network,
    calibrating, the nodes from start to exit, teardown), rank 0's steps summed (``steps_s``),
    and the fixed cost: the run's wall time beyond its own steps and calibration (``fixed_s``:
    starting interpreters and process groups, evaluation, building and removing the network).
    None for runs stored before runs timed them. ``gctestbed node`` runs are timed on rank 0's
    host, with teardown (unshaping, after the store's last write) as 0."""
    phases = env.get("phases")
    if not phases:
        return None
    total = sum(phases.values())
    steps = sum(r["step_s"] for r in rows if r["rank"] == 0)
    return {**phases, "total_s": total, "steps_s": steps, "fixed_s": total - steps - phases.get("calibrate_s", 0.0)}


def summarize(conn: sqlite3.Connection, run: sqlite3.Row) -> RunSummary:
    """The figures of one run, from its stored rows only.

    Step figures are medians over steps, leaving out step 0 (DDP builds its buckets there) when
    there are later steps. Bus bandwidth follows nccl-tests: the bytes each node must send for a
    ring all-reduce of the payload, 2(n-1)/n of it, over the measured communication time.
    """
    spec = RunSpec.from_json(run["spec"])
    rows = conn.execute("SELECT * FROM steps WHERE run_id=? ORDER BY step, rank", (run["run_id"],)).fetchall()
    done = {}
    for r in rows:
        done.setdefault(r["step"], []).append(r)
    complete = sorted(s for s, rs in done.items() if len(rs) == spec.nodes)
    measured = [s for s in complete if s > 0] or complete
    per_step = [done[s] for s in measured]
    step_s = _median(max(r["step_s"] for r in rs) for rs in per_step)
    n = spec.nodes
    busbw = _median(r["payload_bytes"] * 8 * 2 * (n - 1) / n / r["comm_s"]                # the ring's figure only
                    for rs in per_step for r in rs if n > 1 and r["comm_s"] and r["payload_bytes"]) \
        if spec.comm == "allreduce" else None
    last = done[complete[-1]] if complete else []
    net = spec.network()
    bottleneck = min(d.rate_bps for hop in [n.hop for n in net.nodes] + [t.hop for t in net.trunks]
                     for d in (hop.ab, hop.ba))
    nodes = conn.execute("SELECT * FROM nodes WHERE run_id=? ORDER BY rank", (run["run_id"],)).fetchall()
    calibration = [dict(r) for r in conn.execute("SELECT * FROM calibrations WHERE run_id=? ORDER BY t, src",
                                                 (run["run_id"],))]
    env = json.loads(run["environment"] or "{}")
    faults = [fault_effect(spec, f, done) for f in conn.execute("SELECT * FROM faults WHERE run_id=? ORDER BY idx",
                                                                 (run["run_id"],))]
    contract = contract_check(conn, run["run_id"], spec) if spec.comm in ("allreduce", "ps") else None
    servers = _servers(conn, run["run_id"], spec, measured)
    return RunSummary(
        comm=spec.comm, comm_options=spec.comm_options, servers=servers,
        median_push_s=_median(r["push_s"] for rs in per_step for r in rs if r["push_s"] is not None),
        median_pull_s=_median(r["pull_s"] for rs in per_step for r in rs if r["pull_s"] is not None),
        median_sync_s=_median(r["sync_s"] for rs in per_step for r in rs if r["sync_s"]),
        bottleneck=_ps_bottleneck(spec, per_step, servers) if servers else None,
        amortised=_amortised(per_step) if spec.comm in LOCAL_COMMS and per_step else None,
        cpu=_cpu(spec, nodes, env),
        phases=_phases(env, rows),
        run_id=run["run_id"],
        status=run["status"],
        error=run["error"],
        compressor=spec.compressor,
        compressor_options=spec.compressor_options,
        kernels=spec.kernels,
        mode=spec.mode,
        workload=spec.workload,
        workload_options=spec.workload_options,
        batch_size=spec.batch_size,
        nodes=n,
        topology=spec.topology.name if spec.topology else None,
        bw_bps=spec.link.bw_bps,
        latency_s=spec.link.latency_s,
        steps=spec.steps,
        steps_recorded=len(complete),
        median_step_s=step_s,
        samples_per_s=n * spec.batch_size / step_s if step_s else None,
        median_compute_s=_median(r["compute_s"] for rs in per_step for r in rs),
        median_comm_s=_median(r["comm_s"] for rs in per_step for r in rs),
        median_encode_s=_median(r["encode_s"] for rs in per_step for r in rs),
        median_decode_s=_median(r["decode_s"] for rs in per_step for r in rs),
        median_optim_s=_median(r["optim_s"] for rs in per_step for r in rs),
        wire_bytes_per_step=_median(_mean(r["tx_bytes"] for r in rs) for rs in per_step),
        payload_bytes_per_step=_median(r["payload_bytes"] for rs in per_step for r in rs),
        gather_bytes_per_step=_median(r["gather_bytes"] for rs in per_step for r in rs),
        expected_tx_bytes_per_step=_median(r["expected_tx_bytes"] for rs in per_step for r in rs),
        reduce_calls_per_step=_median(r["reduce_calls"] for rs in per_step for r in rs),
        gather_calls_per_step=_median(r["gather_calls"] for rs in per_step for r in rs),
        tail_tx_bytes_per_step=_median(r["tail_tx_bytes"] for rs in per_step for r in rs),
        buckets_per_step=_median(r["buckets"] for rs in per_step for r in rs),
        sent_fraction=contract["sent_fraction"] if contract else None,
        contract=contract,
        busbw_bps=busbw,
        bottleneck_bps=bottleneck,
        busbw_fraction_of_link=busbw / bottleneck if busbw else None,
        final_loss=_mean(r["loss"] for r in last),
        eval_loss=nodes[0]["eval_loss"] if nodes else None,
        eval_accuracy=nodes[0]["eval_accuracy"] if nodes else None,
        eval_samples=nodes[0]["eval_samples"] if nodes else None,
        params_identical=_identical([r for r in nodes if r["role"] != "server"]),
        latency_impl=env.get("shaping", {}).get("latency_impl"),
        environment=env,
        calibration=calibration,
        calibration_missed=any(c["miss"] for c in calibration),
        faults=faults,
        created_at=run["created_at"],
        finished_at=run["finished_at"],
    )
