"""4-bit recipes: HQQ scales, measured sensitivity and the calibrated mixed qmode (tiny models; the real one is a benchmark)."""

from __future__ import annotations

import pytest

from hub_export.errors import InputError
from hub_export.options import ExportOptions


@pytest.fixture(scope="module")
def fp32_model(tiny_model):
    from hub_export.pipeline.build import load_model

    return load_model(tiny_model, False)


def test_hqq_scales_round_weights_closer_than_minmax(fp32_model):
    """The option reaches torchao: HQQ searches scales that lower the weights' rounding error, same int4 format."""
    import torch

    from hub_export.pipeline.calibrate import _rounded_weight

    linear = fp32_model.model.layers[0].mlp.down_proj
    weight = linear.weight.detach()
    errors = {scales: float((_rounded_weight(linear, 4, 32, scales) - weight).norm()) for scales in ("hqq", "minmax")}
    assert errors["hqq"] < 0.97 * errors["minmax"], errors
    assert torch.equal(
        _rounded_weight(linear, 8, 32, "hqq"), _rounded_weight(linear, 8, 32, "minmax")
    )  # int8: as before


def test_the_plan_spends_the_budget_on_the_most_damage_per_byte(fp32_model, tiny_model):
    from hub_export.pipeline.calibrate import plan_mixed

    tokenizer = tiny_model / "tokenizer.json"
    nothing = plan_mixed(fp32_model, tokenizer, ExportOptions(qmodes=("mixed",), max_size_ratio=1.0), tokens=48)
    assert nothing.eight_bit == [] and nothing.size_ratio == 1.0 and nothing.linears > 10
    everything = plan_mixed(fp32_model, tokenizer, ExportOptions(qmodes=("mixed",), max_size_ratio=4.0), tokens=48)
    assert len(everything.eight_bit) == everything.linears and everything.ppl_ratio <= nothing.ppl_ratio
    some = plan_mixed(fp32_model, tokenizer, ExportOptions(qmodes=("mixed",), max_size_ratio=1.1), tokens=48)
    assert 0 < len(some.eight_bit) < some.linears and 1.0 < some.size_ratio <= 1.1
    assert "budget size 1.10x 8da4w" in some.summary() and f"of {some.linears} linears int8" in some.summary()
    quality = plan_mixed(fp32_model, tokenizer, ExportOptions(qmodes=("mixed",), max_ppl_ratio=1e6), tokens=48)
    assert quality.eight_bit == []  # any int4 model meets a target that loose
    assert plan_mixed(fp32_model, tokenizer, ExportOptions(qmodes=("mixed",), calibration=False)).calibrated is False


def test_calibration_leaves_the_model_as_it_was(fp32_model, tiny_model):
    import torch

    from hub_export.pipeline.calibrate import plan_mixed

    before = {name: tensor.clone() for name, tensor in fp32_model.state_dict().items()}
    tied = fp32_model.lm_head.weight is fp32_model.model.embed_tokens.weight
    plan_mixed(fp32_model, tiny_model / "tokenizer.json", ExportOptions(qmodes=("mixed",)), tokens=32)
    after = fp32_model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert (fp32_model.lm_head.weight is fp32_model.model.embed_tokens.weight) == tied


