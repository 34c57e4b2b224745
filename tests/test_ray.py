"""Exports on a Ray cluster: a head and a second node started as separate processes on 127.0.0.1.

Each node offers one CPU, so a batch of two models x two qmodes has to spread over both.
The tests check what a cluster user relies on: the files are the local engine's, a
killed worker is retried, Ctrl-C leaves no task running, every repo gets one commit.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.ray_nodes import LocalRay
from hub_export.hub.localhub.pytest_plugin import LocalHubFixture
from hub_export.hub.pull import list_variants
from hub_export.models.tiny import build_tiny_model
from hub_export.pipeline.manifest import Manifest, sha256_file

pytestmark = pytest.mark.cluster  # make test-cluster (CI runs it): a real two-node cluster, about 8 minutes

HUB_EXPORT = Path(sys.executable).parent / "hub-export"
TASK_TITLE = b"ray::hub-export "  # Ray titles a worker by the task it runs: "hub-export 8da4w SOURCE", "hub-export prepare SOURCE"


def _task_processes() -> dict[int, bytes]:
    """Ray worker processes running one of our tasks, by their titles."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            title = cmdline.read_bytes()
        except OSError:
            continue
        if title.startswith(TASK_TITLE):
            found[int(cmdline.parent.name)] = title.split(b"\0")[0]
    return found


@pytest.fixture(scope="module")
def ray_cluster(hf_isolated_env) -> str:
    """``host:port`` of a two-node Ray cluster (1 CPU each), stopped afterwards."""
    with LocalRay(dict(os.environ)) as cluster:
        # The CLI runs (drivers) inherit this process's environment: the cluster's token with it.
        settings = pytest.MonkeyPatch()
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED"):
            settings.setenv(name, cluster.env[name])
        try:
            cluster.add_node()
            cluster.add_node()
            yield cluster.address
        finally:
            settings.undo()


@pytest.fixture(scope="module")
def second_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("ray-models") / "tiny-two", seed=1)


# Starts the command with Ctrl-C at its default, as in a terminal: a test run started in the
# background by a non-interactive shell inherits SIGINT ignored, and so would the command.
_INTERACTIVE = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
)


