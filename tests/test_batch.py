"""Batch plans: what a catalogue file may say, and the one-line refusals of what it may not."""

from __future__ import annotations

import pytest

from hub_export.errors import InputError
from hub_export.pipeline.batch import parse_plan, read_plan

PLAN = """
defaults: {qmodes: [8da4w], max_seq_len: 256, qembedding: 8w}
jobs:
  - {source: HuggingFaceTB/SmolLM2-135M, repo: me/SmolLM2-135M-ExecuTorch, qmodes: [8da4w, 8da8w]}
  - {source: Qwen/Qwen3-0.6B, repo: me/Qwen3-0.6B-ExecuTorch}
  - {source: ./my-model, repo: me/mine, qmodes: fp32, max_seq_len: 64, private: true, group_size: 64}
"""


def test_the_documented_plan_reads_with_defaults_under_each_jobs_own_options():
    jobs = parse_plan(PLAN)
    assert [(j.source, j.repo_id, j.options.qmodes) for j in jobs] == [
        ("HuggingFaceTB/SmolLM2-135M", "me/SmolLM2-135M-ExecuTorch", ("8da4w", "8da8w")),
        ("Qwen/Qwen3-0.6B", "me/Qwen3-0.6B-ExecuTorch", ("8da4w",)),
        ("./my-model", "me/mine", ("fp32",)),
    ]
    assert [j.options.max_seq_len for j in jobs] == [256, 256, 64]
    assert all(j.options.qembedding == "8w" for j in jobs)
    assert [j.private for j in jobs] == [False, False, True]
    assert jobs[2].options.group_size == 64


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("jobs: [{source: a/b, repo: me/x, qmode: [8da4w]}]", "plan job 1: unknown key 'qmode'"),
        ("jobs: [{source: a/b, repo: me/x, max_seq_len: lots}]", "plan job 1: max_seq_len must be a whole number"),
        ("jobs: [{source: a/b, repo: me/x, verify: 1}]", "unknown key 'verify'"),  # export-only: a push verifies
        ("jobs: [{source: a/b, repo: me/x, trust_remote_code: 'yes'}]", "trust_remote_code must be true or false"),
        ("jobs: [{source: a/b, repo: me/x, qmodes: [9w]}]", "plan job 1: unknown --qmode '9w'"),
        ("jobs: [{source: a/b, repo: me/x}, {source: c/d, repo: me/x}]", "plan job 2 pushes to me/x like job 1"),
        ("jobs: [{source: a/b, repo: '../etc'}]", "plan job 1:"),
        ("jobs: [{source: a/b}]", "plan job 1 needs a repo"),
        ("jobs: []", "plan needs a list of jobs"),
        ("defaults: {qmodes: [8da4w]}", "plan needs a list of jobs"),
        ("jobs: [{source: a/b, repo: me/x}]\nextra: 1", "unknown top-level key 'extra'"),
        ("jobs: [a/b]", "plan job 1 must be a mapping"),
        ("jobs: [{source: a/b, repo: me/x}", "plan is not valid YAML"),
        ("jobs: [!!python/object/apply:os.system [echo pwned]]", "plan is not valid YAML"),
        ("defaults: [8da4w]\njobs: [{source: a/b, repo: me/x}]", "defaults must be a mapping"),
    ],
)
def test_a_bad_plan_is_refused_with_one_line_naming_the_job_and_key(text, says):
    with pytest.raises(InputError) as refused:
        parse_plan(text)
    message = str(refused.value)
    assert says in message and "\n" not in message


def test_plan_files_that_are_missing_huge_or_binary_are_refused(tmp_path):
    with pytest.raises(InputError, match="is not a file"):
        read_plan(tmp_path / "missing.yaml")
    huge = tmp_path / "huge.yaml"
    huge.write_text("# " + "x" * (1 << 20))
    with pytest.raises(InputError, match="over 1024 KiB"):
        read_plan(huge)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00jobs")
    with pytest.raises(InputError, match="not UTF-8"):
        read_plan(binary)


def test_a_failed_job_fails_its_own_repo_only_and_the_run_says_so(local_hub, tiny_model, tmp_path):
    from hub_export.hub.pull import list_variants
    from hub_export.pipeline.batch import run_batch, summary

    jobs = parse_plan(
        "defaults: {qmodes: [fp32], max_seq_len: 32, quality_tokens: 0}\n"
        "jobs:\n"
        "  - {source: alice/no-such-model, repo: alice/never-made}\n"
        f"  - {{source: {tiny_model}, repo: alice/batch-survivor}}\n"
    )
    seen: list[str] = []
    states = run_batch(
        jobs,
        token=local_hub.alice_token,
        endpoint=local_hub.endpoint,
        on_event=lambda state, line: seen.append(f"{state.job.repo_id}: {line}"),
    )
    assert [s.state for s in states] == ["failed", "pushed"], [s.error for s in states]
    assert "alice/no-such-model" in states[0].error and "\n" not in states[0].error
    assert local_hub.alice_token not in states[0].error + "".join(seen)
    assert not local_hub.api(local_hub.alice_token).repo_exists("alice/never-made")
    assert [v.file for v in list_variants("alice/batch-survivor", endpoint=local_hub.endpoint).variants] == [
        "model-fp32.pte"
    ]
    assert summary(states) == "2 job(s): 1 pushed, 1 failed"
    assert any(line.startswith("alice/batch-survivor: [model-fp32.pte] verifying") for line in seen)


def test_a_bug_in_a_job_keeps_its_traceback_in_a_log_the_summary_names(monkeypatch, tmp_path) -> None:
    import hub_export.pipeline.batch as batch_module
    from hub_export.pipeline.batch import run_batch, summary

    def buggy_push(source, repo_id, *args, **kwargs):
        if repo_id == "me/broken":
            return {}["a key hub-export forgot"]
        raise InputError("the other job's own failure")

    monkeypatch.setattr(batch_module, "push", buggy_push)
    monkeypatch.setenv("HUB_EXPORT_LOG_DIR", str(tmp_path))
    jobs = parse_plan("jobs:\n  - {source: a/b, repo: me/broken}\n  - {source: c/d, repo: me/other}\n")
    states = run_batch(jobs, token="hf_batchsecretbatchsecret")
    assert [s.state for s in states] == ["failed", "failed"]
    (log,) = tmp_path.iterdir()
    assert states[0].log_file == str(log) and states[1].log_file is None
    assert "bug in hub-export" in states[0].error and log.name in states[0].error
    assert "buggy_push" in log.read_text() and "KeyError" in log.read_text()
    assert summary(states).startswith("2 job(s): 2 failed; tracebacks of hub-export bugs: ")
    assert log.name in summary(states)
