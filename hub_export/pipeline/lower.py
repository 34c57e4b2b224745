"""Lower: an ``ExportedProgram`` becomes ExecuTorch ``.pte`` bytes via XNNPACK."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hub_export.patches import edge_compile_config, release_memory, xnnpack_partitioner_configs
from hub_export.patches.lowering import (
    compact_dependency_viewers,
    decomposing_once,
    forgetting_tracing_caches,
    merge_checks_on_bits,
    skipping_idle_edge_passes,
    skipping_idle_xnnpack_passes,
)
from hub_export.patches.weights import packed_weights_released, preprocessing_on_shared_weights


def runner_metadata(
    *,
    max_seq_len: int,
    bos_id: int | None,
    eos_ids: list[int],
    vocab_size: int,
    dynamic_shape: bool,
    max_context_len: int | None = None,
) -> dict[str, Any]:
    """The constant methods ExecuTorch's ``TextLLMRunner`` reads from a ``.pte``.

    Names follow ``extension/llm/runner/constants.h``; ``get_eos_ids`` is plural (a
    list), which is what the runner reads.
    """
    metadata: dict[str, Any] = {
        "get_max_seq_len": max_seq_len,
        # Above max_seq_len only for a cache that never fills (attention sink).
        "get_max_context_len": max_context_len or max_seq_len,
        "get_vocab_size": vocab_size,
        "get_eos_ids": list(eos_ids),
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": True,
        "enable_dynamic_shape": dynamic_shape,
    }
    if bos_id is not None:
        metadata["get_bos_id"] = bos_id
    return metadata


def is_dynamic(program: torch.export.ExportedProgram) -> bool:
    """True when the program's token input really has a symbolic sequence length."""
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name == "input_ids":
            shape = node.meta["val"].shape
            return any(not isinstance(dim, int) for dim in shape)
    return False


def _static_except_one(node: torch.fx.Node) -> list[int] | None:
    """The node's output shape with its single symbolic dim as -1, else None."""
    value = node.meta.get("val")
    if value is None:
        return None
    shape = [d if isinstance(d, int) else -1 for d in value.shape]
    return shape if shape.count(-1) == 1 else None


def inferred_reshapes(program: torch.export.ExportedProgram) -> int:
    """Rewrite reshapes with a symbolic size into reshapes with one inferred (-1) dim.

    XNNPACK refuses ``view(x, [1, s, -1, 64])`` (a symbolic ``s``) and non-trailing
    ``unsqueeze``, and every refused op splits a layer into several delegates with a
    runtime hop between them. ``view(x, [1, -1, 3, 64])`` is the same reshape, which
    XNNPACK takes. Returns the number of nodes rewritten.
    """
    aten = torch.ops.aten
    reshapes = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default}
    graph = program.graph_module.graph
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in reshapes:
            continue
        shape = _static_except_one(node)
        if shape is None:
            continue
        node.target = aten.view.default
        node.args = (node.args[0], shape)
        rewritten += 1
    if rewritten:
        graph.eliminate_dead_code()
        program.graph_module.recompile()
    return rewritten


def drop_provenance(program: torch.export.ExportedProgram) -> None:
    """Forget export-time node provenance (``meta["from_node"]``).

    Every lowering pass deep-copies each node's provenance chain and appends to it;
    starting from empty chains makes lowering measurably faster. The
    ``.pte`` does not use them.
    """
    for node in program.graph_module.graph.nodes:
        node.meta.pop("from_node", None)


def partitioner():
    """The XNNPACK partitioner, with :func:`hub_export.patches.xnnpack_partitioner_configs` (weight-only linears
    claimed whole)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner(configs=xnnpack_partitioner_configs())


class LoweringProgress:
    """What lowering says as XNNPACK starts each partition: "lowering: XNNPACK partition 12 of 30, about 2 min left".

    The total is counted as the partitioner finds the partitions (:meth:`found`); each partition's turn is timed
    from the first one's start, the first alone telling nothing of the rest.
    """

    def __init__(self, say: Callable[[str], None]):
        self.say, self.total, self.done, self.started = say, 0, 0, 0.0

    def found(self, count: int) -> None:
        self.total += count

    def __call__(self) -> None:
        from hub_export.progress import time_left  # a leaf module, as every caller of lowering has it loaded

        if self.done == 0:
            self.started = time.perf_counter()
        self.done += 1
        of = f" of {self.total}" if self.total >= self.done else ""
        left = time_left(self.started, self.done - 1, self.total) if of and self.done > 2 else ""
        self.say(f"lowering: XNNPACK partition {self.done}{of}{left}")


def _counting(each_partitioner, found: Callable[[int], None]):
    """``each_partitioner``, telling ``found`` how many partitions it tagged."""
    partition = each_partitioner.partition

    def counted(exported_program):
        result = partition(exported_program)
        found(len(result.partition_tags))
        return result

    each_partitioner.partition = counted
    return each_partitioner


def _partitioner_for(on_partition: Callable[[], None] | None):
    """A method's partitioner, which tells a :class:`LoweringProgress` how many partitions it found."""
    each = partitioner()
    return _counting(each, on_partition.found) if isinstance(on_partition, LoweringProgress) else each


