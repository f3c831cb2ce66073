"""``python -m xinda.cli``: the ``xinda`` command."""

from xinda.cli import main

main()
