"""``python -m jobrun``: the same as the ``jobrun`` command."""

from jobrun._cli import main

main()
