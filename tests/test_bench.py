"""hub-export bench: prefill and decode speed of a text-generation file over fresh processes, EOS ignored."""

from __future__ import annotations

import json

from helpers import error_line, run_cli


def test_bench_reports_every_run_and_the_threads_it_asked_for(exported_multi, capsys) -> None:
    from hub_export.bench import bench

    result = bench(exported_multi / "model-8da4w-emb8w.pte", prompt_tokens=16, gen_tokens=24, threads=1, repeat=2)
    assert len(result.runs) == 2 and all(run["threads"] == 1 for run in result.runs)
    assert result.median("decode_tokens_per_s") > 0 and result.median("prefill_tokens_per_s") > 0
    assert result.spread("peak_rss_bytes")[0] > 10e6  # a process that loaded torch and the file
    code, out, _ = run_cli(["bench", str(exported_multi), "--variant", "8da4w", "--prompt-tokens", "8",
                            "--gen-tokens", "8", "--repeat", "1", "--json"], capsys)  # fmt: skip
    shown = json.loads(out)
    assert code == 0 and shown["gen_tokens"] == 8 and len(shown["runs"]) == 1


def test_bench_refuses_more_tokens_than_the_context(exported_multi, capsys) -> None:
    code, _, err = run_cli(["bench", str(exported_multi), "--prompt-tokens", "60", "--gen-tokens", "10"], capsys)
    assert code == 2 and "must fit the file's context of 64 tokens" in error_line(err)
