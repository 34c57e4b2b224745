"""Speculative decoding: propose several tokens cheaply, score them in one call, keep those the model agrees with.

A file exported with ``--speculative`` has ``forward_rows``, which writes a chunk of tokens to the
cache and returns the logits of every position asked for (:mod:`hub_export.tasks.text_generation.export`).
Each step feeds the last token plus ``k`` proposed ones and gets ``k + 1`` rows of logits: row ``i``
says what the model would pick after the ``i``-th token. Proposals are accepted left to right while the
model agrees; the first disagreement is replaced by the model's own choice, and when every proposal is
accepted the last row gives one more token for free. Cache positions written for rejected proposals
are simply overwritten by the next call: attention at position ``p`` reads only positions ``<= p``.

With greedy decoding every token is the model's argmax as the chunk scores it (where chunked and one-token
scoring round differently, a near tie can go the other way than in plain decoding). With sampling, a proposal ``x``
drawn from ``q`` is kept with probability ``min(1, p(x) / q(x))`` and a rejection is resampled from
``max(0, p - q)`` renormalized (Leviathan et al. 2023; Chen et al. 2023), so every token follows the
model's own distribution ``p`` (after temperature, top-k, top-p and the repetition penalty).

Two drafters: :class:`LookupDrafter` (n-grams of the prompt and the text so far: no second file) and
:class:`FileDrafter` (a cheaper ``.pte`` with the same tokenizer, e.g. the repo's 8da4w drafting for its
8da8w). :class:`DraftLength` picks how many tokens to propose from the measured acceptance rate and the
measured cost of each call, and proposes none when drafting would not pay.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from importlib import resources

import torch

PROMPT_SETS = ("grounded", "chat")

# The longest n-gram the lookup drafter matches, and the shortest it trusts.
LOOKUP_MAX_NGRAM = 4
LOOKUP_MIN_NGRAM = 2


class LookupDrafter:
    """Proposes the tokens that followed the latest earlier occurrence of the text's last n-gram.

    Prompt lookup decoding (Saxena 2023; transformers' ``prompt_lookup_num_tokens``): a summary, a quote,
    a correction or a reformatting copies long runs of its input, which this finds for free. The n-grams
    are indexed as the text grows (the text is only ever appended to), so a proposal costs a few dictionary
    look-ups, not a scan of the text: decoding calls it at every step.

    Example:
        >>> LookupDrafter().propose([5, 6, 7, 8, 9, 5, 6, 7], 3)
        ([8, 9, 5], None)
    """

    def __init__(self, max_ngram: int = LOOKUP_MAX_NGRAM, min_ngram: int = LOOKUP_MIN_NGRAM):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> where its latest continued occurrence ends
        self._indexed = 0  # n-grams ending before this position are in the index

    def prefill(self, ids: list[int]) -> float:
        return 0.0

    def _index(self, tokens: list[int]) -> None:
        if len(tokens) < self._indexed:  # another text: start over
            self._latest, self._indexed = {}, 0
        # an n-gram is indexed once a token follows it: the tail itself is never its own match
        for end in range(self._indexed, len(tokens) - 1):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end + 1 >= n:
                    self._latest[tuple(tokens[end + 1 - n : end + 1])] = end
        self._indexed = max(self._indexed, len(tokens) - 1)

    def propose(self, tokens: list[int], k: int) -> tuple[list[int], None]:
        """Up to ``k`` tokens to follow ``tokens`` (fewer, or none, when no n-gram recurs); no probabilities."""
        if k < 1:
            return [], None
        self._index(tokens)
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            end = self._latest.get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end + 1 : end + 1 + k], None
        return [], None


class FileDrafter:
    """Proposes tokens with a cheaper ``.pte`` of the same tokenizer, one ``forward`` call per token.

    It keeps its own cache: before each proposal it catches up, in one call, on the tokens the target
    accepted since (its cache past the first difference is overwritten, as the target's is).
    """

    def __init__(self, model, sampling, generator: torch.Generator):
        self.model, self.sampling, self.generator = model, sampling, generator
        self.fed: list[int] = []  # the tokens in the drafter's cache, by position
        self.chunk = max(1, int(model.metadata.get("get_max_seq_len", 2)) - 1)
        self.max_len = int(model.metadata.get("get_max_context_len", self.chunk + 1))
        self._seconds, self._tokens = 0.0, 0

    def prefill(self, ids: list[int]) -> float:
        started = time.perf_counter()
        self._feed(ids[:-1], 0)
        return time.perf_counter() - started

    def _feed(self, tokens: list[int], start: int):
        logits = None
        for offset in range(0, len(tokens), self.chunk):
            piece = tokens[offset : offset + self.chunk]
            logits = self.model.forward(torch.tensor([piece], dtype=torch.long), start_pos=start + offset)
        del self.fed[start:]
        self.fed.extend(tokens)
        return logits

    def propose(self, tokens: list[int], k: int) -> tuple[list[int], list[torch.Tensor] | None]:
        """``k`` tokens sampled (or picked greedily) from the drafter, and their distributions when sampling."""
        k = min(k, self.max_len - len(tokens))
        if k < 1:
            return [], None
        started = time.perf_counter()
        same = 0
        for ours, theirs in zip(self.fed, tokens[:-1], strict=False):
            if ours != theirs:
                break
            same += 1
        logits = self._feed(tokens[same:], same)
        drafts: list[int] = []
        probabilities: list[torch.Tensor] = []
        greedy = self.sampling.temperature <= 0
        while True:
            if greedy:
                token = self.sampling.pick(logits, tokens + drafts, self.generator)
            else:
                q = self.sampling.probabilities(logits, tokens + drafts)
                token = int(torch.multinomial(q, 1, generator=self.generator))
                probabilities.append(q)
            drafts.append(token)
            if len(drafts) == k:
                break
            logits = self._feed([token], len(tokens) + len(drafts) - 1)
        self._seconds += time.perf_counter() - started
        self._tokens += k
        return drafts, None if greedy else probabilities

    @property
    def seconds_per_token(self) -> float:
        """The measured cost of one proposed token (catching up included)."""
        return self._seconds / self._tokens if self._tokens else 0.0


def accept(rows: torch.Tensor, drafts: list[int], q, sampling, seen: list[int], generator) -> list[int]:
    """The tokens one scoring call yields: the accepted ``drafts``, then the model's own next token.

    ``rows[i]`` are the logits after the ``i``-th fed token (the last accepted one, then each draft);
    ``q`` the drafter's distributions (None: greedy, or a deterministic proposal such as a lookup).
    """
    out: list[int] = []
    for i, draft in enumerate(drafts):
        if sampling.temperature <= 0:
            choice = sampling.pick(rows[i], seen + out, generator)
            out.append(choice)
            if choice != draft:
                return out
            continue
        p = sampling.probabilities(rows[i], seen + out)
        q_draft = float(q[i][draft]) if q is not None else 1.0
        if float(torch.rand((), generator=generator)) * q_draft < float(p[draft]):
            out.append(draft)
            continue
        # rejected: resample from what p holds beyond q (a lookup's q is all on the draft)
        residual = (p - q[i]).clamp(min=0) if q is not None else p.clone()
        if q is None:
            residual[draft] = 0.0
        if float(residual.sum()) <= 0:  # p == q up to rounding: p itself is the right distribution
            residual = p
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return out
    out.append(sampling.pick(rows[len(drafts)], seen + out, generator))
    return out


@dataclass
class DraftLength:
    """How many tokens to propose next: the ``k`` that maximises expected tokens per second.

    Expected tokens of a call that proposes ``k`` with acceptance rate ``a`` are ``1 + a + ... + a^k``;
    its cost is the measured time of a ``k + 1``-row call plus ``k`` proposals. ``k = 0`` is a plain
    step. On top of that model, the time per token that drafted steps really took (proposals and the
    drafter catching up included) is compared with plain steps: while drafting is slower, steps stay
    plain, and one drafted step in every :attr:`probe_every` checks again (a lookup drafter's offers
    are also checked against the chosen token for free, so it comes back when the text starts copying).
    """

    max_k: int
    acceptance: float = 0.5
    weight: float = 0.3  # how fast the acceptance estimate follows the text
    row_seconds: dict[int, float] = field(default_factory=dict)
    drafted_per_token: float | None = None  # seconds per emitted token of drafted steps, all costs in
    plain_steps: int = 0
    probe_every: int = 32

    def cost(self, rows: int, draft_seconds: float) -> float:
        if rows in self.row_seconds:
            call = self.row_seconds[rows]
        else:
            # not measured yet: a guess below what 2-core XNNPACK measures, so each length gets tried
            call = self.row_seconds.get(1, 1.0) * (1 + 0.15 * (rows - 1))
        return call + (rows - 1) * draft_seconds

    def choose(self, available: int, draft_seconds: float, probe_idle: bool = False) -> int:
        """The draft length for the next step, at most ``available``. ``probe_idle``: a drafter whose acceptance
        only a sent proposal can update (a draft file) is also asked for one token now and then while the model
        says drafting does not pay, so it is not judged on a stale rate forever."""
        plain = self.row_seconds.get(1)
        if plain is None:
            return 0  # the first step is plain: what drafting must beat is measured, not guessed
        a = min(self.acceptance, 0.98)
        best, best_rate = 0, 1.0 / self.cost(1, 0.0)
        for k in range(1, min(self.max_k, available) + 1):
            rate = (1 - a ** (k + 1)) / (1 - a) / self.cost(k + 1, draft_seconds)
            if rate > best_rate:
                best, best_rate = k, rate
        losing = self.drafted_per_token is not None and self.drafted_per_token > plain
        if best and not losing:
            return best
        if not (best or probe_idle):
            return 0
        self.plain_steps += 1  # a plain step held back from drafting: every probe_every-th drafts
        return max(best, 1) if self.plain_steps % self.probe_every == 0 else 0

    def measured(self, rows: int, seconds: float) -> None:
        """One scoring call of ``rows`` rows took ``seconds``."""
        known = self.row_seconds.get(rows)
        self.row_seconds[rows] = seconds if known is None else 0.8 * known + 0.2 * seconds

    def drafted_step(self, seconds: float, tokens: int) -> None:
        """A drafted step (proposals and scoring) took ``seconds`` and yielded ``tokens``."""
        rate = seconds / tokens
        known = self.drafted_per_token
        self.drafted_per_token = rate if known is None else 0.7 * known + 0.3 * rate
        plain = self.row_seconds.get(1)
        # a probe that still loses waits four times as long for the next one (each costs the drafter a catch-up)
        losing = plain is not None and self.drafted_per_token > plain
        self.probe_every = min(self.probe_every * 4, 512) if losing else 32

    def observed(self, proposed: int, accepted: int) -> None:
        """Update the acceptance rate from one call: ``accepted`` of ``proposed`` kept, left to right."""
        if proposed < 1:
            return
        # each accepted proposal is a success; the first rejection (if any) a failure
        trials = accepted + (1 if accepted < proposed else 0)
        rate = accepted / trials
        self.acceptance += self.weight * (rate - self.acceptance)


def prompt_set(name: str) -> list[str]:
    """The shipped prompts of one set: ``grounded`` (answers copy their input) or ``chat`` (nothing to copy).

    Example:
        >>> len(prompt_set("grounded")), len(prompt_set("chat"))
        (8, 6)
    """
    if name not in PROMPT_SETS:
        raise ValueError(f"no prompt set {name!r}; choose from {', '.join(PROMPT_SETS)}")
    text = resources.files("hub_export").joinpath("data", "prompts", f"{name}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]


def check_rows(pte, rows: int) -> dict:
    """``forward_rows`` of ``pte`` against its own ``forward``; raises VerificationError when they disagree.

    A chunk of 1, ``rows // 2`` and ``rows`` tokens goes through both methods after the same prefill: the same
    computation, so the last rows must agree to float noise (``max_relative_difference``; a method reading the
    wrong cache or positions fails). Recorded beside it, not judged: how often the chunk's top tokens are those
    of feeding the tokens one at a time (``top1_agreement``). A chunk is summed in another order than one token,
    and dynamic int8 activations can round that to a whole step, so on the real SmolLM2-135M it was 94% (8da4w)
    and 81% (8da8w) of 16 rows.
    """
    from hub_export.errors import VerificationError
    from hub_export.runtime.pte import PteModel  # the ExecuTorch runtime: loaded when a file is checked

    model = PteModel(pte, load=("forward", "forward_rows"))
    vocab = int(model.metadata["get_vocab_size"])
    prompt_len = min(24, int(model.metadata["get_max_seq_len"]) - rows - 1)
    ids = torch.tensor([[(7919 * i + 11) % (vocab - 4) + 4 for i in range(prompt_len + rows)]])
    prompt, chunk = ids[:, :prompt_len], ids[:, prompt_len:]
    difference = 0.0
    for size in sorted({1, max(1, rows // 2), rows}):
        model.forward(prompt, 0)
        expected = model.forward(chunk[:, :size], prompt_len).clone()
        model.forward(prompt, 0)
        scored = model.forward_rows(chunk[:, :size], prompt_len, torch.arange(size))
        scale = float(expected.abs().max()) or 1.0
        difference = max(difference, float((scored[-1] - expected).abs().max()) / scale)
    model.forward(prompt, 0)
    one_by_one = torch.stack([model.forward(chunk[:, i : i + 1], prompt_len + i).clone() for i in range(rows)])
    model.forward(prompt, 0)
    scored = model.forward_rows(chunk, prompt_len, torch.arange(rows))
    agreement = float((scored.argmax(-1) == one_by_one.argmax(-1)).float().mean())
    if difference > 1e-4:
        raise VerificationError(
            f"{model.path.name}'s forward_rows disagrees with its forward (difference {difference:.2e} of the "
            "logits' range on the same chunk)"
        )
    return {"rows": rows, "max_relative_difference": difference, "top1_agreement": agreement}
