"""Run the local hub: blocking (the CLI) or in a background thread (tests, demos)."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sqlite3
import sys
import threading
import time
from pathlib import Path

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from hub_export.errors import InputError
from hub_export.hub.localhub.server import DEFAULT_MAX_BODY, DEFAULT_MAX_LFS, create_app
from hub_export.hub.localhub.store import LocalHubStore

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7863
DEFAULT_MAX_BODY_MB = DEFAULT_MAX_BODY // 1024**2
DEFAULT_MAX_LFS_GB = DEFAULT_MAX_LFS // 1000**3

logger = logging.getLogger("hub_export.hub.localhub")


def default_root() -> Path:
    """``$HUB_EXPORT_HUB_ROOT``, else ``~/.cache/hub-export/localhub``."""
    env = os.environ.get("HUB_EXPORT_HUB_ROOT")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hub-export" / "localhub"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_host(host: str, allow_remote: bool) -> None:
    """Refuse to expose the hub beyond this machine unless asked to explicitly."""
    if not allow_remote and not is_loopback(host):
        raise InputError(
            f"Refusing to serve on '{host}': the local hub is reachable only from this machine by default."
            " Pass --allow-remote to listen on other interfaces."
        )


def _check_limits(max_body_mb: int, max_lfs_gb: int) -> None:
    if max_body_mb < 1 or max_lfs_gb < 1:
        raise InputError("--max-body-mb and --max-lfs-gb must be at least 1.")


def _bind(host: str, port: int) -> socket.socket:
    """Bind first, so port 0 yields a free port that we know before uvicorn starts."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise InputError(f"Cannot listen on {host}:{port}: {e.strerror or e}.") from e
    return sock


def _endpoint(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def sweep(root: str | Path) -> None:
    """Clear what crashes left behind (old upload temp files, unreferenced blobs) before serving."""
    try:
        result = LocalHubStore(root).gc()
    except (OSError, sqlite3.Error) as e:  # litter must never keep the hub from starting
        logger.warning("Could not sweep %s: %s", root, e)
        return
    if result.temp.count or result.blobs.count:
        logger.info("Start-up sweep: %s", result)


def _server(root: str | Path, sock: socket.socket, *, log: bool, max_body_mb: int, max_lfs_gb: int) -> uvicorn.Server:
    sweep(root)
    config = uvicorn.Config(
        create_app(root, max_body=max_body_mb * 1024**2, max_lfs=max_lfs_gb * 1000**3),
        log_config=LOGGING_CONFIG if log else None,
        access_log=False,  # our RequestLog writes a redacted line instead
        lifespan="off",
        timeout_graceful_shutdown=2,
    )
    return uvicorn.Server(config)


def serve(
    root: str | Path,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    allow_remote: bool = False,
    max_body_mb: int = DEFAULT_MAX_BODY_MB,
    max_lfs_gb: int = DEFAULT_MAX_LFS_GB,
) -> None:
    """Serve until interrupted. Prints the endpoint once listening."""
    check_host(host, allow_remote)
    _check_limits(max_body_mb, max_lfs_gb)
    sock = _bind(host, port)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    server = _server(root, sock, log=True, max_body_mb=max_body_mb, max_lfs_gb=max_lfs_gb)
    endpoint = _endpoint(sock)
    print(f"Local hub at {endpoint}  (root: {Path(root).expanduser()})", flush=True)
    print(f"Use it with: HF_ENDPOINT={endpoint} HF_HUB_DISABLE_XET=1", flush=True)
    server.run(sockets=[sock])


class LocalHub:
    """A hub running in a background thread. Use ``.endpoint``; call ``.stop()`` (or use ``with``)."""

    def __init__(self, root: Path, endpoint: str, server: uvicorn.Server, thread: threading.Thread):
        self.root = root
        self.endpoint = endpoint
        self._server = server
        self._thread = thread

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> LocalHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalHub(endpoint={self.endpoint!r}, root={str(self.root)!r})"


def serve_in_thread(
    root: str | Path,
    host: str = DEFAULT_HOST,
    port: int = 0,
    *,
    allow_remote: bool = False,
    timeout: float = 10.0,
    max_body_mb: int = DEFAULT_MAX_BODY_MB,
    max_lfs_gb: int = DEFAULT_MAX_LFS_GB,
) -> LocalHub:
    """Start a hub on ``root`` in a daemon thread (``port=0``: a free port); return once it accepts requests."""
    check_host(host, allow_remote)
    _check_limits(max_body_mb, max_lfs_gb)
    root = Path(root).expanduser()
    sock = _bind(host, port)
    endpoint = _endpoint(sock)
    server = _server(root, sock, log=False, max_body_mb=max_body_mb, max_lfs_gb=max_lfs_gb)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="localhub", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"The local hub on {endpoint} did not start within {timeout:.0f}s.")
        time.sleep(0.01)
    return LocalHub(root, endpoint, server, thread)
