"""Image classification: a vision model and its classifier head as one ``.pte`` method.

The exported ``forward`` takes ``pixel_values [1, 3, height, width]`` (float32, resized and
normalised as the model's ``preprocessor_config.json`` says; the file's
``get_image_height``/``get_image_width`` give the size) and returns the label scores
``[1, labels]``, in ``config.json``'s ``id2label`` order. This is the input
optimum-executorch's image-classification file and transformers' image processors use.

Verification draws :data:`EVAL_IMAGES` images with known content (shapes, colours,
stripes, digits; no network, no licence question), runs them through the model's own
image processor and compares the file's scores with the eager model's
(:func:`hub_export.tasks.encoders.judge_labels`). The module implements the encoder stages of
:mod:`hub_export.tasks.encoders` for ``image-classification``.

Example:
    >>> image_size(Path("vit-folder"))
    (224, 224)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hub_export.errors import InputError, opt
from hub_export.pipeline.quantize import QMode
from hub_export.pipeline.records import Verification
from hub_export.tasks.encoders import EncoderReference, judge_labels

EVAL_IMAGES = 32
_COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 160, 60),
    "blue": (40, 70, 220),
    "yellow": (240, 210, 40),
    "black": (15, 15, 15),
    "white": (245, 245, 245),
    "orange": (245, 130, 20),
    "purple": (130, 40, 160),
}
_SHAPES = ("circle", "square", "triangle", "stripes", "digit")


class ImageClassifier(nn.Module):
    """``pixel_values [1, 3, h, w]`` -> label scores ``[1, labels]``."""

    def __init__(self, model: nn.Module, size: tuple[int, int]):
        super().__init__()
        self.model = model
        self.size = size

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits


def image_processor(folder: Path):
    """The model's image processor (``preprocessor_config.json``), as transformers loads it.

    Raises:
        InputError: the folder has no usable image processor.
    """
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as error:
        raise InputError(
            f"{folder.name}/preprocessor_config.json does not describe an image processor transformers can load "
            f"({type(error).__name__}); add the model's own"
        ) from None


def image_size(folder: Path) -> tuple[int, int]:
    """(height, width) of the pixel values the model's image processor makes: what the file takes."""
    from PIL import Image

    pixels = image_processor(folder)(images=Image.new("RGB", (640, 480)), return_tensors="pt")["pixel_values"]
    return int(pixels.shape[-2]), int(pixels.shape[-1])


def seq_len(folder: Path, config: dict, requested: int | None) -> int:
    """The height of the images the file takes (the export's size; a text's length does not apply)."""
    if requested is not None:
        raise InputError(
            f"{opt('max_seq_len')} applies to text; an image classifier takes images of the size its image "
            "processor makes: drop the option",
            param="max_seq_len",
        )
    return image_size(folder)[0]


def wrap(model: nn.Module, folder: Path, max_seq_len: int = 0) -> ImageClassifier:
    return ImageClassifier(model, image_size(folder))


def export(wrapped: ImageClassifier, max_seq_len: int) -> torch.export.ExportedProgram:
    """``wrapped`` traced for one image of its fixed size."""
    example = torch.zeros(1, 3, *wrapped.size)
    with torch.no_grad():
        return torch.export.export(wrapped, (example,), strict=False)


def metadata(model: nn.Module, folder: Path, max_seq_len: int) -> dict[str, Any]:
    """The constant methods of an image-classification ``.pte``."""
    height, width = image_size(folder)
    return {"get_image_height": height, "get_image_width": width, "get_num_labels": int(model.config.num_labels)}


def draw(index: int, size: int = 224):
    """Image number ``index`` of the evaluation set and what it shows, e.g. ``(image, "a red circle on white")``."""
    from PIL import Image, ImageDraw

    names = list(_COLOURS)
    shape = _SHAPES[index % len(_SHAPES)]
    colour, ground = names[index % len(names)], names[(index * 3 + 5) % len(names)]
    if ground == colour:
        ground = names[(names.index(colour) + 4) % len(names)]
    image = Image.new("RGB", (size, size), _COLOURS[ground])
    pen = ImageDraw.Draw(image)
    box = (size // 5 + index % 7, size // 5, size * 4 // 5, size * 4 // 5 - index % 5)
    if shape == "circle":
        pen.ellipse(box, fill=_COLOURS[colour])
    elif shape == "square":
        pen.rectangle(box, fill=_COLOURS[colour])
    elif shape == "triangle":
        pen.polygon([(box[0], box[3]), (box[2], box[3]), ((box[0] + box[2]) // 2, box[1])], fill=_COLOURS[colour])
    elif shape == "stripes":
        for x in range(0, size, 16 + index % 8):
            pen.rectangle((x, 0, x + 6, size), fill=_COLOURS[colour])
    else:
        pen.text((size // 3, size // 4), str(index % 10), fill=_COLOURS[colour], font_size=size // 2)
    what = f"the digit {index % 10}" if shape == "digit" else ("stripes" if shape == "stripes" else f"a {shape}")
    return image, f"{colour} {what} on {ground}"


def eval_inputs(folder: Path, config, max_seq_len: int, count: int = EVAL_IMAGES) -> EncoderReference:
    """:data:`EVAL_IMAGES` drawn images, prepared by the model's own image processor."""
    processor = image_processor(folder)
    items, inputs = [], []
    for index in range(count):
        image, what = draw(index)
        items.append(what)
        inputs.append((processor(images=image, return_tensors="pt")["pixel_values"].float(),))
    return EncoderReference(items, inputs)


def labels(folder: Path) -> list[str]:
    """The label names in score order, from ``config.json``'s ``id2label`` (``LABEL_i`` where it names none)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        id2label = {int(key): str(value) for key, value in (config.get("id2label") or {}).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        id2label = {}
    count = max(id2label, default=-1) + 1
    return [id2label.get(index, f"LABEL_{index}") for index in range(count)]


def source_record(model: nn.Module, folder: Path) -> dict[str, Any]:
    height, width = image_size(folder)
    return {"num_labels": int(model.config.num_labels), "image_size": [height, width]}


def judge(
    actual: torch.Tensor, expected: torch.Tensor, reference: EncoderReference, mode: QMode, qembedding: str | None
) -> Verification:
    """The file's label scores on the drawn images against eager's (see :func:`hub_export.tasks.encoders.judge_labels`)."""
    return judge_labels(actual, expected, reference, mode, "images")
