"""Adapters as sources: a PEFT LoRA folder or Hub repo, checked against its base and merged into it.

A fine-tune published as a PEFT adapter (``adapter_config.json`` and
``adapter_model.safetensors``, naming its base in ``base_model_name_or_path``) becomes an
ordinary local source: the base is resolved like any source, the adapter's shapes are checked
against the base's from the safetensors headers (nothing loaded yet), then PEFT applies it to
the fp32 base and merges it. The merged folder is cached by the adapter's and the base's
bytes, and the pipeline (GPTQ, the mixed plan, verification) runs on it: every variant is
checked against the eager model with the adapter applied.

Example:
    >>> adapter = read_adapter(Path("my-smollm2-lora"), "my-smollm2-lora")
    >>> adapter.rank, adapter.targets
    (8, ('q_proj', 'v_proj'))
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from hub_export.errors import InputError, SourceError, opt

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1 << 20
# Adapter methods PEFT writes that are not LoRA: refused by name (PEFT would merge some, but
# each is its own arithmetic to verify).
_OTHER_METHODS = {"IA3", "LOHA", "LOKR", "ADALORA", "OFT", "BOFT", "VERA", "PROMPT_TUNING", "PREFIX_TUNING",
                  "P_TUNING", "FOURIERFT", "HRA", "VBLORA", "LN_TUNING", "BONE", "RANDLORA", "SHIRA", "C3A"}  # fmt: skip
_TIED = ("lm_head", "embed_tokens", "wte", "embed_in", "embed_out")
# Adapter weight names: base_model.model.<module>.lora_A.weight (PEFT's own prefix and LoRA's parts).
LORA_PART = re.compile(r"^base_model\.model\.(?P<module>.+?)\.(?P<part>lora_A|lora_B|lora_embedding_A|lora_embedding_B|"
                   r"lora_magnitude_vector)(?:\.weight)?$")  # fmt: skip


@dataclass(frozen=True)
class Adapter:
    """A checked PEFT LoRA adapter on disk."""

    path: Path
    name: str  # Hub id or folder name
    revision: str | None  # the Hub commit, None for a folder
    config: dict

    @property
    def base(self) -> str | None:
        return self.config.get("base_model_name_or_path") or None

    @property
    def rank(self) -> int:
        return int(self.config["r"])

    @property
    def targets(self) -> tuple[str, ...]:
        targets = self.config.get("target_modules") or ()
        return (targets,) if isinstance(targets, str) else tuple(sorted(targets))  # PEFT writes a set's order

    @cached_property
    def sha256(self) -> str:
        """Of the adapter's weights: what the merge cache and the manifest know it by (read once)."""
        return hashlib.sha256((self.path / ADAPTER_WEIGHTS).read_bytes()).hexdigest()

    def record(self) -> dict:
        """What the manifest and the card say of the adapter."""
        keys = ("r", "lora_alpha", "use_rslora", "use_dora", "modules_to_save")
        return {
            "id": self.name,
            "revision": self.revision,
            "base": self.base,
            **{key: self.config.get(key) for key in keys if self.config.get(key) not in (None, False)},
            "target_modules": list(self.targets),
            "sha256": self.sha256,
            **({"summary": summary} if (summary := card_summary(self.path / "README.md")) else {}),
        }


def card_summary(path: Path, limit: int = 400) -> str | None:
    """The first paragraph of an adapter's own card, as plain text (its front matter and headings left out)."""
    if not path.is_file():
        return None
    text = path.read_bytes()[:65536].decode("utf-8", errors="replace")
    if text.startswith("---"):
        text = text.split("\n---", 2)[-1] if text.count("\n---") >= 1 else ""
    paragraphs = [" ".join(block.split()) for block in re.split(r"\n\s*\n", text)]
    first = next((p for p in paragraphs if p and not p.startswith(("#", "<", "!", "|", "```"))), None)
    if first is None:
        return None
    first = "".join(ch for ch in first if ch.isprintable())
    return first if len(first) <= limit else first[: limit - 1].rsplit(" ", 1)[0] + "…"


