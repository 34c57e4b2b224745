"""Where `.pte` files run: the runner's own process and the environment such a process gets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hub_export.runtime.pte import runner_generate

PROBE = "import os, sys; from hub_export.runtime.process_env import prepare_pte_process; print(prepare_pte_process(), os.environ.get('MKL_NUM_THREADS'))"


def _fresh(code: str, **env: str) -> str:
    clean = {key: value for key, value in os.environ.items() if key != "MKL_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**clean, **env}
    )
    return done.stdout.strip()


def test_a_pte_process_keeps_torchs_mkl_to_one_thread_unless_the_user_chose():
    # MKL reads its thread count once, when torch loads; ExecuTorch's pool already uses every core.
    assert _fresh(PROBE) == "True 1"
    assert _fresh(PROBE, MKL_NUM_THREADS="3") == "True 3"
    assert _fresh("import torch; " + PROBE) == "False None"  # too late to matter: left alone


def test_the_cli_generate_sets_it_before_torch_loads():
    code = (
        "import sys; from typer.testing import CliRunner; from hub_export.cli import app; "
        "CliRunner().invoke(app, ['generate', '/nonexistent-folder', '--prompt', 'x']); "
        "import os; print('torch' in sys.modules, os.environ.get('MKL_NUM_THREADS'))"
    )
    assert _fresh(code).splitlines()[-1] == "True 1"


def test_runner_runs_in_its_own_process_and_reports_the_file(exported_multi, monkeypatch):
    monkeypatch.setenv("MKL_NUM_THREADS", "2")  # this process's setting; the runner's process gets its own
    stats = runner_generate(
        exported_multi / "model-8da4w-emb8w.pte", exported_multi / "tokenizer.json", "Once upon a time", 5
    )
    assert stats["generated_tokens"] >= 1 and stats["prompt_tokens"] >= 1
    assert stats["prompt_eval_end_ms"] >= stats["inference_start_ms"]
    assert stats["mkl_num_threads"] == "1"
    assert os.environ["MKL_NUM_THREADS"] == "2"


def test_a_failing_runner_says_why_in_one_line(exported_multi, tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("not a tokenizer")
    with pytest.raises(RuntimeError, match="tokenizer") as caught:
        runner_generate(exported_multi / "model-8da4w-emb8w.pte", bad, "Once upon a time", 5)
    assert "\n" not in str(caught.value)


def test_verification_hands_the_heap_back_to_the_os_as_the_runtime_steps(exported_multi, monkeypatch):
    """The runtime's thousands of single-token steps free their temporaries in pieces the heap keeps (an export's
    process grew by 0.9 GB over verification at Llama 3.2 1B's widths): each progress line hands them back."""
    import torch

    from hub_export.pipeline import verify
    from hub_export.runtime.pte import PteModel

    said, trims = [], []
    monkeypatch.setattr(verify, "trim_heap", lambda: trims.append(len(said)))
    pte = PteModel(exported_multi / "model-8da4w-emb8w.pte")
    window = torch.randint(0, int(pte.metadata["get_vocab_size"]), (1, 41))
    target, top = verify.runtime_scores(pte, [window], said.append)
    assert target.shape == top.shape == (40,)
    assert [line.split(",")[0] for line in said] == [
        "verifying: 16 of 40 runtime steps",
        "verifying: 32 of 40 runtime steps",
    ]
    assert trims == [0, 1]  # as each progress line comes
