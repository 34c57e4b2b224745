"""Vision-language models cut into the file's three methods (vision_encoder, token_embedding, text_decoder), per family: what both exporting and running need."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hub_export.errors import InputError
from hub_export.tasks.text_generation.export import ATTENTION_NAME, register_attention
from hub_export.tasks.text_generation.kv_cache import ForwardContext, KVCache, plan_layers

METHODS = ("vision_encoder", "token_embedding", "text_decoder")


MAX_IMAGES = 8  # a prompt's images (each also needs its tokens of the cache)


def _side(value) -> int:
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def _tower_and_projector(model: nn.Module) -> nn.Module:
    return nn.ModuleList([model.model.vision_tower, model.model.multi_modal_projector])


def _language_model(model: nn.Module) -> nn.Module:
    return model.model.language_model


def _tower_side(config) -> int:
    return _side(config.vision_config.image_size)


@dataclass(frozen=True)
class Family:
    """How one vision-language architecture turns pixels into embeddings and where its text model lives."""

    name: str
    model_types: tuple[str, ...]
    image_features: Callable[[nn.Module, torch.Tensor], torch.Tensor]  # (model, normalised pixels) -> [1, n, d]
    image_tokens: Callable[[Any], int]  # embeddings one image adds to the prompt
    # The defaults are transformers' usual layout (LLaVA's): model.model.{vision_tower,
    # multi_modal_projector, language_model} and a vision config's image_size.
    vision_module: Callable[[nn.Module], nn.Module] = _tower_and_projector  # quantized with --qmode-encoder
    language_model: Callable[[nn.Module], nn.Module] = _language_model  # the decoder body, called with inputs_embeds
    image_size: Callable[[Any], int] = _tower_side  # the side of the square the vision tower takes
    markers: tuple[str, str] = ("", "")  # text the prompt carries before and after each image's embeddings
    placeholder: str = "<image>"  # what the chat template writes where an image goes


def _idefics3_features(model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    # Idefics3's embeddings bucket patch positions for padded images of any size; for one
    # full square image the positions are simply 0..patches-1, which exports without the
    # data-dependent bucketing.
    tower = model.model.vision_model
    patches = tower.embeddings.patch_embedding(pixels).flatten(2).transpose(1, 2)
    positions = torch.arange(patches.shape[1], device=pixels.device).unsqueeze(0)
    # contiguous: the patches are a transposed view, and the connector's pixel shuffle views its input
    hidden = (patches + tower.embeddings.position_embedding(positions)).contiguous()
    hidden = tower.encoder(inputs_embeds=hidden).last_hidden_state
    return model.model.connector(tower.post_layernorm(hidden).contiguous())


def _llava_features(model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    config = model.config
    layers = config.vision_feature_layer
    out = model.model.vision_tower(pixels, output_hidden_states=True)
    if isinstance(layers, int):
        selected = out.hidden_states[layers]
    else:
        selected = torch.cat([out.hidden_states[i] for i in layers], dim=-1)
    if config.vision_feature_select_strategy == "default":
        selected = selected[:, 1:]  # the [CLS] position is not an image token
    return model.model.multi_modal_projector(selected)


def _llava_tokens(config) -> int:
    vision = config.vision_config
    patches = (vision.image_size // vision.patch_size) ** 2
    return patches + (0 if config.vision_feature_select_strategy == "default" else 1)


def _internvl_features(model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    config = model.config
    out = model.model.get_image_features(
        pixel_values=pixels,
        vision_feature_layer=config.vision_feature_layer,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
    )
    return out.pooler_output


def _internvl_tokens(config) -> int:
    vision = config.vision_config
    patches = (_side(vision.image_size) // _side(vision.patch_size)) ** 2
    return int(patches * config.downsample_ratio**2)


IDEFICS3 = Family(
    name="Idefics3 / SmolVLM",
    model_types=("idefics3", "smolvlm"),
    image_features=_idefics3_features,
    vision_module=lambda model: nn.ModuleList([model.model.vision_model, model.model.connector]),
    language_model=lambda model: model.model.text_model,
    image_tokens=lambda config: int(
        (config.vision_config.image_size // config.vision_config.patch_size) ** 2 / config.scale_factor**2
    ),
    image_size=lambda config: int(config.vision_config.image_size),
    markers=("<fake_token_around_image><global-img>", "<fake_token_around_image>"),
)


LLAVA = Family(
    name="LLaVA",
    model_types=("llava",),
    image_features=_llava_features,
    image_tokens=_llava_tokens,
)


INTERNVL = Family(
    name="InternVL",
    model_types=("internvl",),
    image_features=_internvl_features,
    image_tokens=_internvl_tokens,
    markers=("<img>", "</img>"),
    placeholder="<IMG_CONTEXT>",
)


FAMILIES = {model_type: family for family in (IDEFICS3, LLAVA, INTERNVL) for model_type in family.model_types}


def family_of(config) -> Family:
    """The :class:`Family` of a loaded config (or a ``config.json`` dict).

    Raises:
        InputError: the architecture is not a supported vision-language family.
    """
    model_type = config.get("model_type") if isinstance(config, dict) else config.model_type
    if model_type not in FAMILIES:
        raise InputError(
            f"{model_type!r} is not a vision-language family hub-export exports; supported: "
            f"{', '.join(sorted(FAMILIES))} (see `hub-export archs`)"
        )
    return FAMILIES[model_type]


def _processor_settings(folder: Path | None) -> dict:
    try:
        settings = json.loads((Path(folder) / "preprocessor_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        settings = {}
    return settings if isinstance(settings, dict) else {}


def _channel_stats(settings: dict, key: str, default: float) -> list[float]:
    value = settings.get(key, default)
    values = [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)] * 3
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise InputError(f"preprocessor_config.json has an unusable {key}: {value!r}; expected three numbers")
    return values


class VisionEncoder(nn.Module):
    """``vision_encoder``: RGB bytes ``[1, 3, size, size]`` -> image embeddings ``[1, tokens, hidden]``."""

    def __init__(self, model: nn.Module, family: Family, folder: Path | None):
        super().__init__()
        settings = _processor_settings(folder)
        self.model, self.family = model, family
        scale = float(settings.get("rescale_factor", 1 / 255))
        mean = torch.tensor(_channel_stats(settings, "image_mean", 0.5)).view(1, 3, 1, 1)
        std = torch.tensor(_channel_stats(settings, "image_std", 0.5)).view(1, 3, 1, 1)
        # (x * scale - mean) / std, folded into one multiply-add
        self.register_buffer("gain", scale / std, persistent=False)
        self.register_buffer("offset", -mean / std, persistent=False)

    def normalise(self, image: torch.Tensor) -> torch.Tensor:
        return image.to(torch.float32) * self.gain + self.offset

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.family.image_features(self.model, self.normalise(image))


class TokenEmbedding(nn.Module):
    """``token_embedding``: token ids ``[1, n]`` -> ``[1, n, hidden]`` (Gemma-style scaling included)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.embed = model.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids)