def is_adapter_folder(folder: Path) -> bool:
    """A folder that holds an adapter and no full model."""
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def read_adapter(folder: Path, name: str, revision: str | None = None) -> Adapter:
    """The adapter in ``folder``, its config checked.

    Raises:
        InputError: not a LoRA adapter hub-export merges exactly (the method or option named), or its config is
            not what PEFT writes.
        SourceError: the weights are missing.
    """
    path = folder / ADAPTER_CONFIG
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise InputError(f"{name}/{ADAPTER_CONFIG} is over {MAX_CONFIG_BYTES >> 20} MB; it is not PEFT's")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{name}/{ADAPTER_CONFIG} is not JSON ({type(error).__name__})") from None
    if not isinstance(config, dict):
        raise InputError(f"{name}/{ADAPTER_CONFIG} is not a JSON object")
    _check_method(config, name)
    if not (folder / ADAPTER_WEIGHTS).is_file():
        found = sorted(p.name for p in folder.glob("adapter_model*"))
        raise SourceError(
            f"{name} has no {ADAPTER_WEIGHTS}"
            + (f" (only {found[0]}, a pickle that can run code: save the adapter with safetensors)" if found else "")
        )
    return Adapter(folder, name, revision, config)


def _check_method(config: dict, name: str) -> None:
    method = str(config.get("peft_type", "")).upper()
    if method in _OTHER_METHODS:
        raise InputError(f"{name} is a {method} adapter; hub-export exports LoRA adapters (merge it with PEFT first)")
    if method != "LORA":
        raise InputError(f"{name}/{ADAPTER_CONFIG} has peft_type {config.get('peft_type')!r}; expected LORA")
    task = config.get("task_type")
    if task not in (None, "CAUSAL_LM"):
        raise InputError(f"{name} adapts a {task} model; hub-export exports adapters of causal language models")
    rank = config.get("r")
    if not isinstance(rank, int) or not 1 <= rank <= 4096:
        raise InputError(f"{name}/{ADAPTER_CONFIG} has rank r={rank!r}; expected a whole number from 1 to 4096")
    if not isinstance(config.get("lora_alpha"), (int, float)):
        raise InputError(f"{name}/{ADAPTER_CONFIG} has no numeric lora_alpha")
    if config.get("bias", "none") != "none":
        raise InputError(f"{name} trains biases (bias={config.get('bias')!r}); only bias='none' adapters are merged")
    # LoRA options whose arithmetic is not a plain low-rank update of existing weights, each refused by name.
    for option in ("megatron_config", "layer_replication", "alora_invocation_tokens", "lora_bias", "target_parameters",
                   "trainable_token_indices", "arrow_config", "use_qalora", "use_bdlora"):  # fmt: skip
        if config.get(option):
            raise InputError(f"{name} uses {option}, which hub-export does not merge; export the merged model instead")
    targets = config.get("target_modules")
    if not (isinstance(targets, str) or (isinstance(targets, list) and all(isinstance(t, str) for t in targets))):
        raise InputError(f"{name}/{ADAPTER_CONFIG} has no target_modules list")


def check_against_base(adapter: Adapter, base_folder: Path, base_name: str) -> None:
    """Refuse an adapter made for another base, from the safetensors headers of both (nothing is loaded).

    Raises:
        InputError: a module the adapter changes is not in the base, its shapes differ, its rank is not the
            config's, or it changes weights the base ties together.
    """
    adapted = _shapes([adapter.path / ADAPTER_WEIGHTS])
    base = _shapes(sorted(base_folder.glob("*.safetensors")))
    modules_to_save = adapter.config.get("modules_to_save") or []
    tied = "lm_head.weight" not in base  # a causal LM without its own output weight reads the input embedding's
    for key, shape in adapted.items():
        match = LORA_PART.match(key)
        module = match.group("module") if match else key.removeprefix("base_model.model.").rsplit(".", 1)[0]
        module = module.removesuffix(".base_layer")  # PEFT saves a targeted embedding's own weight under it
        if tied and module.split(".")[-1] in _TIED:
            raise InputError(
                f"{adapter.name} changes {module}, which {base_name} ties to its other embedding; merging would "
                "change both, so it is refused (train the adapter without it)"
            )
        weight = base.get(f"{module}.weight")
        if weight is None:
            raise InputError(
                f"{adapter.name} changes {module}, which {base_name} does not have: it was made for another base "
                f"(its own says {adapter.base!r}); pass the right one with {opt('adapter')} beside it"
            )
        if match is None:
            if any(key.endswith(f"{m}.weight") for m in modules_to_save) and tuple(shape) != tuple(weight):
                raise InputError(f"{adapter.name} replaces {module} with {list(shape)}, but {base_name} has "
                                 f"{list(weight)}: resized embeddings are not merged")  # fmt: skip
            continue
        _check_part(adapter, base_name, module, match.group("part"), shape, weight)


