"""``python -m app``: the same as the ``seam`` command."""

from app.main import main

main()
