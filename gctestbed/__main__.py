"""``python -m gctestbed`` is the ``gctestbed`` command."""

from .cli import main

main()
