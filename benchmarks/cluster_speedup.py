"""The speed-up of a batch on two Ray nodes against one, measured on this machine.

    python -m benchmarks.cluster_speedup            # make bench-cluster

A local Hub, two random-weight models of SmolLM2-135M's width (6 layers, so a run
takes minutes, not hours), and one plan: both models x 8da4w and 8da8w. The plan runs
through ``hub-export batch --ray-address`` first on a Ray cluster of one node with one
CPU, then again (into other repos) after a second one-CPU node has joined. Both nodes
run on this machine, so the figure is what a second machine's worth of CPUs buys when
the driver, the Hub and the nodes share the machine. Writes
``benchmarks/results/cluster-speedup.{json,md}`` (the README quotes the Markdown).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import write_results

BIN = Path(sys.executable).parent


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


ENV: dict[str, str] = {}


def _nodes(address: str) -> int:
    code = f"import ray; ray.init(address={address!r}, log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=ENV)
    return int(done.stdout.split()[-1]) if done.returncode == 0 and done.stdout.strip() else 0


def _wait(condition, what: str, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not happen within {seconds:.0f} s")
        time.sleep(1)


def _models(work: Path, layers: int) -> list[Path]:
    from transformers import LlamaConfig

    from benchmarks.models import smollm2_135m_config
    from hub_export.demo import build_tiny_model

    shape = smollm2_135m_config().to_dict()
    shape.update(num_hidden_layers=layers, vocab_size=512)  # the demo tokenizer's vocabulary
    return [build_tiny_model(work / f"smollm2-width-{seed}", config=LlamaConfig(**shape), seed=seed)
            for seed in (0, 1)]


def _plan(path: Path, models: list[Path], suffix: str, qmodes: list[str]) -> Path:
    lines = [f"defaults: {{qmodes: [{', '.join(qmodes)}], qembedding: 8w, max_seq_len: 256, quality_tokens: 256}}",
             "jobs:"]
    lines += [f"  - {{source: {model}, repo: bench/{model.name}-{suffix}}}" for model in models]
    path.write_text("\n".join(lines) + "\n")
    return path


def _batch(plan: Path, address: str, env: dict) -> float:
    started = time.perf_counter()
    done = subprocess.run([str(BIN / "hub-export"), "batch", str(plan), "--ray-address", address],
                          capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the batch failed:\n{done.stderr[-3000:]}")
    print(done.stdout.strip().splitlines()[-1], f"({seconds:.0f} s)", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--qmode", action="append", dest="qmodes")
    args = parser.parse_args()
    qmodes = args.qmodes or ["8da4w", "8da8w"]

    work = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    ray_temp = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # Ray's socket paths must stay short
    token_file = Path(ray_temp) / "auth_token"  # the cluster's own token: nodes and drivers present it
    token_file.write_text(secrets.token_hex(32))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HOME": str(work / "hf"), "HF_HUB_DISABLE_XET": "1",
           "COLUMNS": "200", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    ENV.update(env)
    processes: list[subprocess.Popen] = []
    try:
        from hub_export.localhub.store import add_user

        hub_port = _port()
        env["HF_TOKEN"] = add_user(work / "hub", "bench")
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{hub_port}"
        processes.append(subprocess.Popen([str(BIN / "hub-export"), "hub", "serve", "--root", str(work / "hub"),
                                           "--port", str(hub_port)], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        models = _models(work, args.layers)

        port = _port()
        address = f"127.0.0.1:{port}"
        common = ["--block", "--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
        processes.append(subprocess.Popen([str(BIN / "ray"), "start", "--head", f"--port={port}",
                                           "--include-dashboard=false", f"--temp-dir={ray_temp}", *common], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        _wait(lambda: _nodes(address) >= 1, "the Ray head starting")
        one = _batch(_plan(work / "one.yaml", models, "one-node", qmodes), address, env)
        processes.append(subprocess.Popen([str(BIN / "ray"), "start", f"--address={address}", *common], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        _wait(lambda: _nodes(address) >= 2, "the second node joining")
        two = _batch(_plan(work / "two.yaml", models, "two-nodes", qmodes), address, env)
    finally:
        for process in reversed(processes):
            process.send_signal(signal.SIGTERM)
        for process in reversed(processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_temp, ignore_errors=True)

    from hub_export.manifest import machine_description

    result = {
        "plan": f"2 models (SmolLM2-135M width, {args.layers} layers, random weights) x {', '.join(qmodes)}",
        "one_node_seconds": round(one, 1),
        "two_nodes_seconds": round(two, 1),
        "speedup": round(one / two, 2),
        "machine": machine_description(),
        "command": "python -m benchmarks.cluster_speedup",
    }
    write_results("cluster-speedup", result,
        f"`hub-export batch` of {result['plan']}, 256-token context, verified, pushed to a local Hub; "
        f"Ray nodes of 1 CPU each on one machine ({result['machine']}); `{result['command']}`:\n\n"
        "| cluster | batch wall time | speed-up |\n|---|---|---|\n"
        f"| 1 node | {one:.0f} s | 1.00x |\n| 2 nodes | {two:.0f} s | {one / two:.2f}x |\n",
    )


if __name__ == "__main__":
    main()
