"""Layer by layer: a text model's fp32 weights are read one decoder layer at a time and never held whole, and
everything computed that way (logits, GPTQ's codes, the reference, the quantized model) is what the model loaded
whole gives, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hub_export.errors import SourceError
from hub_export.models.tiny import build_tiny_model
from hub_export.options import ExportOptions
from hub_export.pipeline.build import load_model
from hub_export.pipeline.layerwise import LayerwiseModel
from tests.test_archs import CONFIGS


@pytest.fixture(scope="module")
def family_folder(tmp_path_factory):
    made: dict[str, Path] = {}

    def get(model_type: str) -> Path:
        if model_type not in made:
            made[model_type] = build_tiny_model(tmp_path_factory.mktemp(model_type) / "m", config=CONFIGS[model_type]())
        return made[model_type]

    return get


def _logits(model, window, eager: bool):
    from hub_export.tasks.text_generation.export import eager_attention

    with torch.no_grad():
        if eager:
            with eager_attention(model):
                return model(input_ids=window).logits[0].float()
        return model(input_ids=window).logits[0].float()


# Sliding windows and per-layer rotary tables, QK-norm, partial rotary with fused projections, Conv1D and learned
# positions, and a llama3 rope scaling: the stand-ins must pass on whatever each family's forward hands its layers.
@pytest.mark.parametrize("model_type", ["gemma3_text", "qwen3", "phi3", "gpt2", "llama"])
def test_logits_read_layer_by_layer_equal_the_whole_model(family_folder, model_type):
    folder = family_folder(model_type)
    whole = load_model(folder, False)
    layerwise = LayerwiseModel.open(folder)
    windows = [torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]), torch.tensor([[3, 4]])]
    for eager in (False, True):
        state = layerwise.start(windows, eager)
        layerwise.walk([state])
        for index, window in enumerate(windows):
            assert torch.equal(layerwise.logits(state, index), _logits(whole, window, eager)), (model_type, eager)
    assert all(p.device.type == "meta" for name, p in layerwise.model.named_parameters() if ".layers." in name)


@pytest.mark.parametrize("tied", [False, True], ids=["own-head", "tied-head"])
@pytest.mark.parametrize("model_type", ["gemma3_text", "qwen3", "phi3", "gpt2", "llama"])
def test_logits_after_the_tables_are_let_go_equal_the_whole_model(tmp_path, model_type, tied, monkeypatch):
    """The input embedding table and the output head are let go once the passes have started, and are not read
    again while the layers are walked; the final norm gets what each family's forward hands it, the head's rows
    are read from the checkpoint a slice at a time for the logits (never the whole table), and a new pass reads
    the table back."""
    from hub_export.pipeline import layerwise as layerwise_module
    from hub_export.tasks.text_generation import export

    config = CONFIGS[model_type]()
    config.tie_word_embeddings = tied
    folder = build_tiny_model(tmp_path / "m", config=config)
    whole = load_model(folder, False)
    layerwise = LayerwiseModel.open(folder)
    window = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]])
    state = layerwise.start([window], eager=True)
    layerwise.release_tables()
    table, head = layerwise.model.get_input_embeddings(), layerwise.model.get_output_embeddings()
    during_walk = []
    layerwise.walk(
        [state], lambda index, layer: during_walk.append((table.weight.device.type, head.weight.device.type))
    )
    assert during_walk == [("meta", "meta")] * layerwise.count
    vocab = head.out_features
    monkeypatch.setattr(export, "HEAD_ROWS", vocab // 3)  # several slices, the last one short
    read = []
    original = layerwise_module.Checkpoint.read_rows
    monkeypatch.setattr(
        layerwise_module.Checkpoint,
        "read_rows",
        lambda self, name, start, stop: read.append(stop - start) or original(self, name, start, stop),
    )
    assert torch.allclose(layerwise.logits(state, 0), _logits(whole, window, True), rtol=0, atol=1e-6), model_type
    assert sum(read) == vocab and max(read) < vocab and head.weight.device.type == "meta"
    again = layerwise.full_pass(window)  # the table read back; an own head's rows still from the checkpoint
    assert torch.allclose(again, _logits(whole, window, False), rtol=0, atol=1e-6), model_type


@pytest.fixture(scope="module")
def untied_model(tmp_path_factory) -> Path:
    """The tiny Llama with an output head of its own, as the packaged Qwen2.5-Coder-1.5B GGUF has."""
    from hub_export.models.tiny import tiny_llama_config

    return build_tiny_model(
        tmp_path_factory.mktemp("untied") / "m", config=tiny_llama_config(tie_word_embeddings=False)
    )


@pytest.fixture(params=["tied", "untied"])
def either_model(request, tiny_model, untied_model) -> Path:
    return tiny_model if request.param == "tied" else untied_model


def test_gptq_layer_by_layer_gives_the_whole_models_codes(either_model):
    from hub_export.pipeline.calibrate import round_int4, round_int4_layerwise

    tiny_model = either_model
    options = ExportOptions(qmodes=("8da4w",))
    whole = round_int4(load_model(tiny_model, False), tiny_model / "tokenizer.json", options, max_seq_len=64)
    lines: list[str] = []
    layerwise = LayerwiseModel.open(tiny_model)
    streamed = round_int4_layerwise(layerwise, tiny_model / "tokenizer.json", options, lines.append, max_seq_len=64)
    assert list(streamed.packed) == list(whole.packed) and "lm_head" in streamed
    # The table and the head are let go once the passes have started; the head is rounded from its stored rows
    assert layerwise.model.get_input_embeddings().weight.device.type == "meta"
    assert layerwise.model.get_output_embeddings().weight.device.type == "meta"
    for name in whole.packed:
        assert torch.equal(streamed.packed[name], whole.packed[name]), name
        assert torch.equal(streamed.scales[name], whole.scales[name]), name
    assert streamed.tokens == whole.tokens and streamed.text == whole.text
    assert any("decoder layer 1 of 2" in line for line in lines)


def test_the_reference_read_layer_by_layer_equals_the_whole_models(either_model):
    from hub_export.pipeline.source import Source

    tiny_model = either_model
    from hub_export.pipeline.streaming import prepare_streamed
    from hub_export.pipeline.verify import build_reference

    options = ExportOptions(qmodes=("8da4w",), quality_tokens=300)
    whole = build_reference(load_model(tiny_model, False), tiny_model / "tokenizer.json", 64, 300, None)
    src = Source(tiny_model, "tiny", None, True)
    _, streamed, rounding = prepare_streamed(src, options, 64, lambda *event: None, "the prompt")
    assert torch.equal(streamed.sequences.prompt_tokens, whole.sequences.prompt_tokens)
    assert torch.equal(streamed.fp32_prompt_logits, whole.fp32_prompt_logits)
    for ours, theirs in ((streamed.fp32_text, whole.fp32_text), (streamed.fp32_second, whole.fp32_second)):
        assert torch.equal(ours.top_logprobs, theirs.top_logprobs) and torch.equal(ours.target_logprobs,
                                                                                   theirs.target_logprobs)  # fmt: skip
    assert rounding is not None and len(rounding.packed) == 15


@pytest.mark.parametrize("share", [False, True])
def test_a_variant_quantized_layer_by_layer_equals_the_whole_model_quantized(tiny_model, share, monkeypatch):
    """The same quantized weights as quantizing the whole model, with never more than one fp32 decoder layer
    loaded: when a layer is read, every other one is still on the meta device or already quantized; and the
    embedding table (here also the head) is never read whole, only a slice of rows at a time."""
    from hub_export.pipeline import layerwise as layerwise_module
    from hub_export.pipeline import quantize
    from hub_export.pipeline.calibrate import round_int4
    from hub_export.pipeline.quantize import quantize_model
    from hub_export.pipeline.source import Source
    from hub_export.pipeline.streaming import quantized_model

    options = ExportOptions(qmodes=("8da4w",), qembedding="8w", share_embeddings=share)
    rounding = round_int4(load_model(tiny_model, False), tiny_model / "tokenizer.json", options, max_seq_len=64)
    recipe = options.recipe(rounding=rounding)
    whole = load_model(tiny_model, False)
    quantize_model(whole, "8da4w", "8w", 32, share, recipe)

    loads = []
    original = layerwise_module.LayerwiseModel.load_layer

    def checked_load(self, index):
        fp32 = [name for name, p in self.model.named_parameters()
                if ".layers." in name and p.device.type != "meta" and type(p.data) is torch.Tensor and p.dim() == 2]  # fmt: skip
        loads.append(fp32)
        return original(self, index)

    monkeypatch.setattr(layerwise_module.LayerwiseModel, "load_layer", checked_load)
    whole_reads, row_reads = [], []
    read, read_rows = layerwise_module.Checkpoint.read, layerwise_module.Checkpoint.read_rows
    monkeypatch.setattr(
        layerwise_module.Checkpoint, "read", lambda self, names: whole_reads.extend(names) or read(self, names)
    )
    monkeypatch.setattr(layerwise_module.Checkpoint, "read_rows",
                        lambda self, name, a, b: row_reads.append((name, b - a)) or read_rows(self, name, a, b))  # fmt: skip
    vocab, width = whole.get_input_embeddings().weight.shape
    monkeypatch.setattr(quantize, "SLICE_BYTES", 40 * width * 4)  # 40 rows a slice
    streamed, fallback = quantized_model(Source(tiny_model, "tiny", None, True), "8da4w", options, recipe, print)
    assert len(loads) == 2 and loads == [[], []]  # no fp32 matrix of an earlier layer left behind
    assert "model.embed_tokens.weight" not in whole_reads
    assert {name for name, _ in row_reads} == {"model.embed_tokens.weight"}
    assert sum(rows for _, rows in row_reads) == 2 * vocab and max(rows for _, rows in row_reads) == 40  # table, head
    assert fallback == []
    ours, theirs = dict(streamed.named_modules()), dict(whole.named_modules())
    for name, module in theirs.items():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            a, b = ours[name].weight, module.weight
            assert type(a) is type(b), name
            assert torch.equal(a.dequantize() if hasattr(a, "dequantize") else a,
                               b.dequantize() if hasattr(b, "dequantize") else b), name  # fmt: skip


def test_a_checkpoint_that_cannot_be_read_layer_by_layer_is_refused_in_one_line(tiny_model, tmp_path):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    weights = folder / "model.safetensors"
    index = {"weight_map": {"model.embed_tokens.weight": "../outside.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match="not a safetensors file in the model folder") as refused:
        LayerwiseModel.open(folder)
    assert "\n" not in str(refused.value)
    (folder / "model.safetensors.index.json").unlink()

    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    tensors.pop("model.layers.1.mlp.down_proj.weight")
    save_file(tensors, weights)
    layerwise = LayerwiseModel.open(folder)
    layerwise.load_layer(0)
    with pytest.raises(SourceError, match="has no weight 'model.layers.1.mlp.down_proj.weight'"):
        layerwise.load_layer(1)

    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"][:-1]  # a table one row short
    save_file(tensors, weights)
    for tables in (True, False):  # read whole, or left on disk for a quantizer to read in slices
        with pytest.raises(SourceError, match="the checkpoint's model.embed_tokens.weight is shaped") as refused:
            LayerwiseModel.open(folder, tables=tables)
        assert "\n" not in str(refused.value)


def test_an_export_that_cannot_fit_is_refused_before_any_work_with_the_estimate(tiny_model, tmp_path, monkeypatch):
    from hub_export.errors import InputError
    from hub_export.pipeline import prepare
    from hub_export.pipeline.export import export

    monkeypatch.setattr(prepare, "available_memory", lambda: 1 << 30)
    loaded = []
    monkeypatch.setattr(LayerwiseModel, "open", lambda *a, **k: loaded.append(a))
    with pytest.raises(InputError) as refused:
        export(str(tiny_model), tmp_path / "out", qmodes=["8da4w", "fp32"], max_seq_len=64)
    message = str(refused.value)
    assert "\n" not in message and "needs about 1.5 GiB of memory at its peak" in message
    assert "read one layer at a time" in message and "1.0 GiB available" in message
    assert "drop --qmode fp32" in message and "a smaller model" in message
    assert not loaded and not (tmp_path / "out").exists() and not list(tmp_path.iterdir())


def test_the_estimate_follows_the_real_shapes_and_the_measured_peaks():
    from benchmarks.models import qwen3_4b_config, smollm2_1_7b_config
    from hub_export.pipeline.memory_budget import GIB, fp32_weight_bytes, run_peak

    qwen = fp32_weight_bytes(qwen3_4b_config().to_dict())
    smol = fp32_weight_bytes(smollm2_1_7b_config().to_dict())
    assert 4.00e9 < qwen / 4 < 4.05e9  # Qwen3-4B: 4.02 B parameters, tied embeddings counted once
    assert 1.70e9 < smol / 4 < 1.72e9
    default = ExportOptions(qmodes=("8da4w",), qembedding="8w")
    assert run_peak(qwen, default, streamed=True) < 16 * GIB  # read layer by layer, it fits a 16 GiB machine
    assert run_peak(qwen, default, streamed=False) > 24 * GIB  # loaded whole, it would not fit this machine
    # The refusal is by the estimate: it must not promise less than an export of that shape was measured to take.
    measured = json.loads((Path(__file__).parent.parent / "benchmarks/results/scale.json").read_text())["rows"]
    for row in [row for row in measured if row["rc"] == 0]:
        assert run_peak(row["fp32_bytes"], default, streamed=True) >= row["peak_bytes"], row["shape"]


def test_a_checkpoint_of_the_bare_base_model_is_read_as_from_pretrained_reads_it(tiny_model, tmp_path):
    """Older checkpoints store the base model's weights without its prefix (``embed_tokens.weight``, not
    ``model.embed_tokens.weight``): transformers loads them, and so does the layer-by-layer reader."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "bare"
    shutil.copytree(tiny_model, folder)
    tensors = load_file(folder / "model.safetensors")
    save_file({name.removeprefix("model."): t for name, t in tensors.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})  # fmt: skip
    whole = load_model(tiny_model, False)
    layerwise = LayerwiseModel.open(folder)
    window = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(layerwise.full_pass(window), _logits(whole, window, False))


