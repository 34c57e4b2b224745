"""Shared fixtures: the local Hub server and tiny models built offline.

Lowering is the slow stage (tens of seconds per variant even for toy models), so
exported folders are built once per session and shared.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

pytest_plugins = ["hub_export.hub.localhub.pytest_plugin"]

warnings.filterwarnings("ignore")

# The files that take longest, longest first (measured with --durations). `make test` and `make test-marked` run two
# workers, each taking whole files as it frees up: in name order the heaviest files come last, and one worker would
# end alone on them. In the marked suites the real SmolLM2 file (about 25 minutes on 2 busy AVX2 cores) takes one
# worker and the other runs the rest, the peer file's wait on pip first.
LONGEST_FIRST = (
    "test_real_model.py", "test_peer_loaders.py", "test_adapters.py", "test_vision_language.py", "test_publish.py",
    "test_speculative.py", "test_hostile_media.py", "test_archs.py", "test_workers.py", "test_bench.py", "test_lora_files.py", "test_kv_cache.py", "test_text2text.py",
    "test_space.py", "test_streaming.py", "test_export.py", "test_generate.py",
)  # fmt: skip


def pytest_collection_modifyitems(config, items):
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: tests keep their order in a file


@pytest.fixture(scope="session", autouse=True)
def private_conversion_cache(tmp_path_factory):
    """GGUF conversions go to a session folder, never the user's cache."""

    previous = os.environ.get("HUB_EXPORT_CACHE")
    os.environ["HUB_EXPORT_CACHE"] = str(tmp_path_factory.mktemp("hub-export-cache"))
    yield
    if previous is None:
        os.environ.pop("HUB_EXPORT_CACHE", None)
    else:
        os.environ["HUB_EXPORT_CACHE"] = previous


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A random-weight 2-layer Llama with tied embeddings and a BPE tokenizer."""
    from hub_export.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def exported_multi(tmp_path_factory, tiny_model) -> Path:
    """``tiny_model`` exported once with two variants (8da4w + 8-bit embeddings, fp32), built in two worker processes."""
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("exports") / "tiny-multi"
    events = []
    export(
        str(tiny_model), out, qmodes=["8da4w", "fp32"], qembedding="8w", max_seq_len=64, jobs=2, progress=events.append
    )
    # Kept beside the folder for the progress test: the export's own stream, from two worker processes.
    (out.parent / "tiny-multi-progress.json").write_text(
        json.dumps([[str(e), e.stage, e.variant, e.done, e.total] for e in events])
    )
    return out


@pytest.fixture(scope="session")
def exported_shared(tmp_path_factory, tiny_model) -> Path:
    """``tiny_model`` (tied embeddings) exported 8da8w with 8-bit embeddings stored once: ``.pte`` + ``.ptd``."""
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("exports") / "tiny-shared"
    export(str(tiny_model), out, qmodes=["8da8w"], qembedding="8w", max_seq_len=64, share_embeddings=True)
    return out


@pytest.fixture(scope="session")
def tiny_whisper(tmp_path_factory) -> Path:
    from hub_export.models.tiny import build_tiny_whisper

    return build_tiny_whisper(tmp_path_factory.mktemp("speech") / "tiny-whisper")


@pytest.fixture(scope="session")
def exported_whisper(tmp_path_factory, tiny_whisper) -> Path:
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("exports") / "tiny-whisper"
    export(str(tiny_whisper), out, qmodes=["fp32", "8da8w"], qembedding="8w", jobs=1)
    return out


@pytest.fixture(scope="session")
def spoken(tmp_path_factory) -> Path:
    """A shipped recording, resampled to 44.1 kHz stereo WAV: what a user's file looks like."""
    import numpy as np
    import soundfile
    from scipy.signal import resample_poly

    from hub_export.tasks.speech.export import eval_clips

    clip = eval_clips()[1]
    stereo = np.stack([resample_poly(clip.waveform.numpy(), 441, 160)] * 2, axis=1)
    path = tmp_path_factory.mktemp("audio") / "speech.wav"
    soundfile.write(path, stereo, 44100)
    return path


@pytest.fixture(scope="session")
def tiny_vit(tmp_path_factory) -> Path:
    from hub_export.models.tiny import build_tiny_image_classifier

    return build_tiny_image_classifier(tmp_path_factory.mktemp("vision") / "tiny-vit", "vit")


@pytest.fixture(scope="session")
def exported_vit(tmp_path_factory, tiny_vit) -> Path:
    from hub_export.pipeline.export import export

    out = tmp_path_factory.mktemp("exports") / "tiny-vit"
    export(str(tiny_vit), out, qmodes=["fp32", "8da8w"], jobs=1)
    return out


@pytest.fixture(scope="session")
def picture(tmp_path_factory) -> Path:
    from hub_export.tasks.image_classification.export import draw

    path = tmp_path_factory.mktemp("images") / "circle.png"
    draw(0, 96)[0].save(path)
    return path
