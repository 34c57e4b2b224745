"""Tasks: what a model takes and returns, and the stages that differ by it.

Every export runs the same pipeline (resolve -> load -> reference -> quantize -> wrap ->
lower -> verify -> card -> publish); a :class:`Task` names what differs: which model
class loads the checkpoint, what the ``.pte``'s method takes and returns, how a variant
is verified and what quality figure it reports, the card's pipeline tag and usage, and
the qmodes that make sense. Adding a task is adding one entry here and the module that
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


TEXT_GENERATION = Task(
    name="text-generation",
    takes="token ids [1, seq] and their cache positions [seq]",
    returns="next-token logits; a static KV cache lives inside the program",
    qmodes=("fp32", "8da4w", "8da8w", "mixed", "4w", "8w"),
    auto_class="AutoModelForCausalLM",
    quality="perplexity on English prose against fp32's, top-1 and KL against the eager model",
    card_template="model_card.md.j2",
)
FEATURE_EXTRACTION = Task(
    name="feature-extraction",
    takes="token ids and attention mask [1, seq], seq up to the file's get_max_seq_len",
    returns="the pooled sentence embedding [1, dim] (the model's sentence-transformers pooling, normalised if it is)",
    qmodes=("fp32", "8da8w", "8w", "8da4w", "4w"),
    auto_class="AutoModel",
    quality="cosine similarity to fp32 eager's vectors on 64 real sentences, and nearest-neighbour agreement",
    card_template="model_card_feature_extraction.md.j2",
    module="sentence_embeddings.export",
    summary_format="cosine {min_cosine_vs_eager:.4f} (worst sentence) vs eager",
    quality_format="cosine {mean_cosine_vs_fp32:.4f} (min {min_cosine_vs_fp32:.4f}), neighbours {retrieval_vs_fp32:.0%}",
    quality_legend="each file's sentence vectors against the fp32 model's on 64 sentences (mean, worst); "
    "neighbours: the share whose nearest other sentence stays the same",
)
AUTOMATIC_SPEECH_RECOGNITION = Task(
    name="automatic-speech-recognition",
    takes="preprocessor: 16 kHz samples [n]; encoder: log-mel features [1, mels, 3000]; text_decoder: token ids [1, n], "
    "the encoder's output and cache positions [n]",
    returns="log-mel features; every decoder layer's cross-attention keys and values; token scores [1, n, vocab]",
    qmodes=("fp32", "8da4w", "8da8w", "4w", "8w"),
    auto_class="AutoModelForSpeechSeq2Seq",
    quality="word error rate on shipped recordings against the spoken sentences and against fp32 eager's transcript",
    card_template="model_card_speech.md.j2",
    module="speech.export",
    summary_format="KL {mean_kl_vs_eager:.2g}, top-1 {top1_vs_eager:.0%}, encoder cosine {min_encoder_cosine:.4f} vs eager",
    quality_format="WER {wer:.0%} (fp32 {fp32_wer:.0%}); {wer_vs_fp32:.0%} of fp32's words changed",
    quality_legend="word error rate on the shipped recordings against the spoken sentences (in brackets, the fp32 "
    "model's), and against the fp32 model's own transcript",
)
TEXT2TEXT_GENERATION = Task(
    name="text2text-generation",
    takes="encoder: token ids [1, n]; text_decoder: token ids [1, m], the encoder's output and cache positions [m]",
    returns="every decoder layer's cross-attention keys and values; token scores [1, m, vocab]",
    qmodes=("fp32", "8da4w", "8da8w", "4w", "8w"),
    auto_class="AutoModelForSeq2SeqLM",
    quality="how often greedy answers to 16 prompts are fp32 eager's, word for word",
    card_template="model_card_text2text.md.j2",
    module="text_to_text.export",
    summary_format="KL {mean_kl_vs_eager:.2g}, top-1 {top1_vs_eager:.0%} vs eager (teacher forcing)",
    quality_format="same answer as fp32 for {same_answer_as_fp32:.0%} of prompts",
    quality_legend="greedy answers to 16 prompts of the evaluation text, word for word the fp32 model's",
)
FILL_MASK = Task(
    name="fill-mask",
    takes="token ids and attention mask [1, seq] with mask tokens, seq up to the file's get_max_seq_len",
    returns="token scores [1, seq, vocab]; the rows at mask tokens rank the words that fit",
    qmodes=("fp32", "8da8w", "8w", "8da4w", "4w"),
    auto_class="AutoModelForMaskedLM",
    quality="top-1 and top-5 agreement with fp32 eager at one masked word in each of 64 real sentences, and how "
    "often the masked word itself comes first",
    card_template="model_card_classification.md.j2",
    module="fill_mask.export",
    summary_format="KL {mean_kl_vs_eager:.2g}, top-1 {top1_vs_eager:.0%} vs eager",
    quality_format="top-1 {top1_vs_fp32:.0%}, top-5 {top5_overlap_vs_fp32:.0%} of fp32's; word found {accuracy:.0%} "
    "(fp32 {fp32_accuracy:.0%})",
    quality_legend="at one masked word in each of 64 sentences: the file's top-1 and top-5 against the fp32 "
    "model's, and how often its first guess is the word that was masked",
)
IMAGE_CLASSIFICATION = Task(
    name="image-classification",
    takes="pixel values [1, 3, size, size], resized and normalised as the model's image processor does",
    returns="label scores [1, labels]",
    qmodes=("fp32", "8da8w", "8w", "8da4w", "4w"),
    auto_class="AutoModelForImageClassification",
    quality="top-1 and top-5 agreement with fp32 eager on 32 drawn images",
    card_template="model_card_classification.md.j2",
    module="image_classification.export",
    summary_format="KL {mean_kl_vs_eager:.2g}, top-1 {top1_vs_eager:.0%} vs eager",
    quality_format="top-1 {top1_vs_fp32:.0%}, top-5 {top5_overlap_vs_fp32:.0%} of fp32's",
    quality_legend="on 32 drawn images: the file's top label and top-5 labels against the fp32 model's",
    companion="preprocessor_config.json",
)

IMAGE_TEXT_TO_TEXT = Task(
    name="image-text-to-text",
    takes="vision_encoder: RGB bytes [1, 3, size, size]; token_embedding: token ids [1, n]; text_decoder: "
    "embeddings [1, n, hidden] and cache positions [n] (ExecuTorch's MultimodalRunner calls them in that order)",
    returns="image embeddings [1, image tokens, hidden]; token embeddings; next-token logits (a static KV cache "
    "lives inside the program)",
    qmodes=("fp32", "8da4w", "8da8w", "4w", "8w"),
    auto_class="AutoModelForImageTextToText",
    quality="greedy answers about drawn images against fp32 eager's (teacher-forced KL and top-1), and the "
    "decoder's perplexity on English prose",
    card_template="model_card_vlm.md.j2",
    module="vision_language.export",
    summary_format="KL {mean_kl_vs_eager:.2g}, top-1 {top1_vs_eager:.0%}, image cosine {min_feature_cosine:.4f} vs "
    "eager",
    quality_format="image-conditioned KL {image_kl_vs_fp32:.3f}, top-1 {image_top1_vs_fp32:.0%}; same answer "
    "{same_answer_as_fp32:.0%}; text perplexity x{perplexity_ratio:.3f}",
    quality_legend="against the fp32 model on drawn images: KL and top-1 over the prompt and a teacher-forced "
    "answer, how often the greedy answer is word for word fp32's, and the decoder's perplexity on English prose "
    "as a multiple of fp32's",
)

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        TEXT_GENERATION,
        FEATURE_EXTRACTION,
        AUTOMATIC_SPEECH_RECOGNITION,
        TEXT2TEXT_GENERATION,
        FILL_MASK,
        IMAGE_CLASSIFICATION,
        IMAGE_TEXT_TO_TEXT,
    )
}
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
