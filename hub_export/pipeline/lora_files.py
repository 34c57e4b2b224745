"""Adapter files over one base: LoRA kept apart from the base's weights instead of merged into them.

With ``--lora-files`` each variant is two files. The base's weights, quantized exactly as the
base's own export would be (GPTQ calibrated on the base, not on the adapted model), go to
``base-QMODE.ptd``; the program and the adapter's low-rank factors (fp32, unquantized, as
ExecuTorch's own LoRA export keeps them) go to ``lora-ADAPTER-QMODE.pte``. Because XNNPACK names each
weight in a data file by the sha256 of its bytes, every adapter of one base writes a
byte-identical ``.ptd``: an app ships the base once and each adapter as a file of a few MB.

ExecuTorch's ``export_llm`` puts the adapter's weights in a ``.ptd`` of their own; here they
ride in the program's file, because ExecuTorch 1.5's Python runtime and ``TextLLMRunner``
take one data file. A device needs ``lora-ADAPTER-QMODE.pte`` + ``base-QMODE.ptd`` either way.

Example:
    >>> attached = attach_lora(model, adapter)  # model: the base, quantized or not
    >>> logits = model(ids).logits  # the base with the adapter applied, as PEFT computes it
    >>> detach_lora(attached)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from hub_export.errors import InputError, opt
from hub_export.pipeline.adapter import ADAPTER_WEIGHTS, LORA_PART, Adapter

# Names the adapter's factors carry in the exported program (placeholders ``p_..._lora_a_weight``): what stays
# in the program's file while everything else goes to the base's data file.
LORA_MARK = "lora_"
# PEFT options that are not a low-rank update added to a linear's output: each needs the merged file.
_MERGE_ONLY = ("use_dora", "modules_to_save", "rank_pattern", "alpha_pattern")


class LoraLinear(nn.Module):
    """``base(x) + scale * lora_b(lora_a(x))``: PEFT's LoRA forward, with ``base`` left as it is (quantized or
    not) and the factors in fp32."""

    def __init__(self, base: nn.Module, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float):
        super().__init__()
        self.base = base
        self.lora_a = nn.Linear(lora_a.shape[1], lora_a.shape[0], bias=False)
        self.lora_b = nn.Linear(lora_b.shape[1], lora_b.shape[0], bias=False)
        with torch.no_grad():
            self.lora_a.weight.copy_(lora_a.float())
            self.lora_b.weight.copy_(lora_b.float())
        self.scale = float(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_b(self.lora_a(x)) * self.scale


@dataclass
class Attached:
    """Where :func:`attach_lora` put its modules, to put the base's own back."""

    model: nn.Module
    replaced: list[tuple[str, nn.Module]]


def check_separable(adapter: Adapter) -> None:
    """Refuse, in one line, an adapter whose config asks for more than a low-rank update of linear layers (a target
    that is not a linear layer is refused as the factors are attached, :func:`attach_lora`).

    Raises:
        InputError: DoRA, ``modules_to_save``, per-module ranks or alphas.
    """
    for option in _MERGE_ONLY:
        if adapter.config.get(option):
            raise InputError(f"{adapter.name} uses {option}, which only a merged file carries; drop "
                             f"{opt('lora_files')}")  # fmt: skip


def scale_of(adapter: Adapter) -> float:
    """PEFT's LoRA scale: alpha / r, or alpha / sqrt(r) with rsLoRA."""
    alpha, rank = float(adapter.config["lora_alpha"]), adapter.rank
    return alpha / math.sqrt(rank) if adapter.config.get("use_rslora") else alpha / rank


def factors(adapter: Adapter) -> dict[str, dict[str, torch.Tensor]]:
    """The adapter's factors by module name: ``{"model.layers.0.self_attn.q_proj": {"lora_A": ..., "lora_B": ...}}``."""
    from safetensors.torch import load_file

    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(str(Path(adapter.path) / ADAPTER_WEIGHTS)).items():
        match = LORA_PART.match(key)
        if match is None or match.group("part") not in ("lora_A", "lora_B"):
            raise InputError(f"{adapter.name} holds {key}, which is not a LoRA factor of a linear layer; drop "
                             f"{opt('lora_files')} to merge it")  # fmt: skip
        found.setdefault(match.group("module"), {})[match.group("part")] = tensor
    incomplete = sorted(module for module, parts in found.items() if len(parts) != 2)
    if incomplete:
        raise InputError(f"{adapter.name} has only one LoRA factor of {incomplete[0]}; it is not what PEFT writes")
    return found


def attach_lora(model: nn.Module, adapter: Adapter) -> Attached:
    """Wrap each linear ``adapter`` targets in ``model`` (in place) in a :class:`LoraLinear`.

    Raises:
        InputError: a targeted module is not a linear layer of ``model``.
    """
    scale, replaced = scale_of(adapter), []
    for name, parts in sorted(factors(adapter).items()):
        parent_name, _, attribute = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        base = getattr(parent, attribute, None)
        weight = getattr(base, "weight", None)
        if weight is None or weight.dim() != 2 or isinstance(base, nn.Embedding):
            raise InputError(f"{adapter.name} adapts {name}, which is not a linear layer of the base; drop "
                             f"{opt('lora_files')} to merge it")  # fmt: skip
        setattr(parent, attribute, LoraLinear(base, parts["lora_A"], parts["lora_B"], scale))
        replaced.append((name, base))
    return Attached(model, replaced)


def detach_lora(attached: Attached) -> None:
    """Put back the layers :func:`attach_lora` wrapped."""
    for name, base in attached.replaced:
        parent_name, _, attribute = name.rpartition(".")
        setattr(attached.model.get_submodule(parent_name), attribute, base)


def is_adapter_weight(name: str) -> bool:
    """Whether an exported program's weight (a placeholder's name) is one of the adapter's factors."""
    return LORA_MARK in name.lower()


def slug(adapter_name: str) -> str:
    """A file-name-safe short name of an adapter: ``my-support-lora`` for ``alice/My_Support.LoRA``."""
    words = re.findall(r"[a-z0-9]+", adapter_name.rsplit("/", 1)[-1].lower())
    return "-".join(words)[:48].strip("-") or "adapter"


def program_name(adapter_name: str, variant_name: str) -> str:
    """``lora-my-adapter-8da4w-emb8w.pte`` for ``model-8da4w-emb8w.pte``: each adapter's program has its own name,
    so the adapters of one base sit side by side in one repo."""
    return f"lora-{slug(adapter_name)}-" + variant_name.removeprefix("model-")


def base_data_name(variant_name: str) -> str:
    """``base-8da4w-emb8w.ptd`` for ``model-8da4w-emb8w.pte``: the data file every adapter of one base shares."""
    return "base-" + Path(variant_name).stem.removeprefix("model-") + ".ptd"


def variant_record(adapter: Adapter) -> dict:
    """What a variant's manifest entry says of the adapter it carries (a repo may hold several)."""
    return {"id": adapter.name, "sha256": adapter.sha256, "base": adapter.base}
