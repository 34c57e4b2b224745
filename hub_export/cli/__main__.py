"""``python -m hub_export.cli``: the ``hub-export`` command."""

from hub_export.cli.main import main

main()