def _batch(hub: LocalHubFixture, plan: Path, address: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "COLUMNS": "300", "HF_TOKEN": hub.alice_token, "RAY_USAGE_STATS_ENABLED": "0"}
    command = [str(HUB_EXPORT), "batch", str(plan), "--ray-address", address, "--endpoint", hub.endpoint, *extra]
    return subprocess.Popen(
        [sys.executable, "-c", _INTERACTIVE, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_a_batch_spreads_over_two_nodes_survives_a_killed_worker_and_matches_the_local_files(
    ray_cluster, local_hub: LocalHubFixture, tiny_model: Path, second_model: Path, exported_multi: Path, tmp_path
):
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "defaults: {qmodes: [8da4w, fp32], qembedding: 8w, max_seq_len: 64, quality_tokens: 128}\n"
        "jobs:\n"
        f"  - {{source: {tiny_model}, repo: alice/tiny-one-ExecuTorch}}\n"
        f"  - {{source: {second_model}, repo: alice/tiny-two-ExecuTorch}}\n"
    )
    run = _batch(local_hub, plan, ray_cluster, "--retries", "1")
    # What the out-of-memory killer does to a worker, twice: one build killed the moment it starts
    # (before its first message: only Ray knows it was a retry), another once it has been building
    # a few seconds. Each is retried once and counted once.
    killed: dict[bytes, int] = {}
    deadline = time.monotonic() + 400
    first_seen: dict[int, float] = {}
    busiest, crowded, previous = 0, [], {}
    while run.poll() is None and time.monotonic() < deadline:
        running = _task_processes()
        busiest = max(busiest, len(running))
        if len(running) > 2 and running == previous:  # twice in a row: not a finishing task's last moment
            crowded.append(running)
        previous = running
        for pid, title in running.items():
            seen_for = time.monotonic() - first_seen.setdefault(pid, time.monotonic())
            wait = 0 if not killed else 4
            if (
                len(killed) < 2
                and title not in killed
                and not title.startswith(TASK_TITLE + b"prepare")
                and seen_for >= wait
            ):
                os.kill(pid, signal.SIGKILL)
                killed[title] = pid
                break
        time.sleep(0.3)
    out, err = run.communicate(timeout=max(1, deadline - time.monotonic()))
    assert len(killed) == 2, f"build tasks killed: {killed}"
    assert run.returncode == 0, err[-3000:]
    assert "2 job(s): 2 pushed, 2 variant build(s) retried after a worker died" in out
    assert err.count("retry 1 of 1") == 2, err[-3000:]
    nodes = set(re.findall(r"building (?:again )?on node (\w+)", err))
    assert len(nodes) == 2, f"the builds ran on {nodes}"
    assert busiest >= 2 and not crowded, crowded  # one task per CPU: both nodes busy, neither running two

    for repo in ("alice/tiny-one-ExecuTorch", "alice/tiny-two-ExecuTorch"):
        manifest = list_variants(repo, endpoint=local_hub.endpoint)
        assert [v.qmode for v in manifest.variants] == ["8da4w", "fp32"]
        assert all(v.verification.passed for v in manifest.variants)
        commits = local_hub.api(local_hub.alice_token).list_repo_commits(repo)
        assert sum("model-" in c.title or "variant" in c.title.lower() for c in commits) == 1, [
            c.title for c in commits
        ]
    # Byte-identical to the local engine's files (built in local worker processes by the session fixture).
    local = {v.qmode: v.sha256 for v in Manifest.read(exported_multi).variants}
    remote = {
        v.qmode: v.sha256 for v in list_variants("alice/tiny-one-ExecuTorch", endpoint=local_hub.endpoint).variants
    }
    assert remote == local

    # The same plan again: every repo already holds its variants built the same way.
    again = _batch(local_hub, plan, ray_cluster)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err[-3000:]
    assert "2 job(s): 2 up to date" in out
    assert "building on node" not in err


def test_ctrl_c_cancels_the_running_tasks_and_pushes_nothing(
    ray_cluster, local_hub: LocalHubFixture, second_model: Path, tmp_path
):
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"jobs: [{{source: {second_model}, repo: alice/tiny-cancelled, qmodes: [8da8w], max_seq_len: 64}}]\n"
    )
    run = _batch(local_hub, plan, ray_cluster)
    deadline = time.monotonic() + 120
    while not _task_processes() and time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()[1][-3000:]
        time.sleep(0.2)
    assert _task_processes(), "no task started"
    time.sleep(1)
    # How the driver treats SIGINT (blocked, ignored, caught), for the failure message.
    masks = [line for line in Path(f"/proc/{run.pid}/status").read_text().splitlines() if line.startswith("Sig")]
    run.send_signal(signal.SIGINT)
    try:
        _, err = run.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        run.kill()
        pytest.fail(
            f"still running 60 s after Ctrl-C ({'; '.join(masks)}); its log ends: " + run.communicate()[1][-3000:]
        )
    assert run.returncode == 130, err[-3000:]
    assert "Interrupted." in err and "│ cancelled │" in err, err
    deadline = time.monotonic() + 15
    while _task_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _task_processes() == {}, "a task outlived the Ctrl-C"
    assert not local_hub.api(local_hub.alice_token).repo_exists("alice/tiny-cancelled")


