"""Ray nodes started on this machine, for the cluster tests and ``make bench-cluster``.

    with LocalRay(env) as ray_nodes:
        ray_nodes.add_node()          # the head
        ray_nodes.add_node()          # a second node joins
        subprocess.run([... "--ray-address", ray_nodes.address], env=ray_nodes.env)

Each node is a ``ray start --block`` process with one CPU. The cluster gets its own
authentication token (as Ray sets one up by default): every node and every driver must
present it, so drivers take their environment from ``env``.
"""

from __future__ import annotations

import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = Path(sys.executable).parent / "ray"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LocalRay:
    """A Ray cluster of one-CPU nodes on this machine; stopped, with its files, on exit."""

    def __init__(self, env: dict[str, str]):
        self.temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
        token = Path(self.temp) / "auth_token"
        token.write_text(secrets.token_hex(32))
        self.env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0"}
        self.address = f"127.0.0.1:{free_port()}"
        self.nodes: list[subprocess.Popen] = []

    def add_node(self, seconds: float = 90) -> None:
        """Start a node (the first is the head) and wait until the cluster counts it."""
        common = ["--block", "--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
        if self.nodes:
            command = [str(RAY), "start", f"--address={self.address}", *common]
        else:
            command = [
                str(RAY),
                "start",
                "--head",
                f"--port={self.address.rsplit(':', 1)[1]}",
                "--include-dashboard=false",
                f"--temp-dir={self.temp}",
                *common,
            ]
        node = subprocess.Popen(command, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.nodes.append(node)
        deadline = time.monotonic() + seconds
        while self.alive_nodes() < len(self.nodes):
            if time.monotonic() > deadline or node.poll() is not None:
                raise RuntimeError(f"Ray node {len(self.nodes)} did not join within {seconds:.0f} s")
            time.sleep(1)

    def alive_nodes(self) -> int:
        code = (
            f"import ray; ray.init(address={self.address!r}, log_to_driver=False); "
            "print(sum(n['Alive'] for n in ray.nodes()))"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=self.env)
        return int(done.stdout.split()[-1]) if done.returncode == 0 and done.stdout.strip() else 0

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.send_signal(signal.SIGTERM)
        for node in reversed(self.nodes):
            try:
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.kill()
        self.nodes.clear()
        shutil.rmtree(self.temp, ignore_errors=True)

    def __enter__(self) -> LocalRay:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
