"""Generate: stream text from a ``.pte`` with the ExecuTorch runtime.

The decode loop is driven here rather than through ``TextLLMRunner`` so that text is
streamed UTF-8-safely: token ids are decoded incrementally with
``tokenizers.decoders.DecodeStream``, which holds back bytes until they form whole
characters (the runner's Python callback raises on half a character).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hub_export.errors import InputError, opt
from hub_export.tasks.text_generation.chat import chat_prompt, chat_template, render_chat_messages  # noqa: F401  (render_chat_messages: re-exported)


@dataclass
class GenerationResult:
    """The text and the speed figures of one generation."""

    text: str
    prompt_tokens: int
    generated_tokens: int
    prefill_seconds: float
    decode_seconds: float
    stop_reason: str  # "eos", "max_new_tokens" or "context_full"
    chat: bool = False  # whether the prompt went through the chat template
    speculation: Speculation | None = None  # drafted decoding's figures (None: one token per call)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        # The first token comes out of prefill; decode speed counts the forwards after it.
        steps = max(self.generated_tokens - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0


@dataclass
class Speculation:
    """What drafting did in one generation: proposals made and kept, and the file's decode calls."""

    drafter: str  # "lookup", or the draft file's name
    proposed: int = 0
    accepted: int = 0
    calls: int = 0  # forward_rows calls after prefill

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def tokens_per_call(self, generated: int) -> float:
        # the first token comes out of prefill
        return (generated - 1) / self.calls if self.calls else 0.0


