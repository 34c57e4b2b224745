"""Tiny random-weight models of every task, with real tokenizers, built in seconds offline.

Used by ``make demo``, the tests and the benchmarks: nothing is downloaded. The
tokenizer is a byte-level BPE trained on a short built-in text, so multi-byte UTF-8
characters split across tokens exactly as they do with real models.
"""

from __future__ import annotations

import json
from pathlib import Path

from hub_export.models.packaged import packaged_smollm2, packaged_whisper
from hub_export.pipeline.gguf_source import converted_folder

CORPUS = """\
The quick brown fox jumps over the lazy dog. ExecuTorch runs PyTorch models on phones,
laptops and microcontrollers. Hugging Face hosts models, datasets and Spaces.
Quantization trades a little accuracy for a smaller, faster model: int4 weights with
int8 dynamic activations are a good default on mobile CPUs.
Once upon a time, a small language model learned to write short stories about cats,
robots, oceans and mountains. Café, naïve, façade, jalapeño, über, 東京, 🙂 and 🚀.
def main():\n    print("hello, world")\n
"""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(vocab_size: int = 512):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on :data:`CORPUS`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS] * 4, trainer=trainer)
    return tokenizer


def tiny_llama_config(vocab_size: int = 512, **overrides):
    """A 2-layer Llama config with GQA and tied embeddings; ``overrides`` win."""
    from transformers import LlamaConfig

    settings = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=0,
        pad_token_id=None,
    )
    settings.update(overrides)
    return LlamaConfig(**settings)


def save_tokenizer(tokenizer, folder: Path, model_max_length: int = 512) -> None:
    """Write ``tokenizer.json`` and a ``tokenizer_config.json`` with a chat template."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": SPECIAL_TOKENS[0],
        "bos_token": None,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def build_tiny_model(folder: str | Path, config=None, seed: int = 0, card: str | None = None) -> Path:
    """Save a random-weight model, its tokenizer and a model card into ``folder``.

    Example:
        >>> path = build_tiny_model("/tmp/tiny-llama")
        >>> sorted(p.name for p in path.iterdir())[:3]
        ['README.md', 'config.json', 'generation_config.json']
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    folder = Path(folder)
    tokenizer = train_tokenizer()
    config = config or tiny_llama_config(vocab_size=tokenizer.get_vocab_size())
    if config.pad_token_id is None:
        # Real configs set a padding token (SmolLM2: 2, Gemma: 0), which gives the embedding a
        # padding_idx; use one the verification text contains so its row is exercised.
        config.pad_token_id = tokenizer.encode(" the").ids[0]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config = GenerationConfig(eos_token_id=[config.eos_token_id], bos_token_id=config.bos_token_id)
    model.save_pretrained(folder)
    save_tokenizer(tokenizer, folder, config.max_position_embeddings)
    (folder / "README.md").write_text(
        card
        or "---\nlicense: apache-2.0\nlanguage:\n- en\n---\n# Tiny demo model\n\nRandom weights, for tests and demos.\n"
    )
    return folder


# Small settings per encoder family: each config class names them its own way.
_BERT_LIKE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
# ModernBERT's config names the special tokens' ids: train_wordpiece's [PAD] [UNK] [CLS] [SEP] [MASK] are 0-4.
_WORDPIECE_IDS = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)
_PADDED_POSITIONS = dict(pad_token_id=1, max_position_embeddings=514)  # positions count from padding_idx + 1
_TINY_ENCODERS = {
    "bert": _BERT_LIKE,
    "roberta": {**_BERT_LIKE, **_PADDED_POSITIONS},
    "xlm-roberta": {**_BERT_LIKE, **_PADDED_POSITIONS},
    "distilbert": dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128),
    "mpnet": {**_BERT_LIKE, "max_position_embeddings": 514},
    # ModernBERT: alternating global and sliding-window (local) attention, no token types;
    # a window of 16 makes the local layers matter at test lengths.
    "modernbert": {
        **_BERT_LIKE,
        **dict(num_hidden_layers=3, intermediate_size=96, local_attention=16, global_attn_every_n_layers=3),
        **_WORDPIECE_IDS,
    },
}


