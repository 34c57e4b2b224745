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
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.ray_nodes import LocalRay, free_port
from benchmarks.report import write_results

BIN = Path(sys.executable).parent


def _models(work: Path, layers: int) -> list[Path]:
    from transformers import LlamaConfig

    from benchmarks.models import smollm2_135m_config
    from hub_export.models.tiny import build_tiny_model

    shape = smollm2_135m_config().to_dict()
    shape.update(num_hidden_layers=layers, vocab_size=512)  # the demo tokenizer's vocabulary
    return [build_tiny_model(work / f"smollm2-width-{seed}", config=LlamaConfig(**shape), seed=seed) for seed in (0, 1)]


def _plan(path: Path, models: list[Path], suffix: str, qmodes: list[str]) -> Path:
    lines = [
        f"defaults: {{qmodes: [{', '.join(qmodes)}], qembedding: 8w, max_seq_len: 256, quality_tokens: 256}}",
        "jobs:",
    ]
    lines += [f"  - {{source: {model}, repo: bench/{model.name}-{suffix}}}" for model in models]
    path.write_text("\n".join(lines) + "\n")
    return path


def _batch(plan: Path, address: str, env: dict) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [str(BIN / "hub-export"), "batch", str(plan), "--ray-address", address], capture_output=True, text=True, env=env
    )
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
    env = {**os.environ, "HF_HOME": str(work / "hf"), "HF_HUB_DISABLE_XET": "1", "COLUMNS": "200"}
    hub = None
    try:
        with LocalRay(env) as cluster:
            from hub_export.hub.localhub.store import add_user

            env = cluster.env
            hub_port = free_port()
            env["HF_TOKEN"] = add_user(work / "hub", "bench")
            env["HF_ENDPOINT"] = f"http://127.0.0.1:{hub_port}"
            hub = subprocess.Popen(
                [str(BIN / "hub-export"), "hub", "serve", "--root", str(work / "hub"), "--port", str(hub_port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            models = _models(work, args.layers)
            cluster.add_node()
            one = _batch(_plan(work / "one.yaml", models, "one-node", qmodes), cluster.address, env)
            cluster.add_node()
            two = _batch(_plan(work / "two.yaml", models, "two-nodes", qmodes), cluster.address, env)
    finally:
        if hub is not None:
            hub.terminate()
            try:
                hub.wait(timeout=30)
            except subprocess.TimeoutExpired:
                hub.kill()  # as the code before LocalRay did for every process it started
        shutil.rmtree(work, ignore_errors=True)

    from hub_export.pipeline.manifest import machine_description

    result = {
        "plan": f"2 models (SmolLM2-135M width, {args.layers} layers, random weights) x {', '.join(qmodes)}",
        "one_node_seconds": round(one, 1),
        "two_nodes_seconds": round(two, 1),
        "speedup": round(one / two, 2),
        "machine": machine_description(),
        "command": "python -m benchmarks.cluster_speedup",
    }
    write_results(
        "cluster-speedup",
        result,
        f"`hub-export batch` of {result['plan']}, 256-token context, verified, pushed to a local Hub; "
        f"Ray nodes of 1 CPU each on one machine ({result['machine']}); `{result['command']}`:\n\n"
        "| cluster | batch wall time | speed-up |\n|---|---|---|\n"
        f"| 1 node | {one:.0f} s | 1.00x |\n| 2 nodes | {two:.0f} s | {one / two:.2f}x |\n",
    )


if __name__ == "__main__":
    main()
