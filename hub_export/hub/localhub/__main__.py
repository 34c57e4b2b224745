"""``python -m hub_export.hub.localhub``: the ``hub-export hub`` commands on their own."""

from .cli import app

app(prog_name="python -m hub_export.hub.localhub")