def train_wordpiece(vocab_size: int = 1000):
    """A BERT-style WordPiece ``tokenizers.Tokenizer`` ([CLS] text [SEP]) trained on the shipped English texts."""
    from importlib import resources

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False)
    text = resources.files("hub_export").joinpath("data", "calib_en.txt").read_text(encoding="utf-8")
    tokenizer.train_from_iterator([text, CORPUS], trainer=trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tokenizer


def build_tiny_encoder(
    folder: str | Path, model_type: str = "bert", pooling: str = "mean", normalize: bool = True, seed: int = 0
) -> Path:
    """Save a random-weight 2-layer encoder of ``model_type`` as a sentence-transformers folder.

    Example:
        >>> path = build_tiny_encoder("/tmp/tiny-bert")
        >>> (path / "1_Pooling" / "config.json").is_file()
        True
    """
    import torch
    from transformers import AutoConfig, AutoModel

    folder = Path(folder)
    tokenizer = train_wordpiece()
    config = AutoConfig.for_model(model_type, vocab_size=tokenizer.get_vocab_size(), **_TINY_ENCODERS[model_type])
    torch.manual_seed(seed)
    model = AutoModel.from_config(config).eval()
    model.save_pretrained(folder)
    _save_wordpiece(tokenizer, folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    keys = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens"}
    pooling_config = {
        "word_embedding_dimension": model.config.hidden_size
        if hasattr(model.config, "hidden_size")
        else model.config.dim,
        **{key: name == pooling for name, key in keys.items()},
    }
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    (folder / "README.md").write_text(
        "---\nlicense: apache-2.0\nlanguage:\n- en\n---\n# Tiny encoder\n\nRandom weights.\n"
    )
    return folder


def _save_wordpiece(tokenizer, folder: Path) -> None:
    tokenizer.save(str(folder / "tokenizer.json"))
    special = {
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "mask_token": "[MASK]",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **special}))


def build_tiny_masked_lm(folder: str | Path, model_type: str = "bert", seed: int = 0) -> Path:
    """Save a random-weight 2-layer masked language model (fill-mask) of ``model_type``.

    Example:
        >>> build_tiny_masked_lm("/tmp/tiny-mlm").joinpath("tokenizer.json").is_file()
        True
    """
    import torch
    from transformers import AutoConfig, AutoModelForMaskedLM

    folder = Path(folder)
    tokenizer = train_wordpiece()
    config = AutoConfig.for_model(model_type, vocab_size=tokenizer.get_vocab_size(), **_TINY_ENCODERS[model_type])
    torch.manual_seed(seed)
    AutoModelForMaskedLM.from_config(config).eval().save_pretrained(folder)
    _save_wordpiece(tokenizer, folder)
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# Tiny masked LM\n\nRandom weights.\n")
    return folder


# Small vision models, 32x32 images: (config settings, image processor class, its settings).
_SMALL_IMAGES = dict(size={"height": 32, "width": 32})
_TINY_VISION = {
    "vit": (dict(image_size=32, patch_size=8, **_BERT_LIKE), "ViTImageProcessor", _SMALL_IMAGES),
    "deit": (  # the distilled DeiT checkpoints' class: a [CLS] and a distillation head, averaged
        dict(image_size=32, patch_size=8, architectures=["DeiTForImageClassificationWithTeacher"], **_BERT_LIKE),
        "DeiTImageProcessor",
        dict(size={"height": 40, "width": 40}, crop_size={"height": 32, "width": 32}),
    ),
    "mobilevit": (
        dict(image_size=32, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64]),
        "MobileViTImageProcessor",
        dict(size={"shortest_edge": 36}, crop_size={"height": 32, "width": 32}),
    ),
    "convnext": (
        dict(image_size=32, hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 2, 1]),
        "ConvNextImageProcessor",
        dict(size={"shortest_edge": 32}),
    ),
    "efficientnet": (
        # hidden_dim: the last convolution's width, round_filters(1280 * width_coefficient)
        dict(image_size=32, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320),
        "EfficientNetImageProcessor",
        _SMALL_IMAGES,
    ),
}
TINY_LABELS = ("cat", "dog", "car", "tree", "boat", "cup", "shoe", "bird", "house", "clock")


