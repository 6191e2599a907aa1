"""``python -m nightshift.cli``: the same command as ``nightshift``."""

from nightshift.cli import main

main()