def test_a_node_without_the_prepared_folder_downloads_the_same_revision_through_its_hub_cache(
    local_hub: LocalHubFixture, tiny_model: Path, tmp_path
):
    from hub_export.options import ExportOptions
    from hub_export.pipeline.prepare import SourceRequest, resolve_source, source_on_this_node

    api = local_hub.api(local_hub.alice_token)
    api.create_repo("alice/tiny-ray-source")
    api.upload_folder(folder_path=str(tiny_model), repo_id="alice/tiny-ray-source")
    request = SourceRequest(
        "alice/tiny-ray-source",
        ExportOptions(),
        local_hub.alice_token,
        local_hub.endpoint,
        cache_dir=tmp_path / "driver-cache",
    )
    prepared_src = resolve_source(request)
    api.upload_file(path_or_fileobj=b"moved on", path_in_repo="NOTES.md", repo_id="alice/tiny-ray-source")

    elsewhere = SourceRequest(
        request.source, request.options, request.token, request.endpoint, cache_dir=tmp_path / "node-cache"
    )
    gone = type(prepared_src)(
        tmp_path / "not-on-this-node", prepared_src.name, prepared_src.revision, False, prepared_src.config
    )
    on_node = source_on_this_node(gone, elsewhere)
    assert on_node.revision == prepared_src.revision  # the prepared commit, not the branch's new head
    assert on_node.path.is_relative_to(tmp_path / "node-cache")
    assert sha256_file(on_node.path / "model.safetensors") == sha256_file(prepared_src.path / "model.safetensors")
    assert source_on_this_node(prepared_src, elsewhere) is prepared_src  # readable here: no download


def test_the_space_hands_its_export_to_the_cluster_and_still_streams_its_log(
    ray_cluster, local_hub: LocalHubFixture, second_model: Path, monkeypatch
):
    from test_space import space_app

    monkeypatch.setenv("HUB_EXPORT_RAY_ADDRESS", ray_cluster)
    monkeypatch.setenv("HUB_EXPORT_SPACE_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", local_hub.endpoint)
    settings = space_app.settings_from_env()
    assert settings.ray_address == ray_cluster
    jobs = space_app.Jobs(settings)
    engine = jobs.engine()
    assert engine.name == "ray" and jobs.engine() is engine  # connected once, shared by the jobs

    updates = list(
        jobs.export(
            str(second_model),
            {"qmodes": ["fp32"], "max_seq_len": 64},
            "alice/tiny-space-ray",
            False,
            local_hub.alice_token,
            None,
            progress=lambda *args, **kwargs: None,
        )
    )
    status, log_text, link, table, card, repo_id = updates[-1]
    assert repo_id == "alice/tiny-space-ray" and "model-fp32.pte" in set(table["file"])
    assert len(updates) > 5  # the log streamed while the cluster worked
    where = re.findall(r"building on node \w+ \([^)]*pid (\d+)\)", log_text)
    assert where and int(where[0]) != os.getpid(), log_text  # built in a cluster worker, not the web process
    assert "verifying" in log_text and local_hub.alice_token not in log_text
    engine.close()


@pytest.mark.parametrize(
    ("builder", "task", "figure"),
    [
        ("build_tiny_encoder", "feature-extraction", "sentences"),
        ("build_tiny_whisper", "automatic-speech-recognition", "clips"),
        ("build_tiny_t5", "text2text-generation", "prompts"),
        ("build_tiny_vlm", "image-text-to-text", "images"),
    ],
)
def test_an_encoder_task_exports_on_the_cluster_as_on_this_machine(ray_cluster, tmp_path, builder, task, figure):
    """Sentence embeddings, speech, text-to-text and vision-language variants (their references travel to the
    cluster's tasks)."""
    from hub_export.models import tiny as demo
    from hub_export.pipeline.export import export
    from hub_export.pipeline.manifest import Manifest

    source = getattr(demo, builder)(tmp_path / "tiny")
    env = {**os.environ, "COLUMNS": "300", "RAY_USAGE_STATS_ENABLED": "0"}
    command = [str(HUB_EXPORT), "export", str(source), "-o", str(tmp_path / "ray"), "-q", "8da8w",
               "--ray-address", ray_cluster]  # fmt: skip
    # The cluster's export runs while this machine makes its own: the two are independent processes.
    on_cluster = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        local = export(str(source), tmp_path / "local", qmodes=["8da8w"], jobs=1)
        _, stderr = on_cluster.communicate(timeout=600)
    finally:
        on_cluster.kill()
    assert on_cluster.returncode == 0, stderr[-2000:]
    remote = Manifest.read(tmp_path / "ray")
    assert remote.source["task"] == task
    assert [v.sha256 for v in remote.variants] == [v.sha256 for v in local.variants]  # the same bytes
    figures = remote.variants[0].verification.figures
    assert (
        remote.variants[0].verification.verified and figures[figure] == local.variants[0].verification.figures[figure]
    )
