"""What to build: one frozen, validated options object for every front end.

:class:`ExportOptions` is the only place an export option is declared. Its fields carry
their flag names and help text: the CLI's ``export`` and ``push`` commands, the Space's
form and the reproduce command in every manifest are built from them, and the object
itself travels unchanged from the front end through :func:`hub_export.export` down to
the worker processes. Adding an option means adding a field here and using it where it
matters.

Example:
    >>> from hub_export import ExportOptions
    >>> options = ExportOptions(qmodes=("8da4w", "fp32"), qembedding="8w", max_seq_len=256)
    >>> options.variant_files()
    ['model-8da4w-emb8w.pte', 'model-fp32-emb8w.pte']
    >>> ExportOptions(qmodes=("9w",))
    Traceback (most recent call last):
    hub_export.errors.InputError: unknown --qmode '9w'; choose from fp32, 8da4w, 8da8w, mixed, 4w, 8w
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hub_export.errors import InputError, declare_spellings, opt
from hub_export.pipeline import quantize
from hub_export.pipeline.calibration_text import calibration_text_digest, read_calibration_text
from hub_export.tasks import registry as tasks

DEFAULT_SIZE_RATIO = 1.15  # the mixed qmode's default size cap, relative to plain 8da4w
DEFAULT_QUALITY_TOKENS = 2048  # hub_export.pipeline.verify.DEFAULT_QUALITY_TOKENS, without importing torch here
EXPORT_AND_PUSH = ("export", "push")
SLIDING_CACHES = ("ring", "full")  # hub_export.tasks.text_generation.kv_cache's layouts of a sliding-window layer
KV_DTYPES = ("fp32", "int8")
_KV_DTYPE_WORDS = {"fp32": "float", "int8": "int8: about a quarter of the memory"}  # a form's words for each
SOURCE_OPTIONS = ("base_model", "license", "model_name", "revision", "gguf_file")
_NOT_VARIANT_SETTINGS = {"qmodes", "jobs", "verify", "trust_remote_code", "allow_pickle", *SOURCE_OPTIONS}


@dataclass(frozen=True)
class FormControl:
    """How a web form offers an option: its label, and its choices or limits (what the library accepts).

    The limits and choices let the control refuse early what the library would refuse;
    the library's own checks stay the rule (a form's values go through
    :class:`ExportOptions` like the CLI's).
    """

    label: str
    choices: tuple[tuple[str, Any], ...] = ()  # (shown, value); several may be picked when the option is a tuple
    minimum: int | float | None = None
    maximum: int | float | None = None
    multiple_of: int | None = None  # the control steps by it
    placeholder: str | None = None
    info: str | None = None  # the hint under the control (default: the option's help, which speaks in CLI flags)
    upload: tuple[str, ...] = ()  # a file the user uploads, with one of these suffixes; the option gets its path

    def choice_values(self) -> list[tuple[str, Any]]:
        """The choices as a form sends them: text, with :data:`FORM_NONE` for the option's None."""
        return [(shown, FORM_NONE if value is None else value) for shown, value in self.choices]


FORM_NONE = "none"  # a form's value for an option's None choice (form values are text)


def _option(
    default: Any,
    *flags: str,
    help: str,
    commands: tuple[str, ...] = EXPORT_AND_PUSH,
    reproduce: bool = True,
    form: FormControl | None = None,
) -> Any:
    """A field of :class:`ExportOptions` with what a front end needs to offer it.

    ``flags``: the CLI's names (default: ``--field-name``); ``commands``: the CLI
    commands that take it; ``reproduce``: whether it belongs in the command that
    reproduces an export's files (``--jobs`` changes only how fast they are built);
    ``form``: how a web form offers it; the Space's export form shows the options that
    have one, so giving an option a :class:`FormControl` is all it takes to offer it there.
    """
    metadata = {
        "flags": flags,
        "help": help,
        "commands": commands,
        "reproduce": reproduce,
        "show_default": default is not None,  # the CLI shows no "[default: None]"
        "form": form,
    }
    return field(default=default, metadata=metadata)


def _qmode_help() -> str:
    described = "; ".join(f"{mode.name}: {mode.description}" for mode in quantize.QMODES.values())
    return f"Quantization of the linear layers, one variant each (repeat for several). {described}."