def test_a_mixed_variant_exports_verifies_and_says_what_it_kept(exported_multi, tiny_model, tmp_path):
    from hub_export.hub.card import render_card
    from hub_export.pipeline.export import export
    from hub_export.pipeline.manifest import Manifest

    manifest = export(
        str(tiny_model), tmp_path / "out", qmodes=["mixed"], qembedding="8w", max_seq_len=64, max_size_ratio=1.2
    )
    (variant,) = manifest.variants
    assert variant.file == "model-mixed-emb8w.pte" and variant.verification.verified
    plan = variant.recipe["mixed"]
    assert plan["eight_bit"] and plan["size_ratio"] <= 1.2 and plan["budget"] == "size 1.20x 8da4w"
    assert variant.recipe["int4_scales"] == "gptq"  # the default: the int4 layers' codes are GPTQ's
    assert variant.recipe["gptq"]["text"] == "calib_en.txt" and variant.recipe["gptq"]["tokens"] > 1000
    # The same model, embeddings and context as exported_multi's plain 8da4w file: the int8 layers cost bytes.
    plain = Manifest.read(exported_multi).variant("8da4w")
    assert plain.size_bytes < variant.size_bytes <= 1.2 * plain.size_bytes * 1.02
    card = render_card(Manifest.read(tmp_path / "out"), repo_id="alice/tiny-ExecuTorch")
    gptq = variant.recipe["gptq"]
    assert (
        "gptq scales" in card
        and (
            f"`model-mixed-emb8w.pte`: int4 weights GPTQ-rounded on {gptq['tokens']} tokens of calib_en.txt; "
            f"{len(plan['eight_bit'])} of "
        )
        in card
    )
    assert "--qmode mixed" in manifest.command and "--max-size-ratio 1.2" in manifest.command


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(max_size_ratio=1.2), "--max-size-ratio sets the budget of --qmode mixed"),
        (dict(qmodes=("mixed",), max_size_ratio=0.9), "--max-size-ratio must be between 1.0"),
        (dict(qmodes=("mixed",), max_ppl_ratio=1.0), "--max-ppl-ratio must be above 1.0"),
        (
            dict(qmodes=("mixed",), calibration=False, max_ppl_ratio=1.2),
            "--max-ppl-ratio needs the calibration that --no-calibration",
        ),
        (dict(int4_scales="awq"), "unknown --int4-scales 'awq'"),
        (dict(qmodes=("8da8w",), calibration_text=__file__), "--calibration-text calibrates --int4-scales gptq"),
    ],
)
def test_recipe_options_that_cannot_work_are_refused(options, message):
    with pytest.raises(InputError) as refused:
        ExportOptions(**options)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_the_card_plots_size_against_quality_for_three_variants():
    from hub_export.hub.card import FRONTIER_PLOT, frontier_png, render_card
    from hub_export.pipeline.manifest import Manifest, Variant
    from hub_export.pipeline.records import Quality, Verification

    def variant(qmode: str, size: int, ratio: float) -> Variant:
        quality = Quality(text="eval_en.txt", tokens=2048, perplexity=20 * ratio, fp32_perplexity=20.0, ratio=ratio)
        check = Verification(passed=True, mean_kl_vs_eager=0.01, top1_agreement=0.9, quality=quality)
        return Variant(
            file=f"model-{qmode}.pte",
            qmode=qmode,
            qembedding=None,
            group_size=None,
            max_seq_len=64,
            size_bytes=size,
            sha256="0" * 64,
            metadata={},
            verification=check,
            export_seconds=1.0,
        )

    two = Manifest(
        source={"id": "acme/m"}, versions={}, variants=[variant("8da4w", 100, 1.4), variant("fp32", 500, 1.0)]
    )
    assert frontier_png(two) is None and FRONTIER_PLOT not in render_card(two)
    three = Manifest(source={"id": "acme/m"}, versions={}, variants=[*two.variants, variant("mixed", 115, 1.15)])
    png = frontier_png(three)
    assert png.startswith(b"\x89PNG") and png == frontier_png(three)  # same figures, same bytes
    assert f"]({FRONTIER_PLOT})" in render_card(three)


def test_the_calibration_and_both_evaluation_texts_share_no_passage() -> None:
    """Recipes are tuned on calib_en.txt only; a passage in two files would let tuning leak into the figures."""
    import itertools
    import re
    from importlib import resources

    def shingles(name: str) -> set[tuple[str, ...]]:
        words = re.findall(r"[a-z0-9']+", resources.files("hub_export").joinpath("data", name).read_text().lower())
        return {tuple(words[i : i + 8]) for i in range(len(words) - 7)}

    texts = {name: shingles(name) for name in ("calib_en.txt", "eval_en.txt", "eval_docs_en.txt")}
    assert all(len(found) > 500 for found in texts.values())
    for (a, first), (b, second) in itertools.combinations(texts.items(), 2):
        assert not first & second, (a, b, sorted(first & second)[:3])