def _calibrate_batch_norms(model, image_size: int) -> None:
    """Set every batch norm's statistics from a batch of random images, so each normalises its input to unit
    scale (gated blocks such as EfficientNet's otherwise shrink a random model's activations to nothing)."""
    import torch

    norms = [module for module in model.modules() if isinstance(module, torch.nn.BatchNorm2d)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a plain average over the calibration batch
    model.train()
    with torch.no_grad():
        model(pixel_values=torch.randn(16, 3, image_size, image_size))
    model.eval()


def build_tiny_image_classifier(folder: str | Path, model_type: str = "vit", seed: int = 0) -> Path:
    """Save a random-weight image classifier of ``model_type`` (10 labels, 32x32 images) with its image processor.

    Example:
        >>> build_tiny_image_classifier("/tmp/tiny-vit").joinpath("preprocessor_config.json").is_file()
        True
    """
    import torch
    import transformers

    folder = Path(folder)
    settings, processor_class, processor_settings = _TINY_VISION[model_type]
    config = transformers.AutoConfig.for_model(
        model_type,
        id2label=dict(enumerate(TINY_LABELS)),
        label2id={label: index for index, label in enumerate(TINY_LABELS)},
        **settings,
    )
    torch.manual_seed(seed)
    model_class = getattr(transformers, (config.architectures or ["AutoModelForImageClassification"])[0])
    model = model_class(config) if config.architectures else model_class.from_config(config)
    with torch.no_grad():
        for module in model.modules():
            # Some families start their norms' scales near zero (MobileViT's batch norms): the
            # activations would vanish, every image would score the same, and no check could
            # tell one file from another.
            if isinstance(module, (torch.nn.BatchNorm2d, torch.nn.LayerNorm, torch.nn.GroupNorm)):
                module.weight.fill_(1.0)
                module.bias.zero_()
            elif isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
                torch.nn.init.kaiming_normal_(
                    module.weight, nonlinearity="linear"
                )  # unit gain: signals keep their size
        _calibrate_batch_norms(model, settings["image_size"])
    model.eval().save_pretrained(folder)
    getattr(transformers, processor_class)(**processor_settings).save_pretrained(folder)
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# Tiny image classifier\n\nRandom weights.\n")
    return folder


def build_tiny_whisper(folder: str | Path, seed: int = 0) -> Path:
    """Save a random-weight 2+2-layer Whisper (width 64) with the real tiny.en's tokenizer, generation settings
    and feature extractor (from the packaged model: :func:`packaged_whisper`).

    Example:
        >>> build_tiny_whisper("/tmp/tiny-whisper").joinpath("generation_config.json").is_file()
        True
    """
    import shutil

    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    folder, real = Path(folder), packaged_whisper()
    settings = json.loads((real / "config.json").read_text())
    small = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=128, decoder_ffn_dim=128, max_target_positions=64)  # fmt: skip
    config = WhisperConfig(**{**settings, **small})
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    for name in ("generation_config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(real / name, folder / name)
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# Tiny Whisper\n\nRandom weights.\n")
    return folder


def build_tiny_t5(folder: str | Path, seed: int = 0, gated: bool = False) -> Path:
    """Save a random-weight 2+2-layer T5 (``gated``: Flan-T5's gated-GELU feed-forward, untied head) with a small
    trained tokenizer (``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2; every text ends with ``</s>``).

    Example:
        >>> build_tiny_t5("/tmp/tiny-t5").joinpath("tokenizer.json").is_file()
        True
    """
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import T5Config, T5ForConditionalGeneration

    folder = Path(folder)
    tokenizer = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=600, special_tokens=["<pad>", "</s>", "<unk>"], show_progress=False)
    tokenizer.train_from_iterator([CORPUS], trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    feed_forward = dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False) if gated else {}
    config = T5Config(vocab_size=tokenizer.get_vocab_size(), d_model=64, d_kv=16, d_ff=128, num_layers=2,
                      num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, **feed_forward)  # fmt: skip
    torch.manual_seed(seed)
    T5ForConditionalGeneration(config).eval().save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# Tiny T5\n\nRandom weights.\n")
    return folder