class EmbeddingsDecoder(nn.Module):
    """``text_decoder``: embeddings ``[1, n, hidden]`` and cache positions ``[n]`` -> scores ``[1, 1, vocab]``.

    The cache and attention are a text-generation file's (:class:`hub_export.tasks.text_generation.export.ExportableDecoder`);
    only the text model's attention is switched to the fused kernel, the vision tower keeps its own.
    """

    def __init__(self, model: nn.Module, family: Family, max_seq_len: int):
        super().__init__()
        register_attention()
        text_config = model.config.get_text_config()
        text_config._attn_implementation = ATTENTION_NAME
        self.model = family.language_model(model)
        self.lm_head = model.lm_head
        self.layout = plan_layers(text_config, max_seq_len)
        self.max_seq_len = self.layout.max_seq_len
        self.cache = KVCache(self.layout, dtype=torch.float32)

    def forward(self, inputs_embeds: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        start_pos = cache_position[0].item()
        torch._check(start_pos >= 0)
        torch._check(start_pos < self.max_seq_len)
        with ForwardContext(self.cache, start_pos):
            hidden = self.model(
                inputs_embeds=inputs_embeds,
                position_ids=cache_position.unsqueeze(0),
                cache=self.cache,
                use_cache=True,
            ).last_hidden_state
        return self.lm_head(hidden[:, -1:])


class VisionLanguageModel(nn.Module):
    """The three methods of a vision-language file, as one module tree."""

    def __init__(self, model: nn.Module, folder: Path | None, max_seq_len: int):
        super().__init__()
        self.config = model.config
        self.family = family_of(model.config)
        self.vision_encoder = VisionEncoder(model, self.family, folder)
        self.token_embedding = TokenEmbedding(model)
        self.text_decoder = EmbeddingsDecoder(model, self.family, max_seq_len)

    @property
    def image_size(self) -> int:
        return self.family.image_size(self.config)

    @property
    def image_tokens(self) -> int:
        return self.family.image_tokens(self.config)


def zero_cache(wrapped: VisionLanguageModel) -> None:
    wrapped.text_decoder.cache.reset()
