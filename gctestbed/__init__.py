"""gctestbed: does gradient compression speed up training on this network, and below which bandwidth?"""

import os

# Compressors allocate gradient-sized tensors every step; backed by transparent huge pages (where the
# kernel offers them on request), their first touch takes far fewer page faults. torch reads this
# once, at its first allocation, so it is set before torch is used.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"