def _tag_weights_external(tag: str, kept: Callable[[str], bool] | None = None):
    """A transform pass that sends XNNPACK's weights to the data file named ``tag`` (but those ``kept(name)``)."""
    from torch.fx.passes.infra.pass_base import PassResult

    def tag_weights(graph_module: torch.fx.GraphModule) -> PassResult:
        for node in graph_module.graph.nodes:
            if node.op != "placeholder" or node.name in ("input_ids", "cache_position", "rows"):
                continue
            if kept is None or not kept(node.name):
                node.meta.setdefault("custom", {})["delegate_constant_tag"] = tag
        return PassResult(graph_module, True)

    return tag_weights


def backend_config(tag: str | None = None, methods: int = 1, kept: Callable[[str], bool] | None = None):
    """How every ``.pte`` is serialized: delegate blobs in segments, inputs not copied into planned memory
    (``alloc_graph_input=False``), quantized-weight patterns folded; with ``tag``, every weight into that data file.

    A file of several ``methods`` keeps its KV cache in an arena of its own (``share_mutable_buffers``): the
    runtimes share each planned arena among a program's methods, so a cache planned beside the activations of
    the decoder's method is overwritten when another method runs between two decoder calls (a vision-language
    file's ``vision_encoder`` between prompt chunks).
    """
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    return ExecutorchBackendConfig(
        extract_delegate_segments=True,
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, share_mutable_buffers=methods > 1),
        do_quant_fusion_and_const_prop=True,
        external_constants=(lambda node: None if kept and kept(node.name) else tag) if tag else False,
    )


def _partitioning_patches(on_partition: Callable[[], None] | None) -> tuple:
    """What makes partitioning and XNNPACK's preprocess faster and lighter (:mod:`hub_export.patches.lowering`)."""
    return (
        compact_dependency_viewers(),
        merge_checks_on_bits(),
        skipping_idle_xnnpack_passes(on_partition),
        preprocessing_on_shared_weights(),
    )


def to_pte(
    program: torch.export.ExportedProgram | dict[str, torch.export.ExportedProgram],
    metadata: dict[str, Any],
    path: Path,
    data_path: Path | None = None,
    on_partition: Callable[[], None] | None = None,
    kept: Callable[[str], bool] | None = None,
) -> int:
    """Partition to XNNPACK, plan memory and write the ``.pte`` to ``path``; returns its size.

    ``program`` is the ``forward`` method, or one program per method name (a speech file's
    encoder and decoder, a text file's ``forward`` and ``forward_rows``). A dict is emptied as lowering
    starts: a caller that keeps no other reference to its programs (nor to the model they were exported
    from) lets each quantized weight go as soon as XNNPACK has packed it.

    ``do_quant_fusion_and_const_prop`` folds torchao's weight-only dequantize patterns
    (e.g. quantized embeddings) into ops the runtime has kernels for.

    ``on_partition`` is called as XNNPACK starts on each partition (a :class:`LoweringProgress` counts them too).

    With ``data_path`` (a ``.ptd`` next to ``path``) every weight, the program's and
    XNNPACK's alike, goes to that data file, where ExecuTorch stores byte-identical
    buffers once: a tied embedding table and an output projection quantized the same
    way are kept once (``benchmarks/shared_embedding.py``); but weights ``kept(name)`` stay in the ``.pte``.
    """
    if data_path is not None and data_path.parent != path.parent:
        raise ValueError("the data file must sit next to the .pte")
    tag = data_path.stem if data_path is not None else None
    programs = program if isinstance(program, dict) else {"forward": program}
    methods = len(programs)
    with forgetting_tracing_caches(), skipping_idle_edge_passes():
        edge = _partitioned(programs, metadata, tag, kept, on_partition)
        del programs
        if isinstance(program, dict):
            program.clear()
        del program
        release_memory()  # the weights XNNPACK packed, where nothing else holds them
        executorch_program = edge.to_executorch(backend_config(tag, methods=methods, kept=kept))
        del edge
        with open(path, "wb") as handle:
            executorch_program.write_to_file(handle)
        if tag:
            executorch_program.write_tensor_data_to_file(str(path.parent))
            if not data_path.is_file():
                raise RuntimeError(f"ExecuTorch wrote no {data_path.name}")
        del executorch_program
    return path.stat().st_size


def _partitioned(programs: dict, metadata: dict[str, Any], tag: str | None, kept, on_partition):
    """``programs`` in Edge dialect with XNNPACK's partitions lowered (an ``EdgeProgramManager``)."""
    from executorch.exir import to_edge_transform_and_lower

    for name in programs:
        inferred_reshapes(programs[name])
        drop_provenance(programs[name])
    partitioners = {name: _partitioner_for(on_partition) for name in programs}
    with contextlib.ExitStack() as stack:
        # Told the caller's tensors first; empties programs once the Edge programs are made.
        stack.enter_context(packed_weights_released(programs))
        # Each method decomposed once where its partitioner takes every node it keeps whole.
        for name in list(programs):
            stack.enter_context(decomposing_once(programs, name, partitioners[name]))
        for patch in _partitioning_patches(on_partition):
            stack.enter_context(patch)
        return to_edge_transform_and_lower(
            programs,
            transform_passes=[_tag_weights_external(tag, kept)] if tag else None,
            partitioner={name: [each] for name, each in partitioners.items()},
            compile_config=edge_compile_config(),
            constant_methods=metadata,
        )