VLM_IMAGE_TOKENS = [
    "<image>",
    "<fake_token_around_image>",
    "<global-img>",
    "<end_of_utterance>",
    "<IMG_CONTEXT>",
    "<img>",
    "</img>",
]
# A chat template in SmolVLM's shape: typed content parts, "<image>" where an image goes.
VLM_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}:"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %} {{ part['text'] }}"
    "{% elif part['type'] == 'image' %}<image>{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
_TINY_VLM_TEXT = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=False)  # fmt: skip


def build_tiny_vlm(folder: str | Path, model_type: str = "idefics3", seed: int = 0) -> Path:
    """Save a random-weight vision-language model of ``model_type`` (``idefics3``/``smolvlm``: a SigLIP
    tower, pixel-shuffle connector and Llama decoder on 64x64 images, 16 image tokens; ``llava``: a CLIP tower and
    MLP projector) with a byte-level tokenizer carrying the image tokens, a chat template and an image processor.

    Weights are drawn at unit gain so that each image moves the answer (a default 0.02-std init makes every image
    look the same to the decoder, and a check could not tell one from another).

    Example:
        >>> build_tiny_vlm("/tmp/tiny-smolvlm").joinpath("preprocessor_config.json").is_file()
        True
    """
    import torch
    from tokenizers import AddedToken
    from transformers import GenerationConfig

    folder = Path(folder)
    tokenizer = train_tokenizer()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in VLM_IMAGE_TOKENS])
    vocab = tokenizer.get_vocab_size()
    eos = tokenizer.token_to_id("<end_of_utterance>")
    text = dict(_TINY_VLM_TEXT, vocab_size=vocab, eos_token_id=eos, bos_token_id=None, pad_token_id=None)
    config, model_class, processor = _tiny_vlm_config(model_type, text, tokenizer)
    config.eos_token_id = eos
    template = VLM_CHAT_TEMPLATE.replace("<image>", "<IMG_CONTEXT>") if model_type == "internvl" else VLM_CHAT_TEMPLATE
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
                torch.nn.init.kaiming_normal_(module.weight, nonlinearity="linear")
    model.generation_config = GenerationConfig(eos_token_id=[eos])
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<end_of_utterance>", "bos_token": None,
                "model_max_length": 2048, "chat_template": template}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    (folder / "README.md").write_text(
        "---\nlicense: apache-2.0\n---\n# Tiny vision-language model\n\nRandom weights, for tests and demos.\n"
    )
    return folder


def _tiny_vlm_config(model_type: str, text: dict, tokenizer):
    """(config, model class, preprocessor settings) of :func:`build_tiny_vlm`'s ``model_type``."""
    image_token = tokenizer.token_to_id("<image>")
    if model_type in ("idefics3", "smolvlm"):
        import transformers

        prefix = "Idefics3" if model_type == "idefics3" else "SmolVLM"
        config = getattr(transformers, f"{prefix}Config")(
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=64, patch_size=8),
            text_config=text, scale_factor=2, image_token_id=image_token,
        )  # fmt: skip
        model_class = getattr(transformers, f"{prefix}ForConditionalGeneration")
        processor = {"image_processor_type": "Idefics3ImageProcessor", "do_image_splitting": False,
                     "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "rescale_factor": 1 / 255,
                     "size": {"longest_edge": 64}, "max_image_size": {"longest_edge": 64}}  # fmt: skip
    elif model_type == "llava":
        from transformers import LlavaConfig, LlavaForConditionalGeneration

        config = LlavaConfig(
            vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                               num_hidden_layers=3, num_attention_heads=2, image_size=32, patch_size=8,
                               projection_dim=32),
            text_config=text, image_token_id=image_token,
        )  # fmt: skip
        model_class = LlavaForConditionalGeneration
        processor = {"image_processor_type": "CLIPImageProcessor", "image_mean": [0.4815, 0.4578, 0.4082],
                     "image_std": [0.2686, 0.2613, 0.2758], "rescale_factor": 1 / 255,
                     "size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}}  # fmt: skip
    elif model_type == "internvl":
        from transformers import InternVLConfig, InternVLForConditionalGeneration

        image_token = tokenizer.token_to_id("<IMG_CONTEXT>")  # InternVL's placeholder
        config = InternVLConfig(
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=[64, 64], patch_size=[8, 8]),
            text_config=dict(text, model_type="qwen2"), downsample_ratio=0.5, image_token_id=image_token,
        )  # fmt: skip
        model_class = InternVLForConditionalGeneration
        processor = {"image_processor_type": "GotOcr2ImageProcessorFast", "image_mean": [0.485, 0.456, 0.406],
                     "image_std": [0.229, 0.224, 0.225], "rescale_factor": 1 / 255,
                     "size": {"height": 64, "width": 64}, "crop_to_patches": False}  # fmt: skip
    else:
        raise ValueError(f"no tiny vision-language model of type {model_type!r}; choose idefics3, smolvlm, llava or "
                         "internvl")  # fmt: skip
    return config, model_class, processor


