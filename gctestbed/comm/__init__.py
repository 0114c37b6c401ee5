"""How the workers of a run meet: ``--comm allreduce|ps|localsgd|diloco[:key=value,...]``.

``allreduce`` is the ring's collectives through DDP's hook (compress/hook.py); ``ps`` sends each
bucket to parameter servers that are nodes of the network (``ps.py`` the workers' side,
``server.py`` the servers' loop, ``wire.py`` the messages); ``localsgd`` and ``diloco`` take local
steps and average the model now and then (``local.py``). ``schemes.py`` parses the flag and says
which methods each scheme can carry.
"""

from .schemes import OPTIONS, check, resolve

__all__ = ["OPTIONS", "check", "resolve"]