@dataclass(frozen=True)
class ExportOptions:
    """Every option of an export, checked when the object is made.

    The CLI flag of each field is ``--field-name`` unless its metadata says otherwise
    (``qmodes`` is ``--qmode``, repeated). Invalid combinations raise
    :class:`~hub_export.errors.InputError` naming the flag to change.
    """

    qmodes: tuple[str, ...] = _option(
        ("8da4w",),
        "--qmode",
        "-q",
        help=_qmode_help(),
        form=FormControl(
            "Variants",
            tuple((f"{m.name}: {m.description}", m.name) for m in quantize.QMODES.values()),
            info="One .pte file each; every one is verified.",
        ),
    )
    qembedding: str | None = _option(
        None,
        help=f"Quantize the token embedding: {' or '.join(quantize.QEMBEDDINGS)} (default: float32).",
        form=FormControl(
            "Embedding quantization",
            (("none", None), *((f"{bits}-bit", name) for name, bits in quantize.QEMBEDDINGS.items())),
            info="Shrinks large vocabularies.",
        ),
    )
    qmode_encoder: str | None = _option(
        None,
        help="Speech models: quantize the audio encoder with this qmode instead of each variant's "
        "(the encoder runs once per 30 s of audio, the decoder once per token).",
    )
    group_size: int = _option(
        quantize.DEFAULT_GROUP_SIZE,
        help="Group size for grouped int4 weights (a multiple of 32).",
        form=FormControl("Group size", minimum=32, multiple_of=32),
    )
    max_seq_len: int | None = _option(
        None,
        help="KV cache length (prompt + generation). Default: min(model limit, 2048).",
        form=FormControl(
            "Max sequence length", minimum=0, info="Prompt + generated tokens; 0: the model's limit, at most 2048."
        ),
    )
    sliding_cache: str = _option(
        "ring",
        "--sliding-cache",
        help="Cache of sliding-window layers: ring (keeps the window, exact) or full (every position, masked).",
    )
    kv_cache: str = _option(
        "fp32",
        "--kv-cache",
        help="KV cache values: fp32, or int8 (per token and head, about a quarter of the memory; costs some accuracy).",
        form=FormControl(
            "KV cache",
            tuple((_KV_DTYPE_WORDS[name], name) for name in KV_DTYPES),
            info="Keys and values kept per token; int8 costs some accuracy (shown in the table).",
        ),
    )
    attention_sink: str | None = _option(
        None,
        "--attention-sink",
        help="SINK,WINDOW (e.g. 4,2044): keep the first SINK tokens and the last WINDOW, and generate past the cache "
        "(StreamingLLM); the cache holds SINK+WINDOW positions, rope positions wrap within it.",
    )
    verify: bool = _option(
        True,
        help="Verify each .pte against the eager model and in TextLLMRunner.",
        commands=("export",),
        reproduce=False,
    )
    jobs: int | None = _option(
        None,
        "--jobs",
        "-j",
        reproduce=False,
        help="Variants to build at once, each in its own process (default: as many as cores and memory allow).",
    )
    share_embeddings: bool = _option(
        False,
        "--share-embeddings",
        help="Store a tied embedding table once: each variant becomes a .pte plus a .ptd data file (needs "
        f"--qembedding 8w; qmodes {', '.join(quantize.SHAREABLE_QMODES)}).",
    )
    speculative: bool = _option(
        False,
        "--speculative",
        help="Text generation: also write forward_rows, which scores a run of proposed tokens in one call, so "
        "`generate --lookup` and `--draft` can decode several tokens per step (same weights, stored once).",
    )
    int4_scales: str = _option(
        "gptq",
        "--int4-scales",
        help=f"How int4 weights are rounded: {', '.join(quantize.INT4_SCALES)} (gptq: calibrated on the calibration "
        "text so each layer's output stays close, causal LMs' 8da4w and mixed; hqq: torchao's HQQ scale search; "
        "minmax: each group's largest weight). All give the same format, size and speed.",
    )
    max_size_ratio: float | None = _option(
        None,
        "--max-size-ratio",
        help="--qmode mixed: keep layers int8 while the file stays within this size relative to plain 8da4w "
        "(default 1.15, or no limit with --max-ppl-ratio).",
    )
    max_ppl_ratio: float | None = _option(
        None,
        "--max-ppl-ratio",
        help="--qmode mixed: keep the most sensitive layers int8 until perplexity on the calibration text is "
        "within this ratio of fp32's.",
    )
    calibration: bool = _option(
        True,
        help="Calibrate on the calibration text: GPTQ's int4 rounding and the mixed qmode's int8 layers (off: HQQ "
        "scales, and mixed is plain int4).",
    )
    calibration_text: str | None = _option(
        None,
        "--calibration-text",
        reproduce=False,  # a path on the exporter's machine: the manifest records the text's sha256 instead
        help="Calibrate GPTQ's int4 rounding and the mixed qmode's int8 layers on this UTF-8 text file (your own "
        "domain's text, as an importance matrix does for GGUF) instead of the shipped English prose; the manifest and "
        "card record its sha256 and token count, never its content.",
        form=FormControl(
            "Calibration text",
            upload=(".txt",),
            info="Optional: your own domain's text (UTF-8, at least 128 words) to calibrate the 4-bit rounding; "
            "only its sha256 and token count are recorded.",
        ),
    )
    quality_tokens: int = _option(
        DEFAULT_QUALITY_TOKENS,
        "--quality-tokens",
        help="Tokens of English text each variant is scored on (perplexity, top-1, KL vs fp32); 0: off.",
    )
    gguf_file: str | None = _option(
        None,
        "--gguf-file",
        help="Read the weights from this .gguf file in the repo or folder (dequantized; tokenizer from its metadata).",
    )
    base_model: str | None = _option(
        None,
        "--base-model",
        help="Hub id (ORG/NAME) of the model a local or GGUF source is a copy of: the card links it, sets base_model "
        "and inherits its license and language. For a LoRA adapter source: the base to merge it into, over the one "
        "its adapter_config.json names.",
    )
    adapter: str | None = _option(
        None,
        "--adapter",
        help="A PEFT LoRA adapter (folder or Hub id) to merge into SOURCE before exporting; an adapter given as "
        "SOURCE is merged into the base its config names.",
    )
    lora_files: bool = _option(
        False,
        "--lora-files",
        help="For a LoRA adapter: keep it apart from the base instead of merging it. Each variant becomes the base's "
        "weights in base-QMODE.ptd (byte-identical for every adapter of that base: ship it once) and the program "
        "with the adapter's fp32 factors in lora-ADAPTER-QMODE.pte (a few MB).",
    )
    license: str | None = _option(
        None,
        "--license",
        help="License id for the card (e.g. apache-2.0), over the one inherited from the source's card.",
    )
    model_name: str | None = _option(
        None,
        "--model-name",
        help="The model's name for the card's title (default: --base-model, else the source's id or folder name).",
    )
    revision: str | None = _option(
        None,
        help="Branch, tag or commit of the SOURCE repo to export.",
        form=FormControl("Revision", placeholder="main", info="Branch, tag or commit."),
    )
    trust_remote_code: bool = _option(False, help="Allow models that need custom code from the repo.")
    allow_pickle: bool = _option(False, help="Allow pickle (*.bin) weights, which can run code when loaded.")
    task: str | None = _option(
        None,
        "--task",
        help=f"What the file does: {' or '.join(tasks.TASKS)} (default: read from the model's architecture).",
        form=FormControl(
            "Task",
            (("from the model", None), *((name, name) for name in tasks.TASKS)),
            info="Text generation for causal LMs, sentence embeddings for encoders.",
        ),
    )

    def __post_init__(self) -> None:
        # Lists are welcome (the CLI gives one); a tuple keeps the object hashable and frozen.
        qmodes = (self.qmodes,) if isinstance(self.qmodes, str) else tuple(self.qmodes)
        object.__setattr__(self, "qmodes", qmodes)
        self._validate()

    def _validate(self) -> None:
        if not self.qmodes:
            raise InputError(f"give at least one {opt('qmodes')}")
        if self.quality_tokens < 0:
            raise InputError(
                f"{opt('quality_tokens')} must be 0 (off) or more (got {self.quality_tokens})", param="quality_tokens"
            )
        if self.jobs is not None and self.jobs < 1:
            raise InputError(f"{opt('jobs')} must be at least 1 (got {self.jobs})", param="jobs")
        if self.share_embeddings:
            others = [mode for mode in self.qmodes if mode not in quantize.SHAREABLE_QMODES]
            if self.qembedding != "8w" or others:
                raise InputError(
                    f"{opt('share_embeddings')} needs {opt('qembedding')} 8w and qmodes among "
                    f"{', '.join(quantize.SHAREABLE_QMODES)} (the output projection must be 8-bit per row like the "
                    f"table){'; drop ' + ', '.join(others) if others else ''}",
                    param="share_embeddings",
                )
        if self.lora_files and self.share_embeddings:
            raise InputError(f"{opt('lora_files')} writes the base's weights to their own .ptd; drop "
                             f"{opt('share_embeddings')}", param="lora_files")  # fmt: skip
        quantize.validate(list(self.qmodes), self.qembedding, self.group_size)
        if self.qmode_encoder is not None and self.qmode_encoder not in quantize.QMODES:
            raise InputError(
                f"unknown {opt('qmode_encoder')} {self.qmode_encoder!r}; choose from {', '.join(quantize.QMODES)}",
                param="qmode_encoder",
            )
        if self.task is not None:
            tasks.check_qmodes(tasks.task_for({}, self.task), self.qmodes)
        self._validate_recipe()
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise InputError(f"{opt('max_seq_len')} must be at least 2 (got {self.max_seq_len})", param="max_seq_len")
        self._validate_cache()

    def _validate_cache(self) -> None:
        if self.sliding_cache not in SLIDING_CACHES:
            raise InputError(
                f"unknown {opt('sliding_cache')} {self.sliding_cache!r}; choose from {', '.join(SLIDING_CACHES)}",
                param="sliding_cache",
            )
        if self.kv_cache not in KV_DTYPES:
            raise InputError(
                f"unknown {opt('kv_cache')} {self.kv_cache!r}; choose from {', '.join(KV_DTYPES)}", param="kv_cache"
            )
        if self.attention_sink is None:
            return
        self.sink()  # parses or raises
        if self.speculative:
            raise InputError(
                f"{opt('speculative')} rewrites cache positions a rejected draft used, which a ring buffer cannot "
                f"take back; drop {opt('attention_sink')}",
                param="speculative",
            )
        if self.sliding_cache == "full":
            raise InputError(
                f"{opt('attention_sink')} keeps every layer in a ring buffer; it cannot keep "
                f"{opt('sliding_cache')} full",
                param="attention_sink",
                hint=f"drop {opt('sliding_cache')} full",
            )
        if self.max_seq_len is not None:
            raise InputError(
                f"{opt('attention_sink')} SINK,WINDOW sets the cache size (SINK+WINDOW positions); "
                f"drop {opt('max_seq_len')}",
                param="attention_sink",
            )

    def sink(self) -> tuple[int, int] | None:
        """``--attention-sink`` as (sink tokens, window tokens), or None."""
        if self.attention_sink is None:
            return None
        parts = str(self.attention_sink).replace(" ", "").split(",")
        if len(parts) != 2 or not all(part.isdigit() for part in parts):
            raise InputError(
                f"{opt('attention_sink')} takes SINK,WINDOW, two whole numbers such as 4,2044 "
                f"(got {self.attention_sink!r})",
                param="attention_sink",
            )
        sink, window = int(parts[0]), int(parts[1])
        if not 1 <= sink <= 1024 or not 2 <= window <= 1 << 20:
            raise InputError(
                f"{opt('attention_sink')} needs 1 to 1024 sink tokens and a window of 2 or more (got {sink},{window})",
                param="attention_sink",
            )
        return sink, window

    def _validate_recipe(self) -> None:
        if self.int4_scales not in quantize.INT4_SCALES:
            raise InputError(
                f"unknown {opt('int4_scales')} {self.int4_scales!r}; choose from {', '.join(quantize.INT4_SCALES)}",
                param="int4_scales",
            )
        budgets = [name for name in ("max_size_ratio", "max_ppl_ratio") if getattr(self, name) is not None]
        calibrated = [mode for mode in self.qmodes if quantize.QMODES[mode].calibrated]
        if budgets and not calibrated:
            raise InputError(
                f"{opt(budgets[0])} sets the budget of {opt('qmodes')} mixed",
                param=budgets[0],
                hint=f"add {opt('qmodes')} mixed, or drop {opt(budgets[0])}",
            )
        if budgets and not self.calibration:
            raise InputError(
                f"{opt(budgets[0])} needs the calibration that {opt('no_calibration')} turns off",
                param=budgets[0],
                hint="drop one of them",
            )
        if self.calibration_text is not None:
            if not calibrated and not self.gptq and self.calibration:
                raise InputError(f"{opt('calibration_text')} calibrates {opt('int4_scales')} gptq and {opt('qmodes')} "
                                 "mixed (4-bit grouped variants); add one, or drop the text", param="calibration_text")  # fmt: skip
            if not self.calibration:
                raise InputError(f"{opt('calibration_text')} needs the calibration that {opt('no_calibration')} turns "
                                 "off; drop one of them", param="calibration_text")  # fmt: skip
            read_calibration_text(self.calibration_text)
        if self.max_size_ratio is not None and not 1.0 <= self.max_size_ratio <= 4.0:
            raise InputError(
                f"{opt('max_size_ratio')} must be between 1.0 (plain 8da4w's size) and 4.0 (got {self.max_size_ratio})",
                param="max_size_ratio",
            )
        if self.max_ppl_ratio is not None and not self.max_ppl_ratio > 1.0:
            raise InputError(
                f"{opt('max_ppl_ratio')} must be above 1.0, fp32's perplexity (got {self.max_ppl_ratio})",
                param="max_ppl_ratio",
            )

    @property
    def size_budget(self) -> float | None:
        """The mixed qmode's size cap relative to plain 8da4w: as given, else 1.15 unless a perplexity target rules."""
        if self.max_size_ratio is not None:
            return self.max_size_ratio
        return None if self.max_ppl_ratio is not None else DEFAULT_SIZE_RATIO

    def recipe(self, eight_bit: frozenset[str] = frozenset(), rounding: Any = None) -> quantize.Recipe:
        """The quantization recipe of these options (``eight_bit``: the calibrated plan's int8 layers; ``rounding``:
        GPTQ's codes, :class:`hub_export.pipeline.gptq.Int4Rounding`)."""
        return quantize.Recipe(scales=self.int4_scales, eight_bit=eight_bit, rounding=rounding)

    @property
    def gptq(self) -> bool:
        """Whether a run rounds its grouped int4 layers with GPTQ (calibrated, and some qmode has such layers)."""
        grouped = any(quantize.QMODES[m].grouped and not quantize.QMODES[m].weight_only for m in self.qmodes)
        return self.int4_scales == "gptq" and self.calibration and grouped

    def replace(self, **changes: Any) -> ExportOptions:
        """A copy with ``changes``, validated again."""
        return dataclasses.replace(self, **changes)

    def variant_files(self) -> list[str]:
        """The ``.pte`` file of each variant, in qmode order."""
        return [variant_filename(qmode, self.qembedding) for qmode in self.qmodes]

    @property
    def declared(self) -> dict[str, str]:
        """What the exporter said the model is (``--base-model``, ``--license``, ``--model-name``), as given."""
        return {key: getattr(self, key) for key in ("base_model", "license", "model_name") if getattr(self, key)}

    def flags(self) -> list[str]:
        """The CLI arguments that rebuild these options' files (defaults and build-speed options left out)."""
        arguments: list[str] = []
        # What the source is comes first, then how it is built; the qmodes are always named.
        specs = sorted(option_fields(), key=_reproduce_order)
        for spec in specs:
            value = getattr(self, spec.name)
            if spec.name != "qmodes" and (not spec.metadata["reproduce"] or value == spec.default or value is None):
                continue
            flag = cli_flags(spec)[0]
            if isinstance(value, bool):
                arguments.append(flag if value else f"--no-{flag.removeprefix('--')}")
            elif isinstance(value, tuple):
                for item in value:
                    arguments += [flag, str(item)]
            else:
                arguments += [flag, str(value)]
        return arguments

    def variant_settings(self) -> dict[str, Any]:
        """What decides a variant's bytes and figures besides its qmode and its source, as JSON values.

        The manifest records it for each variant (``Variant.asked``); a push reuses a
        variant only when the same is asked again. Left out: the qmodes (one per variant),
        where the source comes from (its fingerprint decides), what the card declares, and
        what changes only how the work is done (jobs, verification, permissions).
        """
        settings = {
            spec.name: list(value) if isinstance(value := getattr(self, spec.name), tuple) else value
            for spec in dataclasses.fields(self)
            if spec.name not in _NOT_VARIANT_SETTINGS
        }
        if self.calibration_text is not None:  # what decides the plan is the text, not where it lies
            settings["calibration_text"] = "sha256:" + calibration_text_digest(self.calibration_text)
        return settings

    def command(self, source: str, verb: str = "export") -> str:
        """The shell command that reproduces these files from ``source``."""
        return shlex.join(["hub-export", verb, source, *self.flags()])


