"""The store itself: its file, schema and migrations, opening it, and every SQL statement.

One SQLite file per results directory, shared by the runner and all workers. WAL mode lets every
worker commit its steps while the runner reads progress. This module is the one owner of the
store's SQL: the Recorder (results.recorder), the summaries (results.summary) and every other
room call its functions and never write a statement of their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import time
from typing import Any, Iterable, Iterator

from ..spec import UserError

DB_NAME = "gctestbed.sqlite"
SCHEMA_VERSION = 19
STEP_FIELDS = ("step_s", "compute_s", "optim_s", "comm_s", "encode_s", "decode_s", "loss",
               "tx_bytes", "rx_bytes", "payload_bytes", "gather_bytes", "expected_tx_bytes", "reduce_calls",
               "gather_calls", "buckets", "tail_tx_bytes", "push_s", "pull_s", "sync_s", "behind_s", "forward_s",
               "optim_cpu_s")
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
    buffers      TEXT,           -- its model's buffers and whether DDP sent rank 0's before every forward (schema 17)
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
    behind_s      REAL,          -- a replay: how far its latest hand-over of a gradient came past the recorded moment
    forward_s     REAL,          -- the step's forward passes, each from the module's forward to its loss (part of compute_s)
    optim_cpu_s   REAL,          -- the CPU seconds optim_s's thread spent (a CPU node at one intra-op thread; else NULL)
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
    ready_s       REAL,                      -- when the hook got the bucket, from the step's first forward
    encode_s      REAL,                      -- its encoding, on the communication thread
    decode_s      REAL,                      -- its decoding
    start_s       REAL,                      -- when its encoding began, from the step's first forward
    done_s        REAL,                      -- when its decoded result was in the bucket, on that clock
    ready_cpu_s   REAL,                      -- the CPU seconds backward's thread spent from the step's first
    --                                            forward to ready_s (a CPU node at one intra-op thread; else NULL)
    encode_cpu_s  REAL,                      -- the CPU seconds encode_s's thread spent (the same; else NULL)
    decode_cpu_s  REAL,                      -- the CPU seconds decode_s's thread spent (the same; else NULL)
    payloads      TEXT,                      -- JSON, per round: {"reduce": [[dtype, numel], ...], "gather": [...]}
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
    congestion   TEXT,                   -- the sender's TCP congestion control, which a lossy path's target assumed
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
CPU_TIMES = ("ready_cpu_s", "encode_cpu_s", "decode_cpu_s")     # NULL where a node cannot tell them (a GPU)
EXCHANGE_FIELDS = ("seq", "bucket", "layout", "numel", "sent", "rounds", "reduce_calls", "gather_calls", "payload_bytes",
                   "gather_bytes", "expected_tx_bytes", "ready_s", "encode_s", "decode_s", "start_s", "done_s",
                   "payloads", *CPU_TIMES)
CALIBRATION_FIELDS = ("src", "dst", "tool", "target_bps", "target_rtt_s", "wire_bps", "goodput_bps",
                      "rtt_idle_s", "rtt_loaded_s", "miss", "congestion")


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
        _use_wal(conn)
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA foreign_keys=ON")
        if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:    # new or older: no write otherwise
            conn.executescript(SCHEMA)          # idempotent: two processes creating one store both may run it
            _migrate(conn)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    except (OSError, sqlite3.Error) as e:
        raise store_error(path, e) from None
    return conn


def _use_wal(conn: sqlite3.Connection) -> None:
    """Put the store in WAL mode. SQLite answers "locked" at once, without waiting, to a process
    that asks for WAL while another is switching a fresh store to it (two runs started together on
    a new results directory): wait for that switch, as for any other lock."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e).lower() or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction: every statement inside lands, or none does. It takes the write lock
    up front (BEGIN IMMEDIATE), so it waits for another writer instead of failing halfway."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:      # SQLite may have rolled back already (a full disk): its error is the one to tell
            conn.execute("ROLLBACK")
        raise


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
                                ("nodes", "uss_bytes", "INTEGER"), ("exchanges", "ready_s", "REAL"),
                                ("exchanges", "encode_s", "REAL"), ("exchanges", "decode_s", "REAL"),
                                ("exchanges", "start_s", "REAL"), ("exchanges", "done_s", "REAL"),
                                ("exchanges", "payloads", "TEXT"), ("steps", "behind_s", "REAL"),
                                ("steps", "forward_s", "REAL"), ("nodes", "buffers", "TEXT"),
                                ("steps", "optim_cpu_s", "REAL"), ("exchanges", "ready_cpu_s", "REAL"),
                                ("exchanges", "encode_cpu_s", "REAL"), ("exchanges", "decode_cpu_s", "REAL"),
                                ("calibrations", "congestion", "TEXT")):
        if column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
            try:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            except sqlite3.OperationalError as e:     # another process (a node) added it in the meantime
                if "duplicate column" not in str(e):
                    raise


