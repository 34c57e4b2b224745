"""Speculative decoding: forward_rows, the drafters, the acceptance rule, exactness and the refusals."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hub_export.errors import InputError
from hub_export.tasks.text_generation.run import Sampling, generate
from hub_export.tasks.text_generation.speculative import DraftLength, LookupDrafter, accept, prompt_set

PROMPT = "the cat sat on the mat and the dog sat on the rug, the cat sat on"


@pytest.fixture(scope="module")
def exported_speculative(tmp_path_factory, tiny_model):
    """``tiny_model`` exported 8da8w and 8da4w with ``forward_rows``."""
    from hub_export import export

    out = tmp_path_factory.mktemp("speculative") / "out"
    # 512 positions: the shipped prompts fit, so the export times prompt lookup on them
    export(str(tiny_model), out, qmodes=["8da8w", "8da4w"], qembedding="8w", max_seq_len=512, speculative=True)
    return out


def _pte(folder, qmode="8da8w"):
    return next(folder.glob(f"*-{qmode}-*.pte"))


def test_forward_rows_scores_a_chunk_as_forward_does_one_token_at_a_time(exported_speculative):
    from hub_export.runtime.pte import PteModel

    model = PteModel(_pte(exported_speculative), load=("forward", "forward_rows"))
    prompt, continuation = torch.tensor([[1, 20, 30, 40, 50, 60, 70]]), [33, 81, 12, 400, 7, 99]
    model.forward(prompt, 0)
    one_by_one = torch.stack([model.forward(torch.tensor([[t]]), 7 + i).clone() for i, t in enumerate(continuation)])
    model.forward(prompt, 0)  # the prompt through forward, the chunk through forward_rows: one cache
    rows = model.forward_rows(torch.tensor([continuation]), 7, torch.arange(6))
    assert rows.shape == one_by_one.shape
    assert (rows - one_by_one).abs().max() < 1e-4 * one_by_one.abs().max()
    # a rejected draft leaves junk past the accepted positions: the next call overwrites it
    model.forward_rows(torch.tensor([[33, 5, 6, 7, 8]]), 7, torch.arange(5))
    again = model.forward_rows(torch.tensor([continuation[1:]]), 8, torch.arange(5))
    assert (again - one_by_one[1:]).abs().max() < 1e-4 * one_by_one.abs().max()
    last = model.forward_rows(prompt, 0, torch.tensor([6]))  # a prefill asks for its last row only
    assert last.shape == (1, one_by_one.shape[1])


def test_a_file_loads_forward_rows_only_when_asked(exported_speculative):
    from hub_export.runtime.pte import PteModel

    model = PteModel(_pte(exported_speculative))
    assert set(model.methods) == {"forward", "forward_rows"}
    assert list(model.methods._loaded) == ["forward"]  # a second packed copy of the weights only on demand


@pytest.mark.parametrize("drafter", [{"lookup": True}, {"draft": "8da4w"}])
def test_greedy_output_is_the_same_with_a_drafter(exported_speculative, drafter):
    pte = _pte(exported_speculative)
    plain = generate(pte, exported_speculative, PROMPT, max_new_tokens=40, chat=False)
    drafted = generate(pte, exported_speculative, PROMPT, max_new_tokens=40, chat=False, **drafter)
    assert drafted.text == plain.text
    assert drafted.generated_tokens == plain.generated_tokens
    figures = drafted.speculation
    assert figures.proposed > 0 and figures.calls < plain.generated_tokens - 1  # several tokens per call


def test_a_file_without_forward_rows_is_refused_in_one_line(exported_multi):
    pte = next(exported_multi.glob("*-8da4w-*.pte"))
    with pytest.raises(InputError, match="export it with --speculative"):
        generate(pte, exported_multi, PROMPT, max_new_tokens=4, lookup=True)


def test_draft_names_a_variant_or_a_file_and_must_share_the_tokens(exported_speculative, tmp_path):
    pte = _pte(exported_speculative)
    with pytest.raises(InputError, match="names no file beside"):
        generate(pte, exported_speculative, PROMPT, max_new_tokens=4, draft="4w")
    with pytest.raises(InputError, match="choose one drafter"):
        generate(pte, exported_speculative, PROMPT, max_new_tokens=4, draft="8da4w", lookup=True)
    with pytest.raises(InputError, match="no draft file"):
        generate(pte, exported_speculative, PROMPT, max_new_tokens=4, draft=tmp_path / "gone.pte")


def test_the_options_refuse_a_ring_buffer():
    from hub_export.options import ExportOptions

    with pytest.raises(InputError, match="drop --attention-sink"):
        ExportOptions(qmodes=("8da4w",), attention_sink="4,60", speculative=True)


def test_lookup_proposes_what_followed_the_last_ngram():
    drafter = LookupDrafter()
    assert drafter.propose([5, 6, 7, 8, 9, 5, 6, 7], 3) == ([8, 9, 5], None)
    assert drafter.propose([5, 6, 7, 8, 9, 5, 6, 7], 1) == ([8], None)
    assert drafter.propose([1, 2, 3, 4], 4) == ([], None)  # nothing recurs
    # the latest occurrence wins
    assert drafter.propose([1, 2, 10, 1, 2, 11, 1, 2], 1) == ([11], None)


def test_the_lookup_index_proposes_what_a_scan_of_the_text_finds():
    import random

    def scan(tokens, k, longest=4, shortest=2):
        for n in range(min(longest, len(tokens) - 1), shortest - 1, -1):
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start : start + n] == tokens[-n:] and tokens[start + n : start + n + k]:
                    return tokens[start + n : start + n + k]
        return []

    generator = random.Random(0)
    for _ in range(100):
        drafter, text = LookupDrafter(), []
        for _ in range(60):  # the text grows a token at a time, as decoding appends it
            text.append(generator.randint(0, 5))
            assert drafter.propose(text, 5)[0] == scan(text, 5), text


def test_draft_length_stops_drafting_when_proposals_are_rejected():
    length = DraftLength(max_k=15)
    for rows, seconds in ((1, 0.006), (2, 0.009), (4, 0.010), (8, 0.018)):
        length.measured(rows, seconds)
    for _ in range(20):
        length.observed(4, 4)
    assert length.choose(15, 0.0) >= 3
    for _ in range(20):
        length.observed(3, 0)
    assert length.choose(15, 0.0) == 0
    # a drafter whose every token costs half a target call needs near-certain acceptance to pay
    length.acceptance = 0.6
    assert length.choose(15, 0.003) == 0


def test_drafting_that_proves_slower_than_plain_steps_is_dropped_then_probed():
    length = DraftLength(max_k=15, acceptance=0.9)
    assert length.choose(15, 0.0) == 0  # a plain step first: its time is what drafting must beat
    length.measured(1, 0.006)
    assert length.choose(15, 0.001) > 0  # the model expects a gain
    length.drafted_step(0.030, 3)  # but a drafted step took 10 ms a token against 6 plain
    assert length.probe_every == 128
    choices = [length.choose(15, 0.001) for _ in range(256)]
    assert choices.count(0) == 254 and all(choice > 0 for choice in choices[127::128])
    for _ in range(8):
        length.drafted_step(0.030, 3)  # probes that keep losing come ever more rarely
    assert length.probe_every == 512
    for _ in range(8):
        length.drafted_step(0.004, 3)  # once drafting wins again it is used at once
    assert length.probe_every == 32 and length.choose(15, 0.001) > 0


def test_an_idle_draft_file_is_asked_for_one_token_once_every_probe_every_steps():
    length = DraftLength(max_k=15, acceptance=0.1)
    length.measured(1, 0.006)  # a draft token costs most of a plain step and is rarely kept: drafting does not pay
    choices = [length.choose(15, 0.005, probe_idle=True) for _ in range(64)]
    assert [index for index, k in enumerate(choices) if k] == [31, 63] and set(choices) == {0, 1}
    assert all(length.choose(15, 0.005) == 0 for _ in range(64))  # a lookup, whose offers are free, is not probed


def test_greedy_acceptance_keeps_the_agreeing_prefix_then_the_models_token():
    rows = torch.full((4, 6), -10.0)
    for i, best in enumerate([2, 3, 5, 1]):
        rows[i, best] = 10.0
    greedy = Sampling()
    generator = torch.Generator().manual_seed(0)
    assert accept(rows, [2, 3, 5], None, greedy, [], generator) == [2, 3, 5, 1]  # all kept, plus one
    assert accept(rows, [2, 4, 5], None, greedy, [], generator) == [2, 3]  # the second rejected


@pytest.mark.parametrize("drafted", ["point", "distribution"])
def test_sampled_acceptance_keeps_the_models_distribution(drafted):
    """Draws of the first emitted token follow the model's p whatever the proposal, within 0.012 per token."""
    p_logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    q = torch.softmax(torch.tensor([0.0, 2.0, 0.0, 1.0, 0.0]), -1)
    sampling = Sampling(temperature=1.0)
    p = sampling.probabilities(p_logits, [])
    generator = torch.Generator().manual_seed(1)
    rows = torch.stack([p_logits, p_logits])
    counts = torch.zeros(5)
    draws = 30000
    for _ in range(draws):
        if drafted == "point":  # a lookup proposes token 1 whatever p says
            first = accept(rows, [1], None, sampling, [], generator)[0]
        else:
            draft = int(torch.multinomial(q, 1, generator=generator))
            first = accept(rows, [draft], [q], sampling, [], generator)[0]
        counts[first] += 1
    # 4 standard deviations of a binomial at p=0.5 over 30000 draws is 0.0115
    assert (counts / draws - p).abs().max() < 0.012, (counts / draws, p)


