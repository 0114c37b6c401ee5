"""gctestbed: does gradient compression speed up data-parallel training on this network, and below which bandwidth?"""

import os

# Compressors allocate gradient-sized tensors every step; backed by transparent huge pages (where the
# kernel offers them on request), their first touch takes far fewer page faults. torch reads this
# once, at its first allocation, so it is set before torch is used.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"


def install(model):
    """For a user's own DDP script run by ``gctestbed run ... -- python SCRIPT``: install the run's
    compressor on the DDP ``model`` and record every step (does nothing outside gctestbed)."""
    from .userscript import install as _install
    return _install(model)
