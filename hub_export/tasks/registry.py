"""Tasks: what a model takes and returns, and the stages that differ by it.

Every export runs the same pipeline (resolve -> load -> reference -> quantize -> wrap ->
lower -> verify -> card -> publish); a :class:`Task` names what differs: which model
class loads the checkpoint, what the ``.pte``'s method takes and returns, how a variant
is verified and what quality figure it reports, the card's pipeline tag and usage, and
the qmodes that make sense. The tasks are declared in ``tasks.toml`` beside this module;
adding a task is adding one table there and the folder that
implements its stages.

Example:
    >>> task_for({"architectures": ["BertModel"], "model_type": "bert"}).name
    'feature-extraction'
    >>> task_for({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).name
    'text-generation'
    >>> task_for({"architectures": ["ViTForImageClassification"], "model_type": "vit"}).name
    'image-classification'
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import tomllib

from hub_export.errors import InputError, opt
from hub_export.tasks.archs import SUPPORTED_MODEL_TYPES


@dataclass(frozen=True)
class Task:
    """One kind of model the exporter handles."""

    name: str  # the Hub's pipeline tag, also the value of --task
    takes: str  # what the .pte's forward method takes
    returns: str  # and what it returns
    qmodes: tuple[str, ...]  # the qmodes that make sense for it (others are refused)
    auto_class: str  # the transformers class that loads the checkpoint
    quality: str  # the quality figure each variant reports
    card_template: str  # the bundled card body (templates/), which includes the parts every task shares
    module: str | None = (
        None  # the hub_export module with its encoder stages (hub_export.tasks.encoders); None: the decoder
    )
    # How a verification's figures read, as str.format templates over Verification.figures
    # (a manifest from another version may lack some: then the decoder's wording is used).
    summary_format: str | None = None  # against the eager model: the pass/fail figure
    quality_format: str | None = None  # against fp32: what quantization kept
    quality_legend: str | None = None  # what the quality column of `hub-export ls` means
    companion: str = "tokenizer.json"  # the file a device needs beside the .pte to make the method's input

    @property
    def pipeline_tag(self) -> str:
        return self.name

    def words(self, figures: dict[str, float] | None, which: str) -> str | None:
        """``figures`` in this task's words (``which``: "summary" or "quality"), or None when they do not fit."""
        template = self.summary_format if which == "summary" else self.quality_format
        if template is None or not figures:
            return None
        try:
            return template.format_map(figures)
        except (KeyError, ValueError):
            return None


def _load_tasks() -> dict[str, Task]:
    """The tasks of ``tasks.toml`` (prose and formats are data: the card and `ls` read them), in its order."""
    with resources.files("hub_export.tasks").joinpath("tasks.toml").open("rb") as file:
        tables = tomllib.load(file)
    return {name: Task(name=name, **{**fields, "qmodes": tuple(fields["qmodes"])}) for name, fields in tables.items()}


TASKS: dict[str, Task] = _load_tasks()
TEXT_GENERATION = TASKS["text-generation"]
FEATURE_EXTRACTION = TASKS["feature-extraction"]
AUTOMATIC_SPEECH_RECOGNITION = TASKS["automatic-speech-recognition"]
TEXT2TEXT_GENERATION = TASKS["text2text-generation"]
FILL_MASK = TASKS["fill-mask"]
IMAGE_CLASSIFICATION = TASKS["image-classification"]
IMAGE_TEXT_TO_TEXT = TASKS["image-text-to-text"]
_HEADS = {"ForMaskedLM": FILL_MASK, "ForImageClassification": IMAGE_CLASSIFICATION}

# Heads of architectures that belong to a task none of TASKS implements yet: refused by name.
_OTHER_HEADS = {
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
    "ForConditionalGeneration": "text2text-generation or image-text-to-text",
    "ForQuestionAnswering": "question-answering",
}


def task_for(config: dict, requested: str | None = None) -> Task:
    """The task of a checkpoint with ``config`` (its ``config.json``): ``requested``, or read from its architecture.

    A bare encoder (``BertModel``) is feature extraction; a ``...ForCausalLM`` is text
    generation.

    Raises:
        InputError: ``requested`` is not a task, or the architecture's task is not supported.
    """
    if requested is not None:
        if requested not in TASKS:
            raise InputError(f"unknown {opt('task')} {requested!r}; choose from {', '.join(TASKS)}", param="task")
        return TASKS[requested]
    architectures = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    if config.get("model_type") in SUPPORTED_MODEL_TYPES["text-generation"]:
        return TEXT_GENERATION  # a decoder family, whatever head its config names
    if config.get("model_type") in SUPPORTED_MODEL_TYPES["automatic-speech-recognition"]:
        return AUTOMATIC_SPEECH_RECOGNITION
    if config.get("model_type") in SUPPORTED_MODEL_TYPES["text2text-generation"]:
        return TEXT2TEXT_GENERATION
    if config.get("model_type") in SUPPORTED_MODEL_TYPES["image-text-to-text"]:
        return IMAGE_TEXT_TO_TEXT
    for architecture in architectures:
        if architecture.endswith("ForCausalLM") or architecture.endswith("LMHeadModel"):
            return TEXT_GENERATION
        if architecture.endswith("Model") and not architecture.endswith("PreTrainedModel"):
            return FEATURE_EXTRACTION
        for head, task in _HEADS.items():
            if head in architecture:  # DeiTForImageClassificationWithTeacher too
                return task
        for head, task in _OTHER_HEADS.items():
            if architecture.endswith(head):
                raise InputError(
                    f"{architecture} is a {task} model, which hub-export does not export yet; "
                    f"supported tasks: {', '.join(TASKS)} (see `hub-export archs`)"
                )
    return TEXT_GENERATION  # no architecture named: the decoder checks say what is missing


def check_qmodes(task: Task, qmodes: tuple[str, ...] | list[str]) -> None:
    """Refuse qmodes that make no sense for ``task`` (the calibrated ``mixed`` plan is a decoder's)."""
    others = [mode for mode in qmodes if mode not in task.qmodes]
    if others:
        raise InputError(
            f"{opt('qmodes')} {', '.join(others)} does not apply to {task.name}; choose from {', '.join(task.qmodes)}",
            param="qmodes",
        )
