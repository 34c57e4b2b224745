"""Chat templates and sampling, without a model: the pieces `generate` is built from."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from hub_export.errors import InputError
from hub_export.tasks.text_generation.run import Sampling, chat_prompt, chat_template

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"


@pytest.mark.parametrize("where", ["jinja", "json", "tokenizer_config", "list"])
def test_chat_template_is_found_wherever_the_tokenizer_keeps_it(tmp_path, where):
    if where == "jinja":
        (tmp_path / "chat_template.jinja").write_text(TEMPLATE)
    elif where == "json":
        (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    elif where == "tokenizer_config":
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    else:
        templates = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": TEMPLATE}]
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": templates}))
    assert chat_template(tmp_path) == TEMPLATE
    assert chat_prompt(tmp_path, "Hi", system="Be brief") == "<system>Be brief</s><user>Hi</s><assistant>"


def test_no_template_and_refusing_templates_are_clear(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert chat_template(tmp_path) is None
    with pytest.raises(InputError, match="no chat template; pass --no-chat"):
        chat_prompt(tmp_path, "Hi")
    (tmp_path / "chat_template.jinja").write_text("{{ raise_exception('System role not supported') }}")
    with pytest.raises(InputError, match="refused the prompt: System role not supported"):
        chat_prompt(tmp_path, "Hi")


def test_template_gets_the_special_tokens_from_the_tokenizer_config(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": {"content": "<bos>"}, "eos_token": "<eos>"})
    )
    assert chat_prompt(tmp_path, "x") == "<bos>x<eos>"


LOGITS = torch.tensor([1.0, 3.0, 2.9, -1.0, 0.5])


def test_greedy_is_the_default_and_picks_the_argmax():
    generator = torch.Generator().manual_seed(0)
    assert Sampling().pick(LOGITS, [], generator) == 1


def test_top_k_and_top_p_restrict_the_candidates():
    picks_k = {
        Sampling(temperature=5.0, top_k=2, seed=0).pick(LOGITS, [], torch.Generator().manual_seed(s)) for s in range(60)
    }
    assert picks_k == {1, 2}
    picks_p = {
        Sampling(temperature=1.0, top_p=0.05).pick(LOGITS, [], torch.Generator().manual_seed(s)) for s in range(30)
    }
    assert picks_p == {1}  # the top token alone already holds more than 5% of the mass
    picks_all = {Sampling(temperature=5.0).pick(LOGITS, [], torch.Generator().manual_seed(s)) for s in range(200)}
    assert picks_all == {0, 1, 2, 3, 4}


def test_repetition_penalty_moves_greedy_off_a_seen_token():
    generator = torch.Generator().manual_seed(0)
    assert Sampling(repetition_penalty=1.3).pick(LOGITS, [1], generator) == 2
    assert Sampling(repetition_penalty=1.0).pick(LOGITS, [1], generator) == 1


def test_seed_makes_sampling_reproducible():
    def draw(seed):
        generator = torch.Generator().manual_seed(seed)
        return [Sampling(temperature=2.0).pick(LOGITS, [], generator) for _ in range(20)]

    assert draw(3) == draw(3) and draw(3) != draw(4)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(temperature=-1), "--temperature"),
        (dict(top_p=0), "--top-p"),
        (dict(top_p=1.5), "--top-p"),
        (dict(top_k=-2), "--top-k"),
        (dict(repetition_penalty=0), "--repetition-penalty"),
    ],
)
def test_bad_sampling_settings_are_one_line(settings, message):
    with pytest.raises(InputError, match=message):
        Sampling(**settings).check()


def test_ignore_eos_goes_on_to_max_new_tokens_and_threads_are_checked(tmp_path, capsys):
    from helpers import run_cli

    from hub_export.errors import InputError
    from hub_export.models.tiny import build_tiny_model, tiny_llama_config, train_tokenizer
    from hub_export.patches import set_threads
    from hub_export.pipeline.export import export
    from hub_export.tasks.text_generation.run import generate

    export(str(build_tiny_model(tmp_path / "a")), tmp_path / "a-out", qmodes=["fp32"], verify=False, jobs=1)
    eos = _first_token(tmp_path / "a-out", "Once upon a time")
    # The same weights, with the token the model picks first as its end of text.
    config = tiny_llama_config(vocab_size=train_tokenizer().get_vocab_size(), eos_token_id=eos)
    export(str(build_tiny_model(tmp_path / "b", config=config)), tmp_path / "b-out", qmodes=["fp32"], verify=False,
           jobs=1)  # fmt: skip
    pte, folder = tmp_path / "b-out" / "model-fp32.pte", tmp_path / "b-out"
    stopped = generate(pte, folder, "Once upon a time", max_new_tokens=8, chat=False)
    assert stopped.stop_reason == "eos" and stopped.generated_tokens == 1
    in_use = set_threads(None)
    going = generate(pte, folder, "Once upon a time", max_new_tokens=8, chat=False, ignore_eos=True, threads=in_use)
    assert going.stop_reason == "max_new_tokens" and going.generated_tokens == 8
    code, _, err = run_cli(["generate", str(folder), "-p", "Once upon a time", "--no-chat", "--ignore-eos",
                            "--threads", str(in_use), "--max-new-tokens", "5"], capsys)  # fmt: skip
    assert code == 0 and "generated 5 tok" in err and "max_new_tokens" in err
    with pytest.raises(InputError, match="threads"):
        generate(pte, folder, "Once upon a time", threads=0)
    # Resizing ExecuTorch's pool under a loaded XNNPACK program crashes the process: refused in one line instead,
    # while a new process takes any count.
    with pytest.raises(InputError, match="new process"):
        generate(pte, folder, "Once upon a time", max_new_tokens=2, chat=False, threads=in_use + 1)
    cli = [sys.executable, "-c", "from hub_export.cli import main; main()"]
    fresh = subprocess.run([*cli, "generate", str(folder), "-p", "Once upon a time", "--no-chat", "--ignore-eos",
                            "--threads", str(in_use + 1), "--max-new-tokens", "3"],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert fresh.returncode == 0 and "generated 3 tok" in fresh.stderr, fresh.stderr[-2000:]


def _first_token(folder, prompt: str) -> int:
    from hub_export.tasks.text_generation.run import stream_generate

    return next(iter(stream_generate(folder / "model-fp32.pte", folder, prompt, max_new_tokens=1, chat=False))).token