# --- one run's writes (results.recorder.Recorder calls these inside its transaction) ---

NODE_COLUMNS = ("name", "address", "role", "exit_code", "param_sha256", "eval_loss", "eval_accuracy",
                "eval_samples", "cpu_s", "wall_s", "rss_bytes", "pss_bytes", "uss_bytes", "buffers")


def insert_run(conn: sqlite3.Connection, run_id: str, created_at: float, spec_json: str, environment: dict) -> None:
    conn.execute("INSERT INTO runs (run_id, created_at, status, spec, environment) VALUES (?, ?, 'running', ?, ?)",
                 (run_id, created_at, spec_json, json.dumps(environment)))


def update_environment(conn: sqlite3.Connection, run_id: str, items: dict[str, Any]) -> None:
    row = conn.execute("SELECT environment FROM runs WHERE run_id=?", (run_id,)).fetchone()
    env = {**json.loads(row["environment"]), **items}
    conn.execute("UPDATE runs SET environment=? WHERE run_id=?", (json.dumps(env), run_id))


def finish_run(conn: sqlite3.Connection, run_id: str, status: str, error: str | None, finished_at: float) -> None:
    conn.execute("UPDATE runs SET status=?, error=?, finished_at=? WHERE run_id=?", (status, error, finished_at, run_id))


def set_node(conn: sqlite3.Connection, run_id: str, rank: int, fields: dict[str, Any]) -> None:
    """Insert or update node ``rank``'s row; a field that is not one of NODE_COLUMNS is a KeyError."""
    conn.execute("INSERT OR IGNORE INTO nodes (run_id, rank) VALUES (?, ?)", (run_id, rank))
    for key, value in fields.items():
        if key not in NODE_COLUMNS:
            raise KeyError(key)
        conn.execute(f"UPDATE nodes SET {key}=? WHERE run_id=? AND rank=?", (value, run_id, rank))


def insert_evaluation(conn: sqlite3.Connection, run_id: str, step: int, loss: float | None, accuracy: float | None,
                      samples: int | None) -> None:
    conn.execute("INSERT OR REPLACE INTO evals (run_id, step, loss, accuracy, samples) VALUES (?, ?, ?, ?, ?)",
                 (run_id, step, loss, accuracy, samples))


def insert_calibration(conn: sqlite3.Connection, run_id: str, t: float, path: dict[str, Any]) -> None:
    values = [path.get(k) for k in CALIBRATION_FIELDS]
    conn.execute(f"INSERT INTO calibrations (run_id, t, {', '.join(CALIBRATION_FIELDS)}) "
                 f"VALUES (?, ?, {', '.join('?' * len(CALIBRATION_FIELDS))})", (run_id, t, *values))


def set_fault(conn: sqlite3.Connection, run_id: str, idx: int, kind: str, node: int, pct: float,
              times: dict[str, float]) -> None:
    """Insert fault ``idx``'s row once and set its ``started``/``ended`` times (any other key is a KeyError)."""
    conn.execute("INSERT OR IGNORE INTO faults (run_id, idx, kind, node, pct) VALUES (?, ?, ?, ?, ?)",
                 (run_id, idx, kind, node, pct))
    for key, value in times.items():
        if key not in ("started", "ended"):
            raise KeyError(key)
        conn.execute(f"UPDATE faults SET {key}=? WHERE run_id=? AND idx=?", (value, run_id, idx))