def options_with(options: ExportOptions | None, values: dict[str, Any]) -> ExportOptions:
    """``options`` (default: all defaults) with the fields in ``values`` replaced, validated.

    The Python API takes options whole or as keywords; an unknown keyword is a
    programming mistake and raises :class:`TypeError` naming it.
    """
    unknown = sorted(set(values) - {spec.name for spec in dataclasses.fields(ExportOptions)})
    if unknown:
        raise TypeError(f"unknown export option(s) {', '.join(unknown)}; see hub_export.ExportOptions")
    if options is None:
        return ExportOptions(**values)
    return options.replace(**values) if values else options


def _reproduce_order(spec: dataclasses.Field) -> int:
    return SOURCE_OPTIONS.index(spec.name) if spec.name in SOURCE_OPTIONS else len(SOURCE_OPTIONS)


def option_fields(command: str | None = None) -> Iterator[dataclasses.Field]:
    """The fields of :class:`ExportOptions`, those the CLI ``command`` takes when given."""
    for spec in dataclasses.fields(ExportOptions):
        if command is None or command in spec.metadata["commands"]:
            yield spec


def cli_flags(spec: dataclasses.Field) -> tuple[str, ...]:
    """The CLI names of an option: declared ones, else ``--field-name``."""
    return spec.metadata["flags"] or ("--" + spec.name.replace("_", "-"),)


