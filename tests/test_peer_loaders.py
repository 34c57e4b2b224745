"""hub-export's files in the loaders other tools ship, unmodified: optimum-executorch's
``ExecuTorchModelForSpeechSeq2Seq`` runs a speech file's ``encoder`` and ``text_decoder`` as its own ``generate`` does.

optimum-executorch 1.1.0 pins another transformers than hub-export, so it runs from the virtualenv the peer
benchmarks use (``benchmarks/work/peer-venv``), made by the first run (about 4 minutes): ``make test-peer``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.peer


def test_optimum_executorch_transcribes_with_our_speech_file(tmp_path: Path) -> None:
    import torch
    from transformers import AutoFeatureExtractor

    from benchmarks.peer import peer_venv
    from benchmarks.speech_peer import as_optimum_decodes, loaded_by_peer
    from hub_export.models.packaged import packaged_whisper
    from hub_export.models.tiny import build_tiny_whisper
    from hub_export.pipeline.export import export
    from hub_export.tasks.speech.export import SAMPLE_RATE, eval_clips

    peer_venv()
    for source in (build_tiny_whisper(tmp_path / "tiny"), packaged_whisper()):
        out = tmp_path / f"out-{source.name}"
        (variant,) = export(str(source), out, qmodes=["8da8w"], jobs=1).variants
        extractor = AutoFeatureExtractor.from_pretrained(source)
        features = [
            extractor(clip.waveform.numpy(), sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
            for clip in eval_clips()[:2]
        ]
        torch.save(features, tmp_path / "features.pt")
        theirs = loaded_by_peer(str(out / variant.file), tmp_path / "features.pt")
        ours = as_optimum_decodes(str(out / variant.file), tmp_path / "features.pt")
        assert theirs == ours and all(theirs)