@dataclass(frozen=True)
class Sampling:
    """How the next token is picked. The default is greedy (temperature 0).

    Example:
        >>> Sampling(temperature=0.7, top_p=0.9, repetition_penalty=1.1, seed=1)
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no limit
    repetition_penalty: float = 1.0
    seed: int = 0

    def check(self) -> None:
        if self.temperature < 0:
            raise InputError(
                f"{opt('temperature')} must be 0 (greedy) or more (got {self.temperature})", param="temperature"
            )
        if not 0 < self.top_p <= 1:
            raise InputError(f"{opt('top_p')} must be in (0, 1] (got {self.top_p})", param="top_p")
        if self.top_k < 0:
            raise InputError(f"{opt('top_k')} must be 0 (off) or more (got {self.top_k})", param="top_k")
        if self.repetition_penalty <= 0:
            raise InputError(
                f"{opt('repetition_penalty')} must be above 0; 1 is off (got {self.repetition_penalty})",
                param="repetition_penalty",
            )

    def pick(self, logits, seen, generator) -> int:
        """The next token from ``logits`` ``[vocab]``; ``seen`` are the ids so far (for the penalty)."""
        import torch

        if self.temperature <= 0:
            return int(self._penalized(logits, seen).argmax())
        return int(torch.multinomial(self.probabilities(logits, seen), 1, generator=generator))

    def probabilities(self, logits, seen):
        """The distribution :meth:`pick` samples from (temperature above 0): penalty, temperature, top-k, top-p."""
        import torch

        logits = self._penalized(logits, seen) / self.temperature
        if self.top_k:
            kth = torch.topk(logits, min(self.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            ordered, order = torch.sort(logits, descending=True)
            cumulative = torch.softmax(ordered, -1).cumsum(-1)
            # keep the smallest prefix whose mass reaches top_p (the first token always stays)
            drop = cumulative - torch.softmax(ordered, -1) >= self.top_p
            logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
        return torch.softmax(logits, -1)

    def _penalized(self, logits, seen):
        import torch

        logits = logits.float()
        if self.repetition_penalty != 1.0 and seen:
            # The CTRL / transformers rule: shrink the score of every token already in the text.
            ids = torch.tensor(sorted(set(seen)), dtype=torch.long)
            scores = logits[ids]
            logits = logits.clone()
            logits[ids] = torch.where(scores > 0, scores / self.repetition_penalty, scores * self.repetition_penalty)
        return logits


@dataclass
class GenerationResponse:
    """One step of :func:`stream_generate`: the text the new token completed, and the figures so far.

    ``text`` may be empty (a token that ends half a character, or a special token);
    ``stop_reason`` is None until the last response, which carries the final figures.
    """

    text: str
    token: int
    prompt_tokens: int
    generated_tokens: int
    prefill_seconds: float
    decode_seconds: float
    stop_reason: str | None = None
    chat: bool = False
    speculation: Speculation | None = None

    def result(self, text: str) -> GenerationResult:
        """The :class:`GenerationResult` of a generation whose last response this is."""
        return GenerationResult(
            text,
            self.prompt_tokens,
            self.generated_tokens,
            self.prefill_seconds,
            self.decode_seconds,
            self.stop_reason or "max_new_tokens",
            self.chat,
            self.speculation,
        )


# Over 60 lines: the docstring's example and the two kinds of file (text, vision-language) set up before one loop.
def stream_generate(
    pte_path: str | Path,
    tokenizer_dir: str | Path,
    prompt: str,
    *,
    max_new_tokens: int = 64,
    sampling: Sampling | None = None,
    chat: bool | None = None,
    system: str | None = None,
    images: list[str | Path] | None = None,
    threads: int | None = None,
    ignore_eos: bool = False,
    draft: str | Path | None = None,
    lookup: bool = False,
) -> Iterator[GenerationResponse]:
    """Generate from ``prompt`` with a ``.pte``, yielding a :class:`GenerationResponse` per token.

    ``chat`` (default: whenever the model has a chat template) sends ``prompt`` as a
    user message through the template, with ``system`` as the system message.
    ``images`` (files) go before the prompt, for a vision-language file (:mod:`hub_export.tasks.vision_language.export`),
    which also answers without images. ``sampling`` defaults to greedy. ``threads`` sizes the threadpool the
    file runs on (default: ExecuTorch's, the performance cores); ``ignore_eos`` goes on past end tokens to
    ``max_new_tokens`` (for timing, as ``hub-export bench`` does). Bad arguments raise before the model is loaded.

    ``lookup`` (n-grams of the prompt and the text so far) or ``draft`` (a cheaper ``.pte`` with the same
    tokenizer, or the name of a variant beside ``pte_path`` such as ``"8da4w"``) proposes tokens that the
    file scores several at a time (speculative decoding, :mod:`hub_export.tasks.text_generation.speculative`;
    the file needs ``--speculative``). Greedy output is the file's own choice at every position; in a quantized
    file, scoring a chunk rounds differently than one token, so at a near tie the text can part from plain
    decoding's (``docs/speculative.md``).

    Example:
        >>> for response in stream_generate("out/model-8da4w.pte", "out", "Once upon a time", max_new_tokens=32):
        ...     print(response.text, end="", flush=True)
        >>> response.stop_reason, round(response.result("").decode_tokens_per_s) > 0
        ('max_new_tokens', True)

    Raises:
        InputError: bad arguments, before the model is loaded (see :func:`generate`).
        VerificationError: the file does not load or fails in the ExecuTorch runtime.
    """
    import torch

    from hub_export.patches import set_threads  # ExecuTorch's threadpool: sized when a file is run
    from hub_export.runtime.pte import PteModel  # imports torch and ExecuTorch: only when a file is run

    sampling = sampling or Sampling()
    images = list(images or [])
    if threads is not None and threads < 1:
        raise InputError(f"{opt('threads')} must be at least 1", param="threads")
    tokenizer, chat = _check_arguments(Path(tokenizer_dir), max_new_tokens, sampling, chat, system)
    if draft is not None and lookup:
        raise InputError(f"choose one drafter: {opt('draft')} or {opt('lookup')}", param="draft")
    drafted = draft is not None or lookup
    set_threads(threads)  # before the file loads: XNNPACK keeps the pool it finds then
    model = PteModel(pte_path, load=() if drafted else None)
    if drafted:
        ids = _encode_text(tokenizer, Path(tokenizer_dir), prompt, chat, system)
        yield from _speculative(model, Path(pte_path), draft, ids, images, tokenizer, max_new_tokens, sampling, chat,
                                set() if ignore_eos else None)  # fmt: skip
        return
    if "vision_encoder" in model.methods:
        from hub_export.tasks.vision_language.run import GenerationRun  # the file's methods, its prompt layout

        run = GenerationRun(model, Path(tokenizer_dir), tokenizer, prompt, images, chat, system)
        ids, max_len, eos, prefill, step = run.ids, run.max_len, run.eos, run.prefill, run.step
    else:
        ids = _encode_text(tokenizer, Path(tokenizer_dir), prompt, chat, system)
        if images:
            raise InputError(f"{Path(pte_path).name} does not take images; {opt('image')} needs a vision-language "
                             "file (see `hub-export archs`)", param="image")  # fmt: skip
        chunk, max_len, eos = _limits(model)
        _check_prompt_fits(ids, max_len)

        def prefill():
            return _prefill(model.forward, ids, chunk)

        def step(token: int, position: int):
            return model.forward(torch.tensor([[token]], dtype=torch.long), start_pos=position)

    yield from _stream(tokenizer, ids, max_len, set() if ignore_eos else eos, prefill, step, max_new_tokens, sampling,
                       chat)  # fmt: skip


def _speculative(model, pte_path: Path, draft, ids, images, tokenizer, max_new_tokens, sampling, chat, eos):
    """:func:`stream_generate` with a drafter: checks, then :func:`_stream_drafted`."""
    from hub_export.runtime.pte import ROWS_METHOD, PteModel  # the ExecuTorch runtime: only when a file is run
    from hub_export.tasks.text_generation import speculative  # the drafters and the acceptance rule

    if images or "vision_encoder" in model.methods:
        raise InputError(f"{opt('draft')} and {opt('lookup')} decode text-generation files, not images", param="draft")
    if ROWS_METHOD not in model.methods:
        raise InputError(
            f"{pte_path.name} scores one token per call; export it with {opt('speculative')} to decode with a drafter",
            param="draft",
        )
    chunk, max_len, file_eos = _limits(model)
    _check_prompt_fits(ids, max_len)
    generator = _generator(sampling.seed)
    if draft is None:
        drafter, name = speculative.LookupDrafter(), "lookup"
    else:
        draft_path = _draft_file(pte_path, draft)
        draft_model = PteModel(draft_path)
        _check_same_vocabulary(model, draft_model)
        drafter, name = speculative.FileDrafter(draft_model, sampling, generator), draft_path.name
    yield from _stream_drafted(model, drafter, name, tokenizer, ids, (chunk, max_len), file_eos if eos is None else eos,
                               max_new_tokens, sampling, chat, generator)  # fmt: skip


def _generator(seed: int):
    import torch

    return torch.Generator().manual_seed(seed)


def _draft_file(pte_path: Path, draft: str | Path) -> Path:
    """The draft ``.pte``: a file, or the one variant beside ``pte_path`` whose name holds ``-<draft>``."""
    given = Path(draft)
    if given.suffix == ".pte":
        if not given.is_file():
            raise InputError(f"no draft file {given.name}", param="draft")
        return given
    name = str(draft)
    matches = sorted(path for path in pte_path.parent.glob("*.pte") if f"-{name}" in path.stem and path != pte_path)
    if len(matches) != 1:
        others = ", ".join(path.name for path in pte_path.parent.glob("*.pte") if path != pte_path) or "none"
        raise InputError(
            f"{opt('draft')} {name!r} names {'no' if not matches else 'more than one'} file beside {pte_path.name} "
            f"(there: {others}); pass a variant such as 8da4w or a .pte path",
            param="draft",
        )
    return matches[0]


def _check_same_vocabulary(model, draft_model) -> None:
    for key in ("get_vocab_size", "get_eos_ids", "get_bos_id"):
        if model.metadata.get(key) != draft_model.metadata.get(key):
            raise InputError(
                f"{draft_model.path.name} does not share {model.path.name}'s tokenizer ({key}: "
                f"{draft_model.metadata.get(key)} vs {model.metadata.get(key)}); a drafter must use the same tokens",
                param="draft",
            )


# Over 60 lines: one loop, which yields each token of a call as it is accepted and keeps the figures.
def _stream_drafted(model, drafter, name, tokenizer, ids, limits, eos, max_new_tokens, sampling, chat, generator):
    """The decoding loop with a drafter: each ``forward_rows`` call feeds the last token and ``k`` proposals;
    ``limits`` are the file's longest forward and its context (:func:`_limits`)."""
    import torch
    from tokenizers.decoders import DecodeStream

    from hub_export.tasks.text_generation import speculative  # the drafters and the acceptance rule

    chunk, max_len = limits
    max_rows = int(model.metadata.get("get_max_rows", 1))
    figures = Speculation(name)
    length = speculative.DraftLength(max_k=max_rows - 1)
    seen = list(ids)
    stream = DecodeStream(skip_special_tokens=True)
    logits, prefill_seconds, _ = _prefill(
        lambda piece, start: model.forward_rows(piece, start, torch.tensor([piece.shape[1] - 1]))[-1], ids, chunk
    )  # the last row only: as forward prefills
    prefill_seconds += drafter.prefill(ids)
    prompt_tokens, generated = len(ids), 0
    decode_started = time.perf_counter()
    new = [sampling.pick(logits, seen, generator)]
    while True:
        for token in new:
            seen.append(token)
            generated += 1
            position = len(seen) - 1  # where this token goes in the cache
            stop = _stop_reason(token in eos, generated >= max_new_tokens, position >= max_len)
            piece = "" if stop == "eos" else (stream.step(tokenizer, token) or "")
            yield GenerationResponse(piece, token, prompt_tokens, generated, prefill_seconds,
                                     time.perf_counter() - decode_started, stop, chat, figures)  # fmt: skip
            if stop:
                return
        room = min(max_len - 1 - position, max_new_tokens - generated, max_rows - 1)
        step_started = time.perf_counter()
        proposal, q, offered = _propose(drafter, length, seen, room)
        call_started = time.perf_counter()
        rows = model.forward_rows(torch.tensor([[seen[-1], *proposal]]), position, torch.arange(len(proposal) + 1))
        length.measured(len(proposal) + 1, time.perf_counter() - call_started)
        new = speculative.accept(rows, proposal, q, sampling, seen, generator)
        figures.calls += 1
        figures.proposed += len(proposal)
        figures.accepted += len(new) - 1
        if proposal:
            length.observed(len(proposal), len(new) - 1)
            length.drafted_step(time.perf_counter() - step_started, len(new))
        elif offered:  # a lookup proposal not worth sending: still learn whether it would have been right
            length.observed(1, int(offered[0] == new[0]))


def _propose(drafter, length, seen: list[int], room: int):
    """(proposal, its distributions or None, what a lookup offered): the draft length is chosen first for a
    drafter whose every token costs a call, after the offer for a lookup (whose offer is free)."""
    from hub_export.tasks.text_generation.speculative import LookupDrafter  # the drafters

    if room < 1:
        return [], None, []
    if isinstance(drafter, LookupDrafter):
        offered, _ = drafter.propose(seen, room)
        return offered[: length.choose(len(offered), 0.0)], None, offered
    k = length.choose(room, drafter.seconds_per_token, probe_idle=True)
    proposal, q = drafter.propose(seen, k) if k else ([], None)
    return proposal, q, proposal


def _stream(tokenizer, ids, max_len, eos, prefill, step, max_new_tokens, sampling, chat):
    """The decoding loop every generating file shares: ``prefill()`` -> (scores, seconds, positions used),
    ``step(token, position)`` -> the next scores."""
    from tokenizers.decoders import DecodeStream

    generator = _generator(sampling.seed)
    seen = list(ids)
    stream = DecodeStream(skip_special_tokens=True)
    logits, prefill_seconds, position = prefill()
    prompt_tokens, generated = position, 0
    decode_started = time.perf_counter()
    while True:
        token = sampling.pick(logits, seen, generator)
        seen.append(token)
        generated += 1
        stop = _stop_reason(token in eos, generated >= max_new_tokens, position >= max_len)
        piece = "" if stop == "eos" else (stream.step(tokenizer, token) or "")
        yield GenerationResponse(
            piece, token, prompt_tokens, generated, prefill_seconds, time.perf_counter() - decode_started, stop, chat
        )
        if stop:
            return
        logits = step(token, position)
        position += 1


def _stop_reason(eos: bool, enough: bool, full: bool) -> str | None:
    """Why generation stops after this token, the first that applies: EOS, max new tokens, a full context."""
    return "eos" if eos else "max_new_tokens" if enough else "context_full" if full else None


def _limits(model) -> tuple[int, int, set[int]]:
    """(the longest forward the file takes, its context, its EOS ids); a file of another task is refused."""
    if "get_embedding_dim" in model.metadata:
        raise InputError(
            f"{model.path.name} is a sentence-embedding file, which does not generate text; "
            "use `hub-export embed` (hub_export.embed)"
        )
    chunk = max(1, int(model.metadata.get("get_max_seq_len", 0)) - 1)
    max_len = max(int(model.metadata.get("get_max_context_len", 0)), chunk + 1)
    return chunk, max_len, set(model.metadata.get("get_eos_ids", []))


def _prefill(last_logits, ids: list[int], chunk: int):
    """(last position's logits, seconds, positions used) after running the prompt through ``last_logits(ids
    [1, n], start_pos)`` (a file's ``forward``, or ``forward_rows`` asked for the last row).

    A prompt longer than one forward (a file with an attention sink) is prefilled in chunks.
    """
    import torch

    started = time.perf_counter()
    for start in range(0, len(ids), chunk):
        logits = last_logits(torch.tensor([ids[start : start + chunk]], dtype=torch.long), start)
    return logits, time.perf_counter() - started, len(ids)


def _check_prompt_fits(ids: list[int], max_len: int) -> None:
    if len(ids) >= max_len:
        raise InputError(
            f"the prompt is {len(ids)} tokens; this file holds at most {max_len - 1}", code="prompt_too_long"
        )


def _check_arguments(tokenizer_dir: Path, max_new_tokens: int, sampling: Sampling, chat: bool | None, system):
    """(tokenizer, whether the chat template is used), or InputError before any model loads."""
    from tokenizers import Tokenizer

    tokenizer_file = tokenizer_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise InputError(f"no tokenizer.json in {tokenizer_dir.name}/; pass {opt('tokenizer')} with the export folder")
    if max_new_tokens < 1:
        raise InputError(f"{opt('max_new_tokens')} must be at least 1", param="max_new_tokens")
    sampling.check()
    if chat is None:
        chat = chat_template(tokenizer_dir) is not None
    if system and not chat:
        raise InputError(
            f"{opt('system')} needs the chat template",
            hint=f"drop {opt('no_chat')}",
            param="system",
            code="system_needs_chat",
        )
    return Tokenizer.from_file(str(tokenizer_file)), chat


def _encode_text(tokenizer, tokenizer_dir: Path, prompt: str, chat: bool, system: str | None) -> list[int]:
    # A rendered template carries its own special tokens (BOS included), as transformers' apply_chat_template does.
    ids = (
        tokenizer.encode(chat_prompt(tokenizer_dir, prompt, system), add_special_tokens=False).ids
        if chat
        else tokenizer.encode(prompt).ids
    )
    if not ids:
        raise InputError("the prompt is empty after tokenization")
    return ids


def generate(
    pte_path: str | Path,
    tokenizer_dir: str | Path,
    prompt: str,
    *,
    on_text: Callable[[str], None] | None = None,
    **settings: Any,
) -> GenerationResult:
    """Generate from ``prompt`` with a ``.pte`` and return the text and speed figures.

    ``settings`` are :func:`stream_generate`'s (``max_new_tokens``, ``sampling``,
    ``chat``, ``system``); ``on_text`` receives text as it streams. The file runs in this
    process: call :func:`hub_export.prepare_pte_process` before torch loads (as
    ``hub-export generate`` does) or prefill runs about half as fast
    (:mod:`hub_export.runtime.process_env`).

    Example:
        >>> hub_export.prepare_pte_process()  # first thing in the script
        >>> result = generate("out/model-8da4w.pte", "out", "Once upon a time", max_new_tokens=32,
        ...                   on_text=lambda piece: print(piece, end="", flush=True))
        >>> round(result.decode_tokens_per_s) > 0
        True

    Raises:
        InputError: bad arguments (an empty or too long prompt, a sampling setting out of range,
            no tokenizer next to the file, ``system`` without the chat template).
        VerificationError: the file does not load or fails in the ExecuTorch runtime.
    """
    pieces: list[str] = []
    last = None
    for last in stream_generate(pte_path, tokenizer_dir, prompt, **settings):
        if last.text:
            pieces.append(last.text)
            if on_text is not None:
                on_text(last.text)
    assert last is not None  # the loop yields at least once
    return last.result("".join(pieces))