def form_fields() -> list[dataclasses.Field]:
    """The options a form offers (those with a :class:`FormControl`), in the order they are declared."""
    return [spec for spec in dataclasses.fields(ExportOptions) if spec.metadata["form"] is not None]


# What a form asks for, by the option's type (annotations are text here: postponed by the __future__ import).
_FORM_KINDS = {"bool": "flag", "int": "whole", "float": "number", "str": "text"}


def form_kind(spec: dataclasses.Field) -> str:
    """How a form asks for option ``spec``: ``several`` of its choices, ``one`` of them, or a
    ``flag``, ``whole`` number, ``number``, ``text`` or an uploaded ``file``.

    Raises:
        TypeError: the option's type is one no form control holds (a new kind of option
            needs its control in the Space and its reading in ``service.options_from_form``).
    """
    declared = str(spec.type)
    if declared.startswith("tuple"):
        return "several"
    if spec.metadata["form"] is not None and spec.metadata["form"].choices:
        return "one"
    if spec.metadata["form"] is not None and spec.metadata["form"].upload:
        return "file"
    base = declared.split("|")[0].strip()
    if base not in _FORM_KINDS:
        raise TypeError(f"ExportOptions.{spec.name}: no form control holds a {declared}")
    return _FORM_KINDS[base]


def variant_filename(qmode: str, qembedding: str | None) -> str:
    """The file name of a variant: ``model-{qmode}[-emb{qembedding}].pte``."""
    return f"model-{qmode}" + (f"-emb{qembedding}" if qembedding else "") + ".pte"


# Arguments of the CLI's commands that are not export options, as errors name them.
_COMMAND_SPELLINGS = {
    "from_dir": "--from",
    "output": "-o/--output",
    "no_chat": "--no-chat",
    "exist_ok": "--exist-ok",
    "no_calibration": "--no-calibration",
}
declare_spellings({**_COMMAND_SPELLINGS, **{spec.name: cli_flags(spec)[0] for spec in option_fields()}})

__all__ = [
    "ExportOptions",
    "FormControl",
    "FORM_NONE",
    "form_fields",
    "form_kind",
    "options_with",
    "option_fields",
    "cli_flags",
    "variant_filename",
    "DEFAULT_QUALITY_TOKENS",
]
