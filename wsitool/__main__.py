"""``python -m wsitool``: the command line, as the ``wsitool`` script runs it (same commands, exit codes)."""

from .cli import main

main()
