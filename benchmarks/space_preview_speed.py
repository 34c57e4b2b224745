"""Benchmark: the Space's preview decodes as fast as the library's ``generate`` (the CLI's path), same file, same run.

Publishes an export folder (default: the real SmolLM2 8da4w file that
``benchmarks.quant_recipes`` leaves in ``benchmarks/work/quant-recipes/hqq``) to a local
Hub, starts the Space on it, and alternates, ``--rounds`` times each: a preview through
the Space's HTTP API (``gradio_client``, the path a browser's Generate button takes) and
``hub_export.generate`` in this process on the same pulled file with the same prompt,
greedy, no chat template. Reports decode tokens/s of both (median and range) and their
ratio.

    python -m benchmarks.space_preview_speed [--folder DIR] [--rounds 5]

Results: ``benchmarks/results/space-preview-speed.{json,md}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import tempfile
from pathlib import Path

from benchmarks.report import spread, write_results

ROOT = Path(__file__).resolve().parent
PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


def _space_app():
    sys.path.insert(0, str(ROOT.parent / "space"))
    spec = importlib.util.spec_from_file_location("hub_export_space_app", ROOT.parent / "space" / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=ROOT / "work" / "quant-recipes" / "hqq")
    parser.add_argument("--variant", default="8da4w")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=63)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="space-speed-"))
    # The local Hub speaks classic LFS, not Xet; and this run keeps out of the user's HF cache.
    os.environ.update(HF_HUB_DISABLE_XET="1", HF_HOME=str(work / "hf-home"))

    import gradio_client

    from hub_export.hub.localhub import add_user, serve_in_thread
    from hub_export.hub.pull import list_variants, pull
    from hub_export.hub.push import push
    from hub_export.quiet import quiet_libraries
    from hub_export.tasks.text_generation.run import generate

    quiet_libraries()
    token = add_user(work / "hub", "alice")
    hub = serve_in_thread(work / "hub")
    repo = "alice/speed-ExecuTorch"
    push(from_dir=args.folder, repo_id=repo, token=token, endpoint=hub.endpoint)
    local = pull(repo, args.variant, output_dir=work / "pulled", endpoint=hub.endpoint, token=token)
    pte = local / next(v.file for v in list_variants(repo, hub.endpoint, token).variants if v.qmode == args.variant)

    space = _space_app()
    settings = space.Settings(
        endpoint=hub.endpoint, auth=space.AuthPolicy(False, False, "benchmark"), work_root=work / "jobs"
    )
    blocks = space.build_app(settings)
    blocks.launch(prevent_thread_lock=True, quiet=True, server_name="127.0.0.1", **space.LAUNCH_OPTIONS)
    client = gradio_client.Client(blocks.local_url, verbose=False)
    decode = {"space": [], "library": []}
    try:
        for round_ in range(args.rounds + 1):
            _, stats = client.predict(
                repo, args.variant, PROMPT, args.tokens, False, "", 0.0, 1.0, 0, 1.0, 0, token, api_name="/preview"
            )
            space_rate = float(re.search(r"decode \*\*([\d.]+) tok/s", stats)[1])
            library = generate(pte, local, PROMPT, max_new_tokens=args.tokens, chat=False)
            if round_:  # the first of each is a warm-up
                decode["space"].append(space_rate)
                decode["library"].append(library.decode_tokens_per_s)
    finally:
        blocks.close()
        hub.stop()

    summary = {name: spread(v) for name, v in decode.items()}
    result = {
        "file": pte.name,
        "rounds": args.rounds,
        "new_tokens": args.tokens,
        "decode_tokens_per_s": summary,
        "space_vs_library": round(summary["space"]["median"] / summary["library"]["median"], 3),
    }
    text = (
        f"Space preview vs `generate` on `{pte.name}` ({args.tokens} new tokens, greedy, {args.rounds} rounds each, "
        f"alternated): decode {summary['space']['median']:.0f} tok/s ({summary['space']['min']:.0f}-"
        f"{summary['space']['max']:.0f}) against {summary['library']['median']:.0f} ({summary['library']['min']:.0f}-"
        f"{summary['library']['max']:.0f}): {result['space_vs_library']:.2f}x.\n"
    )
    write_results("space-preview-speed", result, text)


if __name__ == "__main__":
    main()
