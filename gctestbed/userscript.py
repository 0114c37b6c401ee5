"""What a user's own DDP training script calls to run under gctestbed: ``gctestbed.install(model)``.

``gctestbed run [flags] -- python train.py ...`` starts the user's program on every node with
the node environment (RANK, WORLD_SIZE, MASTER_ADDR, ... as torchrun gives) and the run's spec in
``GCTESTBED_SPEC``. One call after wrapping the model in DDP installs the chosen compressor as its
communication hook and records every step in the run's store; the script is otherwise unchanged,
and outside gctestbed the call does nothing, so the same script runs anywhere.

A step is taken to begin at each forward of the DDP model: the time between two forwards is the
step time, and the hook's counters (payload, bytes, encode/decode/communication time) are
recorded with it. The last step is recorded when the program exits.
"""

from __future__ import annotations

import atexit
import os

from torch.nn.parallel import DistributedDataParallel

from . import compress
from .compress import hook
from .results import Recorder
from .spec import SPEC_ENV, RunSpec
from .timing import now
from .worker import ByteWindow, buffer_record, param_digest


class StepRecorder:
    """Closes a step at every forward of the model, and the last one at exit."""

    def __init__(self, model: DistributedDataParallel, spec: RunSpec, comm: hook.HookState, ifname: str):
        self.model, self.spec, self.comm, self.ifname = model, spec, comm, ifname
        self.rank = comm.rank
        self.recorder = Recorder(spec.results_dir, spec.run_id)
        self.step, self.started, self.window = -1, None, None
        model.register_forward_pre_hook(self._forward)
        atexit.register(self.close)

    def _forward(self, module, inputs) -> None:
        self._record()
        self.step += 1
        self.started = now()
        self.window = self.window or ByteWindow(self.ifname)     # the first step's opens at its forward

    def _record(self) -> None:
        """Store the step begun at the last forward."""
        if self.started is None:
            return
        tx, rx = self.window.take()
        self.recorder.step(self.rank, self.step, step_s=now() - self.started, tx_bytes=tx, rx_bytes=rx,
                           **self.comm.take_step_stats())
        self.started = None

    def close(self) -> None:
        if self.recorder is None:
            return
        self._record()
        self.recorder.node(self.rank, param_sha256=param_digest(self.model), buffers=buffer_record(self.model))
        self.recorder.close()
        self.recorder = None


def install(model: DistributedDataParallel) -> hook.HookState | None:
    """Install the run's compressor on ``model`` and record its steps; None (and nothing done)
    when the program was not started by ``gctestbed run ... -- CMD``."""
    path = os.environ.get(SPEC_ENV)
    if not path:
        return None
    if not isinstance(model, DistributedDataParallel):
        raise TypeError("gctestbed.install needs the DDP-wrapped model: install(DistributedDataParallel(model))")
    with open(path) as f:
        spec = RunSpec.from_json(f.read())
    compressor = compress.for_run(spec)
    comm = hook.install(model, compressor)
    StepRecorder(model, spec, comm, os.environ.get("GCTESTBED_IFNAME", "eth0"))
    return comm