def test_the_gptq_codes_wait_on_disk_while_workers_lower_the_files(tiny_model, tmp_path):
    """GPTQ's codes (0.6 bytes a weight) must not sit in the parent while a worker quantizes and lowers: they wait
    in a file beside the staging folder, which is gone afterwards; the manifest still says how many linears GPTQ
    rounded."""
    from hub_export.pipeline import engines
    from hub_export.pipeline.export import export

    seen = []
    original = engines.export_in_workers

    def lowering(jobs, workers, say, retries=0):
        rounding = jobs[0].int4_rounding
        seen.append((len(rounding.packed), len(rounding.spilled), rounding.file.is_file(), jobs[0].lower_only))
        return original(jobs, workers, say, retries)

    engines.export_in_workers = lowering
    try:
        manifest = export(str(tiny_model), tmp_path / "out", qmodes=["8da4w"], max_seq_len=64, quality_tokens=64)
    finally:
        engines.export_in_workers = original
    assert seen == [(0, 15, True, True)]
    assert manifest.variants[0].recipe["gptq"]["layers"] == 15
    assert manifest.variants[0].verification.passed
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]


def test_spilled_gptq_codes_read_back_as_they_were(tmp_path):
    from hub_export.pipeline.gptq import Int4Rounding

    torch.manual_seed(0)
    rounding = Int4Rounding(group_size=32)
    codes = {name: torch.randint(-8, 8, (16, 64), dtype=torch.int8) for name in ("a.q_proj", "a.k_proj")}
    scales = {name: torch.rand(16, 2) for name in codes}
    for name in codes:
        rounding.add(name, codes[name], scales[name])
    weights = {name: rounding.weight(name) for name in codes}
    rounding.spill(tmp_path / "codes.safetensors")
    assert not rounding.packed and "a.q_proj" in rounding and "a.v_proj" not in rounding
    for name in codes:
        read_codes, read_scales = rounding.codes_and_scales(name)
        assert torch.equal(read_codes, codes[name]) and torch.equal(read_scales, scales[name])
        assert torch.equal(rounding.weight(name), weights[name])
    assert rounding.record()["layers"] == 2


