"""One run's writes: the Recorder each process (the runner, every worker and server) holds.

It owns the transaction around each write and turns any SQLite failure into one StoreError
sentence; the statements themselves are the store's (results.store), so each step a node records
is its own transaction and a node that dies loses nothing it had recorded.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from typing import Any, Iterable, Iterator

from ..spec import RunSpec
from . import store
from .store import SERVER_STEP_FIELDS, STEP_FIELDS


class Recorder:
    """Writes one run's rows. The runner owns the run row; each worker writes its own steps."""

    def __init__(self, results_dir: str, run_id: str):
        self.conn = store.connect(results_dir)
        self.run_id = run_id
        self.path = store.db_path(results_dir)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One transaction; any SQLite failure becomes one StoreError sentence (and is rolled back)."""
        try:
            with store.transaction(self.conn):
                yield self.conn
        except sqlite3.Error as e:
            raise store.store_error(self.path, e) from None

    def close(self) -> None:
        self.conn.close()

    def start_run(self, spec: RunSpec, environment: dict) -> None:
        with self._writing():
            store.insert_run(self.conn, self.run_id, time.time(), spec.to_json(), environment)

    def update_environment(self, **items: Any) -> None:
        """Add ``items`` to the run's environment record (a key given again is replaced)."""
        with self._writing():
            store.update_environment(self.conn, self.run_id, items)

    def finish_run(self, status: str, error: str | None = None) -> None:
        with self._writing():
            store.finish_run(self.conn, self.run_id, status, error, time.time())

    def node(self, rank: int, **fields: Any) -> None:
        """Insert or update the row of node ``rank`` (name, address, exit_code, param_sha256)."""
        with self._writing():
            store.set_node(self.conn, self.run_id, rank, fields)

    def evaluation(self, step: int, loss: float | None, accuracy: float | None, samples: int | None) -> None:
        """The held-out figures after ``step`` steps (a NaN loss is kept as NULL, as in steps)."""
        with self._writing():
            store.insert_evaluation(self.conn, self.run_id, step, loss, accuracy, samples)

    def calibration(self, path: dict[str, Any]) -> None:
        """Store one measured path (net.calibrate.PathResult.to_dict())."""
        with self._writing():
            store.insert_calibration(self.conn, self.run_id, time.time(), path)

    def fault(self, idx: int, kind: str, node: int, pct: float, **times: float) -> None:
        """Record when fault ``idx`` of the run started or ended (``started=``/``ended=`` wall times)."""
        with self._writing():
            store.set_fault(self.conn, self.run_id, idx, kind, node, pct, times)

    def server_step(self, rank: int, step: int, **values: Any) -> None:
        """Commit one parameter server's share of one step (SERVER_STEP_FIELDS)."""
        if set(values) != set(SERVER_STEP_FIELDS):
            raise KeyError(sorted(set(values) ^ set(SERVER_STEP_FIELDS)))
        with self._writing():
            store.insert_server_step(self.conn, self.run_id, rank, step, time.time(), values)

    def step(self, rank: int, step: int, exchanges: Iterable[dict] = (), layouts: Iterable[dict] = (),
             **values: Any) -> None:
        """Commit one step of one rank, with its buckets' exchanges and the bucket layouts first seen
        in it (compress.hook's take_step_stats); unknown fields are an error, missing ones are NULL."""
        unknown = set(values) - set(STEP_FIELDS)
        if unknown:
            raise KeyError(sorted(unknown))
        with self._writing():
            store.insert_step(self.conn, self.run_id, rank, step, time.time(), values, exchanges, layouts)
