"""The ``hub-export`` command line: thin over the library, one module per verb (``cli/<verb>.py``), the Typer
app and what the verbs share in ``cli/common.py``, the entry point in ``cli/main.py``."""

from hub_export.cli.common import app
from hub_export.cli.main import main, mount_hub

__all__ = ["app", "main", "mount_hub"]