def test_a_quantized_head_run_in_slices_gives_the_same_logits(tiny_model):
    """The quantized model's logits that its file must reproduce are taken with the head run a slice of rows at a
    time (a whole int4 head is dequantized to float32 first: 1.5 GiB of temporaries for Qwen's): the same logits, bit for bit."""
    from torchao.quantization import quantize_

    from hub_export.pipeline.quantize import dynamic_activation_config
    from hub_export.tasks.text_generation.export import sliced_head

    model = load_model(tiny_model, False)
    quantize_(model, dynamic_activation_config(4, 32))
    window = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    head = model.get_output_embeddings()
    assert type(head.weight).__name__ == "IntxUnpackedToInt8Tensor" and head.out_features == 512
    with torch.no_grad():
        whole = model(input_ids=window).logits
        with sliced_head(model, rows=100):  # six slices, the last one short
            sliced = model(input_ids=window).logits
        after = model(input_ids=window).logits
    assert torch.equal(sliced, whole) and torch.equal(after, whole)
    assert "forward" not in vars(head)  # the head's own forward is back


@pytest.mark.parametrize("model_type", ["gemma3_text", "llama"])  # Gemma scales its lookup in a module of its own
def test_a_quantized_embedding_looked_up_in_slices_gives_the_same_logits(tmp_path, model_type, monkeypatch):
    """The quantized model's logits are taken with its 8-bit table looked up a slice of rows at a time (torchao
    dequantizes the whole table for every lookup: 4.4 GiB of temporaries at Phi-4-mini's widths): the same logits,
    bit for bit, with ids in several slices, repeated, and at both ends of the table."""
    from hub_export.pipeline.quantize import quantize_embeddings
    from hub_export.tasks.text_generation.export import sliced_embedding

    config = CONFIGS[model_type]()
    config.tie_word_embeddings = False
    model = load_model(build_tiny_model(tmp_path / "m", config=config), False)
    quantize_embeddings(model, "8w")
    table = model.get_input_embeddings()
    assert type(table.weight).__name__ == "IntxUnpackedToInt8Tensor" and table.num_embeddings > 300
    last = table.num_embeddings - 1
    window = torch.tensor([[0, 5, 150, 5, 299, 300, last, 101, 100, last - 1]])
    dequantized = []  # the rows of each table dequantized: the lookup's whole cost in memory
    dequantize = type(table.weight).dequantize
    monkeypatch.setattr(type(table.weight), "dequantize", lambda t: dequantized.append(len(t)) or dequantize(t))
    with torch.no_grad():
        whole = model(input_ids=window).logits
        assert max(dequantized) == table.num_embeddings
        dequantized.clear()
        with sliced_embedding(model, rows=100):  # the ids fall in four slices; the one with 200-299 holds one id
            sliced = model(input_ids=window).logits
            empty = table(torch.zeros(1, 0, dtype=torch.long))
        assert dequantized and max(dequantized) <= 100
        after = model(input_ids=window).logits
    assert torch.equal(sliced, whole) and torch.equal(after, whole) and empty.shape == (1, 0, table.embedding_dim)
