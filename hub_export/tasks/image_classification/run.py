"""Classify: an image in, its most likely labels out, from an exported image-classification ``.pte``.

Example:
    >>> result = classify("out/model-8da8w.pte", "out", "cat.jpg")
    >>> result.labels[0].label
    'tabby, tabby cat'
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from hub_export.errors import InputError


@dataclass(frozen=True)
class Label:
    """One label of an image and the file's probability for it."""

    label: str
    probability: float


@dataclass
class ClassifyResult:
    """The best labels of an image, most likely first."""

    labels: list[Label]
    seconds: float  # running the file, image preparation aside


def classify(pte_path: str | Path, processor_dir: str | Path, image: str | Path, top_k: int = 5) -> ClassifyResult:
    """The ``top_k`` labels an image-classification ``.pte`` gives ``image`` (a file PIL reads).

    The image is prepared by the model's image processor (``preprocessor_config.json`` in
    ``processor_dir``, the export folder) and the label names come from its ``config.json``.

    Raises:
        InputError: the image cannot be read, the folder lacks the processor, or the file is not an image classifier.
        VerificationError: the file does not load or fails in the ExecuTorch runtime.
    """
    import torch

    from hub_export.media.images import open_image
    from hub_export.runtime.pte import PteModel
    from hub_export.tasks.image_classification.export import (  # torch and ExecuTorch: loaded when a file is run
        image_processor,
        labels,
    )

    folder = Path(processor_dir)
    if not (folder / "preprocessor_config.json").is_file():
        raise InputError(f"no preprocessor_config.json in {folder.name}/; pass the export folder")
    model = PteModel(pte_path)
    if "get_num_labels" not in model.metadata:
        raise InputError(f"{Path(pte_path).name} is not an image-classification file (it has no get_num_labels)")
    processor = image_processor(folder)
    picture = open_image(image, size=_side(processor))
    pixels = processor(images=picture, return_tensors="pt")["pixel_values"].float()
    started = time.perf_counter()
    scores = model.run([pixels])[0]
    seconds = time.perf_counter() - started
    names = labels(folder)
    top = torch.softmax(scores.float(), -1).topk(min(top_k, scores.shape[-1]))
    return ClassifyResult(
        [
            Label(names[int(i)] if int(i) < len(names) else f"LABEL_{int(i)}", float(p))
            for p, i in zip(top.values, top.indices, strict=True)
        ],
        seconds,
    )


def _side(processor) -> int | None:
    """The largest side the image processor resizes to (its ``size`` or ``crop_size``), or None when it says none."""
    sides = [
        value
        for setting in (getattr(processor, "size", None), getattr(processor, "crop_size", None))
        if isinstance(setting, dict)
        for value in setting.values()
        if isinstance(value, int)
    ]
    return max(sides) if sides else None
