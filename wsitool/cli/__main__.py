"""``python -m wsitool.cli``: the command line (floor 9)."""

from . import main

main()