def insert_server_step(conn: sqlite3.Connection, run_id: str, rank: int, step: int, t: float,
                       values: dict[str, Any]) -> None:
    cols = ["run_id", "rank", "step", "t", *values]
    conn.execute(f"INSERT INTO server_steps ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                 (run_id, rank, step, t, *values.values()))


def insert_step(conn: sqlite3.Connection, run_id: str, rank: int, step: int, t: float, values: dict[str, Any],
                exchanges: Iterable[dict], layouts: Iterable[dict]) -> None:
    """One rank's step row (``values``: STEP_FIELDS), its exchanges and the layouts first seen in it."""
    cols = ["run_id", "rank", "step", "t", *values]
    conn.execute(f"INSERT INTO steps ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                 (run_id, rank, step, t, *values.values()))
    conn.executemany("INSERT INTO layouts (run_id, rank, layout, params) VALUES (?, ?, ?, ?)",
                     [(run_id, rank, lay["layout"], json.dumps(lay["params"])) for lay in layouts])
    conn.executemany(f"INSERT INTO exchanges (run_id, rank, step, {', '.join(EXCHANGE_FIELDS)}) "
                     f"VALUES (?, ?, ?, {', '.join('?' * len(EXCHANGE_FIELDS))})",
                     [(run_id, rank, step, *(_column(k, ex.get(k) if k in CPU_TIMES else ex[k]) for k in EXCHANGE_FIELDS))
                      for ex in exchanges])


JSON_COLUMNS = ("payloads",)      # exchanges' columns stored as JSON text (exchanges_of reads them back)


def _column(key: str, value: Any) -> Any:
    return json.dumps(value, separators=(",", ":")) if key in JSON_COLUMNS and value is not None else value


# --- what a summary reads (results.summary) ---

def step_rows(conn: sqlite3.Connection, run_id: str) -> list[sqlite3.Row]:
    """Every rank's step rows of a run, by step then rank."""
    return conn.execute("SELECT * FROM steps WHERE run_id=? ORDER BY step, rank", (run_id,)).fetchall()


def node_rows(conn: sqlite3.Connection, run_id: str) -> list[sqlite3.Row]:
    return conn.execute("SELECT * FROM nodes WHERE run_id=? ORDER BY rank", (run_id,)).fetchall()


def calibrations_of(conn: sqlite3.Connection, run_id: str) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute("SELECT * FROM calibrations WHERE run_id=? ORDER BY t, src", (run_id,))]


def fault_rows(conn: sqlite3.Connection, run_id: str) -> list[sqlite3.Row]:
    return conn.execute("SELECT * FROM faults WHERE run_id=? ORDER BY idx", (run_id,)).fetchall()


def server_steps_of(conn: sqlite3.Connection, run_id: str, rank: int | None = None) -> list[dict[str, Any]]:
    """A run's parameter-server step rows (only server ``rank``'s, by step, when given)."""
    if rank is None:
        return [dict(r) for r in conn.execute("SELECT * FROM server_steps WHERE run_id=?", (run_id,))]
    return [dict(r) for r in conn.execute("SELECT * FROM server_steps WHERE run_id=? AND rank=? ORDER BY step",
                                          (run_id, rank))]


def tx_of(conn: sqlite3.Connection, run_id: str) -> list[dict[str, Any]]:
    """Each rank's interface bytes sent per step: rank, step, tx_bytes."""
    return [dict(r) for r in conn.execute("SELECT rank, step, tx_bytes FROM steps WHERE run_id=?", (run_id,))]


# --- sweeps, moving a run between stores, and the reads of the other rooms ---

def cell_status(conn: sqlite3.Connection, sweep: str, cell: str, repeat: int) -> str | None:
    """How sweep ``sweep`` left this cell: None (never started), running (its sweep died), ok,
    failed or interrupted."""
    row = conn.execute("SELECT status FROM sweep_cells WHERE sweep=? AND cell=? AND repeat=?",
                       (sweep, cell, repeat)).fetchone()
    return row["status"] if row else None


def mark_cell(conn: sqlite3.Connection, sweep: str, cell: str, repeat: int, status: str,
              run_id: str | None = None) -> None:
    with transaction(conn):
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
    """Add other hosts' rows (from ``export_rank``) to this store; rows it has already are kept.
    Rows from a newer gctestbed (a host with columns this store's schema lacks) keep the columns it
    has; the others are named in their run's environment (``columns_not_stored``) instead of the
    whole import failing at the run's end."""
    dropped: dict[str, set[str]] = {}
    with transaction(conn):
        for part in exported:
            for table in RANK_TABLES:
                have = _columns(conn, table)
                for row in part.get(table, []):
                    _insert_new(conn, table, row, have, dropped)
            for table in set(part) - set(RANK_TABLES):           # a table a newer host has and this store lacks
                for row in part[table]:
                    if "run_id" in row:
                        dropped.setdefault(row["run_id"], set()).add(f"{table}.*")
        _note_dropped(conn, dropped)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r["name"] for r in conn.execute(f"PRAGMA table_info({table})")}