SMOLVLM_256M_VISION = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                           image_size=512, patch_size=16)  # fmt: skip


def build_smolvlm_shaped(folder: str | Path, seed: int = 0) -> Path:
    """SmolVLM-256M's shape with the real SmolLM2-135M-Instruct as its text model.

    No package ships a SmolVLM checkpoint, so the vision side is SmolVLM-256M's at its real widths with random
    weights (a SigLIP tower 768 wide, 12 layers, 512-px images in 16-px patches; a pixel-shuffle connector by 4, so
    64 image tokens), and the text side is the packaged SmolLM2-135M-Instruct (:func:`packaged_smollm2`: the
    decoder SmolVLM-256M was built on), its tokenizer extended by SmolVLM's image tokens. The file's sizes, speeds,
    memory and decoder figures are those of the real model; what it says about an image is not.

    Example:
        >>> build_smolvlm_shaped("/tmp/smolvlm-shaped").joinpath("config.json").is_file()  # doctest: +SKIP
        True
    """
    import torch
    from tokenizers import AddedToken, Tokenizer
    from transformers import AutoModelForCausalLM, GenerationConfig, SmolVLMConfig, SmolVLMForConditionalGeneration

    folder = Path(folder)
    text_folder, _ = converted_folder(packaged_smollm2())
    text = AutoModelForCausalLM.from_pretrained(text_folder, dtype=torch.float32).eval()
    tokenizer = Tokenizer.from_file(str(text_folder / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VLM_IMAGE_TOKENS[:4]])
    vocab = tokenizer.get_vocab_size()
    eos = [tokenizer.token_to_id("<end_of_utterance>"), tokenizer.token_to_id("<|im_end|>")]
    text_config = text.config.to_dict() | {"vocab_size": vocab, "tie_word_embeddings": False, "eos_token_id": eos[0]}
    config = SmolVLMConfig(vision_config=SMOLVLM_256M_VISION, text_config=text_config, scale_factor=4,
                           image_token_id=tokenizer.token_to_id("<image>"), tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(seed)
    model = SmolVLMForConditionalGeneration(config).eval()
    table = text.get_input_embeddings().weight.detach()
    # The image tokens' rows start at the mean row, as transformers' resize_token_embeddings does.
    grown = torch.cat([table, table.mean(0, keepdim=True).expand(vocab - table.shape[0], -1)])
    state = {k: v for k, v in text.model.state_dict().items() if not k.endswith("embed_tokens.weight")}
    missing = model.model.text_model.load_state_dict(state, strict=False).missing_keys
    assert missing == ["embed_tokens.weight"], missing
    with torch.no_grad():
        model.model.text_model.embed_tokens.weight.copy_(grown)
        model.lm_head.weight.copy_(grown)
    model.generation_config = GenerationConfig(eos_token_id=eos)
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<end_of_utterance>", "bos_token": None,
                "model_max_length": 8192, "chat_template": VLM_CHAT_TEMPLATE}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    processor = {"image_processor_type": "Idefics3ImageProcessor", "do_image_splitting": False,
                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "rescale_factor": 1 / 255,
                 "size": {"longest_edge": 512}, "max_image_size": {"longest_edge": 512}}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    (folder / "README.md").write_text(
        "---\nlicense: apache-2.0\n---\n# SmolVLM-256M-shaped\n\nSmolVLM-256M's vision tower and connector with random "
        "weights at real widths, and the real SmolLM2-135M-Instruct as its text model.\n"
    )
    return folder