def test_the_users_calibration_text_drives_the_plan_and_only_its_digest_is_kept(fp32_model, tiny_model, tmp_path):
    import hashlib

    from hub_export.pipeline.calibrate import plan_mixed

    domain = tmp_path / "domain.txt"
    # Code, not prose: another text measures other sensitivities.
    domain.write_text("def main():\n    print('hello, world')\n    return 0\n" * 60, encoding="utf-8")
    digest = hashlib.sha256(domain.read_bytes()).hexdigest()
    options = ExportOptions(qmodes=("mixed",), max_size_ratio=1.1, calibration_text=str(domain))
    plan = plan_mixed(fp32_model, tiny_model / "tokenizer.json", options, tokens=48)
    shipped = plan_mixed(fp32_model, tiny_model / "tokenizer.json", ExportOptions(qmodes=("mixed",),
                         max_size_ratio=1.1), tokens=48)  # fmt: skip
    assert plan.text.startswith(f"your calibration text (sha256 {digest}, ") and shipped.text == "calib_en.txt"
    assert plan.ppl_ratio != shipped.ppl_ratio  # the measurement ran on the user's text
    assert options.variant_settings()["calibration_text"] == f"sha256:{digest}"  # no path in the manifest
    assert "--calibration-text" not in options.command("acme/m")  # nor in the card's command
    assert str(domain) not in plan.summary()


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "--calibration-text: no file at"),
        (b"", "has 0 words"),
        (b"short text " * 10, "has 20 words; the calibration reads 128 tokens"),
        (b"\x00\x01binary" * 200, "is binary, not text"),
        ("caf\u00e9 ".encode("latin-1") * 200, "is not UTF-8"),
    ],
    ids=["missing", "empty", "short", "binary", "latin-1"],
)
def test_a_calibration_text_that_cannot_work_is_refused_before_any_work(content, message, tmp_path):
    path = tmp_path / "calibration.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError) as refused:
        ExportOptions(qmodes=("mixed",), calibration_text=str(path))
    assert message in str(refused.value) and "\n" not in str(refused.value)
    text = "word " * 200
    path.write_text(text)
    for nothing_calibrated in (dict(qmodes=("8da8w",)), dict(qmodes=("8da4w",), int4_scales="hqq")):
        with pytest.raises(InputError, match="calibrates --int4-scales gptq and --qmode mixed"):
            ExportOptions(**nothing_calibrated, calibration_text=str(path))
    ExportOptions(qmodes=("8da4w",), calibration_text=str(path))  # GPTQ reads it


def test_gptq_keeps_a_layer_output_closer_than_rounding_each_weight():
    """GPTQ's promise on a layer with correlated, unevenly driven inputs: the output error on those inputs falls well
    below nearest rounding with the very same scales (same grid, same bytes)."""
    import torch

    from hub_export.pipeline.gptq import round_weight

    torch.manual_seed(0)
    inputs = torch.randn(2048, 128) @ (0.3 * torch.randn(128, 128) + torch.eye(128))
    inputs[:, :4] *= 20
    weight = 0.05 * torch.randn(64, 128)
    codes, scales = round_weight(weight, 2 * inputs.T @ inputs / len(inputs), 32)
    per_column = scales.repeat_interleave(32, dim=1)
    nearest = (weight / per_column).round().clamp(-8, 7) * per_column

    def output_error(rounded):
        return float(((inputs @ (rounded - weight).T) ** 2).mean())

    assert output_error(codes.float() * per_column) < 0.6 * output_error(nearest)
    assert int(codes.min()) >= -8 and int(codes.max()) <= 7 and codes.dtype == torch.int8
    assert torch.equal(scales.to(torch.bfloat16).float(), scales)  # the scales XNNPACK will store, exactly


def test_gptq_rounds_a_lazy_batch_as_the_column_by_column_definition_does():
    """The blocked carrying of each column's error (sub-blocks, matrix products) gives the codes of GPTQ's plain
    definition: round a column, then subtract its scaled error from every later column, one column at a time."""
    import torch

    from hub_export.pipeline.gptq import BLOCK, SUB_BLOCK, _round_block, _upper_inverse_cholesky

    torch.manual_seed(0)
    columns, rows = BLOCK, 96
    assert columns > 2 * SUB_BLOCK  # several sub-blocks, carried into each other
    inputs = torch.randn(1024, columns) @ (0.3 * torch.randn(columns, columns) + torch.eye(columns))
    hessian = 2 * inputs.T @ inputs / len(inputs)
    inverse = _upper_inverse_cholesky(hessian + 0.01 * hessian.diag().mean() * torch.eye(columns))
    weight = 0.05 * torch.randn(columns, rows)  # transposed: one column of the weight per row
    scale = (weight.abs().amax(0, keepdim=True) / 7.5).expand(columns, rows).contiguous()

    expected, carried = torch.empty_like(weight), weight.double().clone()
    for i in range(columns):
        expected[i] = (carried[i] / scale[i]).round().clamp(-8, 7)
        error = (carried[i] - expected[i] * scale[i]) / inverse[i, i]
        carried[i + 1 :] -= inverse[i, i + 1 :, None].double() * error[None, :]
    codes = torch.empty_like(weight)
    _round_block(weight.clone(), scale, inverse, codes)
    differing = int((codes != expected).sum())
    assert differing <= codes.numel() // 1000, differing  # float sums in another order: a near-tie at most