def _check_part(adapter: Adapter, base_name: str, module: str, part: str, shape: list, weight: list) -> None:
    # LoRA's factors: A is [r, in] and B [out, r] for a linear weight [out, in]; an embedding
    # [vocab, dim] has A [r, vocab] and B [dim, r]; DoRA's magnitude is [out].
    expected = {
        "lora_A": (None, weight[1]),
        "lora_B": (weight[0], None),
        "lora_embedding_A": (None, weight[0]),
        "lora_embedding_B": (weight[1], None),
        "lora_magnitude_vector": (weight[0],),
    }[part]
    fits = len(shape) == len(expected) and all(e is None or e == s for e, s in zip(expected, shape, strict=True))
    if not fits:
        raise InputError(
            f"{adapter.name} was made for another base: its {part} of {module} is {list(shape)}, which does not fit "
            f"{base_name}'s {list(weight)} (its own base is {adapter.base!r})"
        )


def _shapes(files: list[Path]) -> dict[str, list[int]]:
    from safetensors import safe_open

    shapes = {}
    for file in files:
        try:
            with safe_open(str(file), "pt") as weights:
                for key in weights.keys():
                    shapes[key] = list(weights.get_slice(key).get_shape())
        except (OSError, ValueError, RuntimeError) as error:
            raise SourceError(f"{file.name} is not a readable safetensors file ({type(error).__name__})") from None
    return shapes


def merged_folder(
    adapter: Adapter, base_folder: Path, base_key: str, cache: Path, companions: list[str], say=None
) -> tuple[Path, dict]:
    """``adapter`` merged into the fp32 base in ``base_folder``, as a model folder kept in ``cache``, with the
    ``companions`` files (the tokenizer's) of the adapter, else of the base.

    ``base_key`` identifies the base's bytes (a Hub commit or a folder digest): the merge is
    reused when the same adapter meets the same base. Returns the folder and what the merge
    measured (the merged model against PEFT's, the adapted model against the base).
    """
    digest = hashlib.sha256((adapter.sha256 + json.dumps(adapter.config, sort_keys=True) + base_key)
                            .encode()).hexdigest()[:32]  # fmt: skip
    target = cache / digest
    if (target / "merge.json").is_file():
        return target, json.loads((target / "merge.json").read_text())
    if say:
        say(f"merging {adapter.name} into its base (fp32), once")
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest}.partial-", dir=cache))
    try:
        measured = _merge(adapter, base_folder, staging)
        _copy_companions(adapter.path, base_folder, staging, companions)
        (staging / "merge.json").write_text(json.dumps(measured, indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target, measured


PROBE = "The history of the city begins with a small settlement by the river, where traders met each spring."


def _merge(adapter: Adapter, base_folder: Path, out: Path) -> dict:
    """PEFT's merge in fp32, with the logits of a probe text before and after it."""
    import torch
    from peft import PeftModel
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32).eval()
    tokenizer_dir = adapter.path if (adapter.path / "tokenizer.json").is_file() else base_folder
    ids = torch.tensor([Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(PROBE).ids[:64]])
    with torch.no_grad():
        base = model(ids).logits[0]
        peft_model = PeftModel.from_pretrained(model, adapter.path, is_trainable=False).eval()
        adapted = peft_model(ids).logits[0]
        merged = peft_model.merge_and_unload(safe_merge=True)
        after = merged(ids).logits[0]
    merged.save_pretrained(out, safe_serialization=True)
    log_adapted = adapted.log_softmax(-1)
    return {
        "max_logit_diff_vs_peft": float((after - adapted).abs().max()),
        "kl_adapted_vs_base": float((log_adapted.exp() * (log_adapted - base.log_softmax(-1))).sum(-1).mean()),
        "top1_changed_vs_base": float((adapted.argmax(-1) != base.argmax(-1)).float().mean()),
        "probe_tokens": int(ids.shape[1]),
    }


def _copy_companions(adapter_folder: Path, base_folder: Path, out: Path, companions: list[str]) -> None:
    """The tokenizer (the adapter's own when it has one), generation config and the adapter's card."""
    for name in [*companions, "generation_config.json"]:
        for folder in (adapter_folder, base_folder):
            if (folder / name).is_file():
                shutil.copyfile(folder / name, out / name)
                break
    if (adapter_folder / "README.md").is_file():
        shutil.copyfile(adapter_folder / "README.md", out / "README.md")