def test_the_shipped_prompt_sets():
    grounded, chat = prompt_set("grounded"), prompt_set("chat")
    assert len(grounded) == 8 and len(chat) == 6
    with pytest.raises(ValueError, match="no prompt set"):
        prompt_set("other")


def test_cli_generate_with_lookup_prints_the_same_text_and_the_figures(exported_speculative):
    pte = _pte(exported_speculative)
    common = [sys.executable, "-m", "hub_export.cli", "generate", str(pte), "--tokenizer", str(exported_speculative),
              "--prompt", PROMPT, "--max-new-tokens", "24", "--no-chat"]  # fmt: skip
    plain = subprocess.run(common, capture_output=True, text=True, timeout=300)
    looked_up = subprocess.run([*common, "--lookup"], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and looked_up.returncode == 0, looked_up.stderr
    assert looked_up.stdout == plain.stdout
    assert "tokens per call" in looked_up.stderr and "accepted" in looked_up.stderr
    # a folder as the target: --draft names another of its variants
    drafted = subprocess.run(
        [*common[:4], str(exported_speculative), "--variant", "8da8w", "--draft", "8da4w", *common[5:]],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert drafted.returncode == 0, drafted.stderr
    assert drafted.stdout == plain.stdout and "drafter model-8da4w-emb8w.pte" in drafted.stderr


def test_the_manifest_and_the_card_state_what_lookup_did(exported_speculative):
    import json

    from hub_export.hub.card import render_card
    from hub_export.pipeline.manifest import Manifest

    variants = json.loads((exported_speculative / "manifest.json").read_text())["variants"]
    for variant in variants:
        assert variant["verification"]["rows"]["max_relative_difference"] < 1e-4  # forward_rows against forward
        record = variant["speculative"]
        assert record["max_rows"] == 16 and record["prompts"] == 2
        assert record["grounded_speedup"] > 0 and record["chat_speedup"] > 0
    card = render_card(Manifest.read(exported_speculative))
    assert "### Several tokens per step" in card and "--variant 8da4w --lookup" in card
    assert f"{variants[0]['speculative']['chat_speedup']:.2f}x on open chat" in card


@pytest.mark.parametrize(
    "record, message",
    [
        ({"max_rows": -1}, "not a count"),
        ({"grounded_speedup": "fast"}, "not a figure"),
        ({"grounded_speedup": float("inf")}, "not a figure"),
        ({"script": "<b>"}, "unknown key"),
        ("yes", "an object"),
    ],
)
def test_a_hostile_speculative_record_is_refused(exported_speculative, record, message):
    import json

    from hub_export.pipeline.manifest import check_variant

    variant = json.loads((exported_speculative / "manifest.json").read_text())["variants"][0]
    with pytest.raises(InputError, match=message):
        check_variant("manifest.json", 0, {**variant, "speculative": record})


def test_the_export_check_catches_a_forward_rows_that_reads_the_wrong_positions(exported_speculative, monkeypatch):
    from hub_export.errors import VerificationError
    from hub_export.runtime.pte import PteModel
    from hub_export.tasks.text_generation.speculative import check_rows

    pte = _pte(exported_speculative)
    assert check_rows(pte, 16)["max_relative_difference"] < 1e-4
    honest = PteModel.forward_rows
    monkeypatch.setattr(PteModel, "forward_rows", lambda self, ids, start, rows: honest(self, ids, start + 3, rows))
    with pytest.raises(VerificationError, match="forward_rows disagrees with its forward"):
        check_rows(pte, 16)