def test_gptq_rounds_a_tall_weight_slice_by_slice_to_the_same_codes(monkeypatch):
    """An output head of 150k rows is rounded a slice of rows at a time (its temporaries stay small); the codes and
    scales are those of the whole weight at once, and the caller's weight is left as it was."""
    import torch

    from hub_export.pipeline import gptq

    torch.manual_seed(0)
    inputs = torch.randn(1024, 256) @ (0.3 * torch.randn(256, 256) + torch.eye(256))
    hessian, weight = 2 * inputs.T @ inputs / len(inputs), 0.05 * torch.randn(1000, 256)
    before = weight.clone()
    whole = gptq.round_weight(weight, hessian, 32)
    monkeypatch.setattr(gptq, "ROUND_BYTES", 300 * 256 * 4)  # 300 rows a slice: four slices, the last short
    sliced = gptq.round_weight(weight, hessian, 32)
    assert torch.equal(sliced[0], whole[0]) and torch.equal(sliced[1], whole[1])
    assert sliced[0].shape == (1000, 256) and sliced[1].shape == (1000, 8) and torch.equal(weight, before)


_WIDE_LAYER_PEAK = """
import sys, psutil, torch
from hub_export.patches import map_large_allocations
from hub_export.pipeline.gptq import _GramSum, round_weight
map_large_allocations()
torch.manual_seed(0)
width = int(sys.argv[1])
weight, inputs = 0.05 * torch.randn(64, width), torch.randn(512, width)
for run in ("warm-up", "measured"):  # the first run maps the libraries' code and the allocator's arenas
    gram = _GramSum(width)
    gram.add(inputs)
    open("/proc/self/clear_refs", "w").write("5")  # the peak resident set starts again from here
    before = psutil.Process().memory_info().rss
    round_weight(weight, gram.hessian(), 32)
peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM"))
print((peak - before) / (width * width * 4))
"""


def test_gptq_holds_at_most_two_more_hessians_while_it_rounds_a_wide_layer():
    """A down projection's Hessian is 320 MB at 8,960 inputs, and rounding one layer sets the peak of a streamed
    export: beyond the sum it is handed, GPTQ's rounding holds less than two more Hessian-sized matrices at once
    (the sum goes once it is permuted, the permuted one once it is factorised; the factor is inverted in place).
    Before, it held four more."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _WIDE_LAYER_PEAK, "4096"], capture_output=True, text=True, check=True)
    matrices_over = float(done.stdout.strip().splitlines()[-1])
    assert matrices_over < 2.0, f"the peak held {matrices_over:.2f} Hessians more than the sum"


_STATS_PEAK = """
import psutil, torch
from hub_export.patches import map_large_allocations
from hub_export.pipeline.verify import TokenStats
map_large_allocations()  # as the export does: freed temporaries go back at once
torch.manual_seed(0)
logits, targets = 4 * torch.randn(511, 65536), torch.randint(0, 65536, (511,))
for run in ("warm-up", "measured"):
    open("/proc/self/clear_refs", "w").write("5")
    before = psutil.Process().memory_info().rss
    TokenStats.of(logits, targets)
peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM"))
print((peak - before) / logits.nbytes)
"""


def test_a_windows_stats_are_the_whole_windows_without_a_second_copy_of_its_logits():
    """Verification keeps a few numbers per position of the eager model's full-vocabulary logits; over Gemma's
    262,144 words a 512-token window's log-probs are 0.5 GB, so they are taken a few positions at a time, with
    the figures of the whole window at once."""
    import subprocess
    import sys

    import torch

    from hub_export.pipeline.verify import STATS_ROWS, TokenStats

    torch.manual_seed(0)
    logits, targets = 4 * torch.randn(2 * STATS_ROWS + 22, 3000), torch.randint(0, 3000, (2 * STATS_ROWS + 22,))
    stats, whole = TokenStats.of(logits, targets), torch.log_softmax(logits, -1)
    assert torch.equal(stats.top_logprobs, whole.topk(128, -1).values)
    assert torch.equal(stats.top_ids, whole.topk(128, -1).indices)
    assert torch.equal(stats.target_logprobs, whole.gather(-1, targets.view(-1, 1)).squeeze(-1))
    assert TokenStats.of(logits).target_logprobs.numel() == 0
    done = subprocess.run([sys.executable, "-c", _STATS_PEAK], capture_output=True, text=True, check=True)
    held = float(done.stdout.strip().splitlines()[-1])
    assert held < 0.5, f"the stats held {held:.2f} times the window's logits"


def test_a_gptq_variant_stores_exactly_the_calibrated_codes(fp32_model, tiny_model):
    """Every grouped int4 layer of an 8da4w copy holds GPTQ's codes and scales; the fp32 model is untouched; the
    int8 head of a shared-embedding export is left out."""
    import copy

    import torch

    from hub_export.pipeline.calibrate import round_int4
    from hub_export.pipeline.quantize import quantize_model

    before = {name: tensor.clone() for name, tensor in fp32_model.state_dict().items()}
    options = ExportOptions(qmodes=("8da4w",))
    rounding = round_int4(fp32_model, tiny_model / "tokenizer.json", options)
    assert all(torch.equal(before[name], tensor) for name, tensor in fp32_model.state_dict().items())
    assert rounding.text == "calib_en.txt" and rounding.tokens > 1000 and "lm_head" in rounding
    quantized = copy.deepcopy(fp32_model)
    quantize_model(quantized, "8da4w", recipe=options.recipe(rounding=rounding))
    hqq = copy.deepcopy(fp32_model)
    quantize_model(hqq, "8da4w", recipe=ExportOptions(qmodes=("8da4w",), int4_scales="hqq").recipe())
    layers = [name for name, module in quantized.named_modules() if isinstance(module, torch.nn.Linear)]
    assert layers and all(name in rounding for name in layers)
    differ = 0
    for name in layers:
        stored = quantized.get_submodule(name).weight.dequantize()
        assert torch.equal(stored, rounding.weight(name)), name
        differ += not torch.equal(stored, hqq.get_submodule(name).weight.dequantize())
    assert differ == len(layers)
    shared = round_int4(
        fp32_model, tiny_model / "tokenizer.json", ExportOptions(qembedding="8w", share_embeddings=True)
    )
    assert "lm_head" not in shared and len(shared.packed) == len(rounding.packed) - 1


@pytest.mark.parametrize(
    "qmode, qembedding, scales",
    [
        ("8da4w", "8w", "minmax"),
        ("8da4w", "4w", "hqq"),
        ("8da8w", "8w", "hqq"),
        ("4w", "8w", "hqq"),
        ("8w", "4w", "hqq"),
    ],
)
def test_a_tall_weight_quantized_slice_by_slice_is_the_whole_weights_quantization(
    qmode, qembedding, scales, monkeypatch
):
    """An output head or an embedding table of 150k rows is quantized a slice of rows at a time (torchao's rounding
    holds float32 temporaries 2-3x what it is given: 2.8 GB over Qwen's head); the stored tensors and the outputs
    are those of the whole weight quantized at once, for every qmode and embedding scheme."""
    import torch

    from hub_export.pipeline import quantize

    class Tall(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens, self.lm_head = torch.nn.Embedding(1000, 128), torch.nn.Linear(128, 1000, bias=False)

    torch.manual_seed(0)
    original = Tall().requires_grad_(False)

    def quantized(slice_bytes: int):
        monkeypatch.setattr(quantize, "SLICE_BYTES", slice_bytes)
        model = Tall().requires_grad_(False)
        model.load_state_dict(original.state_dict())
        quantize.quantize_embeddings(model, qembedding)
        quantize.quantize_linears(model, qmode, 32, recipe=quantize.Recipe(scales=scales))
        return model

    whole, sliced = quantized(1 << 40), quantized(300 * 128 * 4)  # 300 rows a slice: four, the last one short
    assert type(sliced.embed_tokens.weight).__name__ == "IntxUnpackedToInt8Tensor"
    for name in ("embed_tokens", "lm_head"):
        ours, theirs = getattr(sliced, name).state_dict(), getattr(whole, name).state_dict()
        assert list(ours) == list(theirs)
        for key in ours:
            for part in getattr(type(ours[key]), "tensor_data_names", [None]):
                a, b = (
                    (ours[key], theirs[key]) if part is None else (getattr(ours[key], part), getattr(theirs[key], part))
                )
                assert torch.equal(a, b), (name, key, part)
    tokens = torch.randint(0, 1000, (1, 9))
    with torch.no_grad():
        assert torch.equal(sliced.lm_head(sliced.embed_tokens(tokens)), whole.lm_head(whole.embed_tokens(tokens)))
