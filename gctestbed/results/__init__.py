"""The results store: one SQLite file per results directory, shared by the runner and all workers.

Split by job:

- ``store``: the file, its schema and migrations, opening it, and every SQL statement (the one
  owner of the store's SQL; the rest of the package and every other room call its functions);
- ``recorder``: the Recorder, one run's writes, each its own transaction, so a node that dies loses
  nothing it had recorded;
- ``summary``: the typed RunSummary and the figures computed from a run's rows (contracts, faults).

Callers keep using ``from gctestbed import results; results.X``: every name they use is here.
Analysis reads only this store, never logs, so a report can be rebuilt at any time.
"""

from __future__ import annotations

import sys
import types

from . import store
from .recorder import Recorder
from .store import (BUSY_TIMEOUT_S, CALIBRATION_FIELDS, DB_NAME, EXCHANGE_FIELDS, MIN_FREE_BYTES, RANK_TABLES,
                    RUN_TABLES, SCHEMA, SCHEMA_VERSION, SERVER_STEP_FIELDS, STEP_FIELDS, StoreError, cell_status,
                    check_writable, connect, copy_run, curve, db_path, evaluations, exchanges_of, export_rank,
                    find_run, has_calibration, import_rows, last_step, latest_run_since, layouts_of, list_runs,
                    losses, mark_cell, node_rows, ok_run_ids, phases, ranks_of, run_status, spec_of, step_rows, steps_per_rank, store_error, sweep_names,
                    sweep_runs)
from .summary import RunSummary, contract_check, emulated, emulated_s, fault_effect, summarize

__all__ = ["BUSY_TIMEOUT_S", "CALIBRATION_FIELDS", "DB_NAME", "EXCHANGE_FIELDS", "MIN_FREE_BYTES", "RANK_TABLES",
           "RUN_TABLES", "SCHEMA", "SCHEMA_VERSION", "SERVER_STEP_FIELDS", "STEP_FIELDS", "Recorder", "RunSummary",
           "StoreError", "cell_status", "check_writable", "connect", "contract_check", "copy_run", "curve", "db_path",
           "emulated", "emulated_s", "evaluations", "exchanges_of", "export_rank", "fault_effect", "find_run", "has_calibration", "import_rows",
           "last_step", "latest_run_since", "layouts_of", "list_runs", "losses", "mark_cell", "node_rows", "ok_run_ids", "phases",
           "ranks_of", "run_status", "spec_of", "step_rows", "steps_per_rank", "store", "store_error", "summarize", "sweep_names", "sweep_runs"]

_TUNABLES = ("BUSY_TIMEOUT_S", "MIN_FREE_BYTES")     # read by results.store when it opens a store


class _Package(types.ModuleType):
    """Setting a tunable on the package (``results.BUSY_TIMEOUT_S = 1.0``, as a test does) sets it
    in results.store, where it is read, so the name means one value wherever it is looked up."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _TUNABLES:
            setattr(store, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
