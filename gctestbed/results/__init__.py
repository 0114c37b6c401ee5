"""The results store (moved from results.py into results/store.py; split by job in the next commit)."""
from .store import *  # noqa: F401,F403
from .store import _cpu, _ps_bottleneck  # noqa: F401
