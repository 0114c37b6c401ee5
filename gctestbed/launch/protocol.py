"""What the runner needs from a launcher: nodes up and down, workers started and killed, faults,
and the shaping described. netns and docker implement it (each owning a launch.network.Shaped,
neither inheriting the other); runner.run is the one lifecycle around it."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any, Protocol

from ..net.calibrate import PathResult


@dataclass
class Node:
    rank: int
    name: str
    address: str


class Launcher(Protocol):
    launcher: str                      # its name in the environment record

    def check_host(self) -> None:
        """Refuse early, before anything is created, when this host cannot run the launcher."""

    def up(self) -> list[Node]:
        """Start the nodes and build their shaped network."""

    def calibrate(self) -> list[PathResult]:
        """Measure every path of the network (net/calibrate.py)."""

    def spawn(self, node: Node, argv: list[str], log_path: str, extra_env: dict[str, str] | None = None) -> Any:
        """Start ``argv`` on ``node``; returns something with poll(), wait() and pid, like Popen."""

    def kill(self, proc: Any) -> None:
        """SIGKILL a worker and everything it started."""

    def fault(self, rank: int, kind: str, active: bool, pct: float = 0.0) -> None:
        """Start (``active``) or end a fault on node ``rank``'s cable."""

    def describe(self) -> dict:
        """How delay is made and the qdisc configuration in the kernel, with counters."""

    def final_counters(self) -> dict:
        """describe() plus the delay lines' counters; stops the delay lines."""

    def down(self) -> list[str]:
        """Remove everything the ledger holds; what could not be removed."""


def exit_text(code: int) -> str:
    """How a process ended, from its exit status as Popen gives it (negative: the signal)."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:                 # a real-time signal, which has no name
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
