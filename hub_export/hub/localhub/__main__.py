"""``python -m hub_export.hub.localhub``: the ``hub-export hub`` commands on their own."""

from hub_export.hub.localhub.cli import app

app(prog_name="python -m hub_export.hub.localhub")
