"""SIGINT and SIGTERM as an exception, raised where a run's teardown can catch it.

A run (runner.run, a sweep's cell, the command line's early start) wraps its work in
``signals_raise``: a signal there becomes Interrupted in the main thread, so the ``finally`` that
tears the cluster down runs. Where raising would be lost or would leave something unrecorded (an
import, whose C init may swallow it; a ``signals_held`` section, whose process is not in its
ledger yet) the signal is held back and sent again shortly after. Teardown itself runs under
``signals_ignored``, so a second Ctrl-C cannot cut it short.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

RESIGNAL_S = 0.05        # a signal held back (an import, signals_held) is sent again this much later
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """The run was stopped by SIGINT or SIGTERM; the cluster has been torn down. ``run_id``: the
    run's, once it had one. A BaseException, as KeyboardInterrupt is: a library's ``except
    Exception`` (in an import, in a build) must not swallow it."""

    run_id: str | None = None


class _State:
    """What the handler keeps between signals: changed in the main thread (the handler, the block's
    end, signals_held), ``resends`` under ``lock``, which a re-send holds from its check to its
    kill, so a signal taken (raised for, or at the block's end) is never sent again after."""

    def __init__(self):
        self.resends: dict[int, threading.Timer] = {}   # a signal held back -> the timer that sends it again
        self.lock = threading.RLock()                   # re-entrant: the handler may run while the main thread holds it
        self.held = 0                                   # signals_held sections open
        self.ending: list[int] | None = None            # while a signals_raise block ends: the signals that came


_state = _State()


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM become Interrupted, so teardown runs in the finally of the caller.

    Only in this process: pyroute2 forks helpers (to open sockets inside namespaces) and
    subprocess forks before exec; a signal there must end that child the default way, not unwind
    a copy of this stack through our teardown. Nor inside an import, nor in ``signals_held``: an
    extension's C init can swallow what is raised there (torch._C's import of numpy did, and a
    run stopped while torch imported went ahead, 4 of 25 timed signals), so the signal is sent
    again RESIGNAL_S later, until it lands outside one. One still waiting when the block ends
    raises Interrupted there, in the caller's try (not later, to the default action, which would
    skip its teardown); where the block ends with an exception, that one goes on.
    """
    owner = os.getpid()

    def handler(signum, frame):
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if _state.ending is not None:           # the block is ending: it raises for what came
            _state.ending.append(signum)
            return
        if _state.held or _importing(frame):
            with _state.lock:
                if (prior := _state.resends.pop(signum, None)) is not None:
                    prior.cancel()
                resend = _state.resends[signum] = threading.Timer(RESIGNAL_S, _resend)
                resend.args, resend.daemon = (owner, signum, resend), True
                resend.start()
            return
        raise_deferred(signum)
    old = {s: signal.signal(s, handler) for s in SIGNALS}
    ended_well = False
    try:
        yield
        ended_well = True
    finally:
        outer, _state.ending = _state.ending, []     # from here the handler only notes what comes
        waiting = _take_resends(join=True)
        for s, h in old.items():
            signal.signal(s, h)
        waiting += _state.ending
        _state.ending = outer
    if ended_well and waiting and os.getpid() == owner:
        raise Interrupted(signal.Signals(waiting[0]).name)


def _resend(owner: int, signum: int, me: threading.Timer) -> None:
    with _state.lock:                          # taken meanwhile: not sent (sent: the handler has it before the take)
        if _state.resends.get(signum) is me:   # not superseded by a later one, nor taken
            os.kill(owner, signum)


def _take_resends(join: bool = False) -> list[int]:
    """The signals held back, their re-sends cancelled (and, ``join``, finished where running)."""
    with _state.lock:
        timers = list(_state.resends.items())
        _state.resends.clear()
    for _, resend in timers:
        resend.cancel()
        if join and resend.is_alive():
            resend.join(1.0)
    return [signum for signum, _ in timers]


def waiting() -> list[int]:
    """The signals held back and not yet sent again (none once a run has raised for them)."""
    return list(_state.resends)


def raise_deferred(signum: int | None = None) -> None:
    """Raise Interrupted for ``signum``, or for a signal held back and waiting to be sent again
    (none waiting: return), so that a run stopped while torch imported (its flags read meanwhile)
    stops before it starts."""
    taken = _take_resends()
    if signum is None and not taken:
        return
    raise Interrupted(signal.Signals(signum or taken[0]).name)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Under ``signals_raise``, SIGINT and SIGTERM wait for the end of this section, where what
    it made is not in its ledger yet (a process started, its pid not written)."""
    _state.held += 1
    try:
        yield
    finally:
        _state.held -= 1
    if not _state.held:
        raise_deferred()


def _importing(frame) -> bool:
    """Whether ``frame`` runs inside an import (under importlib's frames)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """A second Ctrl-C must not cut teardown short."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