def _insert_new(conn: sqlite3.Connection, table: str, row: dict, have: set[str], dropped: dict[str, set[str]]) -> None:
    """Add ``row`` to ``table`` (whose columns are ``have``) unless a row with its key is there
    already; the row's columns the table lacks are left out and added to ``dropped`` by run."""
    kept = {k: v for k, v in row.items() if k in have}
    if "run_id" not in kept:                # nothing this store can place: the whole row is named
        dropped.setdefault(row.get("run_id", "?"), set()).add(f"{table}.*")
        return
    conn.execute(f"INSERT OR IGNORE INTO {table} ({', '.join(kept)}) VALUES ({', '.join('?' * len(kept))})",
                 tuple(kept.values()))
    if len(kept) < len(row):
        dropped.setdefault(row["run_id"], set()).update(f"{table}.{k}" for k in row if k not in have)


def _note_dropped(conn: sqlite3.Connection, dropped: dict[str, set[str]]) -> None:
    """Name, in each run's environment, the columns (``table.*``: whole tables) its rows held that
    this store's schema lacks, beside those an earlier import named."""
    for run_id, columns in dropped.items():
        row = conn.execute("SELECT environment FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row:
            before = json.loads(row["environment"] or "{}").get("columns_not_stored", [])
            update_environment(conn, run_id, {"columns_not_stored": sorted(set(before) | columns)})


RUN_TABLES = ("runs", "evals", "calibrations", "faults") + RANK_TABLES     # every table a run's rows live in


def copy_run(src: sqlite3.Connection, dst: sqlite3.Connection, run_id: str) -> bool:
    """Copy every row of ``run_id`` from store ``src`` into ``dst`` (a host's store into a sweep's);
    rows ``dst`` has already are kept. False when ``src`` has no such run."""
    if src.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone() is None:
        return False
    dropped: dict[str, set[str]] = {}
    with transaction(dst):
        for table in RUN_TABLES:
            have = _columns(dst, table)
            for row in src.execute(f"SELECT * FROM {table} WHERE run_id=?", (run_id,)):
                _insert_new(dst, table, dict(row), have, dropped)
        _note_dropped(dst, dropped)
    return True


def spec_of(conn: sqlite3.Connection, run_id: str) -> str | None:
    """The stored spec (JSON) of run ``run_id`` exactly; None when this store has no such run."""
    row = conn.execute("SELECT spec FROM runs WHERE run_id=?", (run_id,)).fetchone()
    return row["spec"] if row else None


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
    """Every bucket exchange of a run, every rank's (``payloads`` decoded; None where not stored)."""
    rows = [dict(r) for r in conn.execute("SELECT * FROM exchanges WHERE run_id=? ORDER BY step, rank, seq", (run_id,))]
    for row in rows:
        for key in JSON_COLUMNS:
            row[key] = json.loads(row[key]) if row[key] is not None else None
    return rows


def layouts_of(conn: sqlite3.Connection, run_id: str) -> dict[tuple[int, int], list]:
    """(rank, layout) -> the bucket's parameters, [[name, shape], ...]."""
    return {(r["rank"], r["layout"]): json.loads(r["params"])
            for r in conn.execute("SELECT * FROM layouts WHERE run_id=?", (run_id,))}


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


def ranks_of(conn: sqlite3.Connection, run_id: str) -> set[int]:
    """The ranks whose node row the store holds for the run."""
    return {r["rank"] for r in conn.execute("SELECT rank FROM nodes WHERE run_id=?", (run_id,))}


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
