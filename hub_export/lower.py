"""Lower: an ``ExportedProgram`` becomes ExecuTorch ``.pte`` bytes via XNNPACK."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch


def runner_metadata(
    *,
    max_seq_len: int,
    bos_id: int | None,
    eos_ids: list[int],
    vocab_size: int,
    dynamic_shape: bool,
) -> dict[str, Any]:
    """The constant methods ExecuTorch's ``TextLLMRunner`` reads from a ``.pte``.

    Names follow ``extension/llm/runner/constants.h``; ``get_eos_ids`` is plural (a
    list), which is what the runner reads.
    """
    metadata: dict[str, Any] = {
        "get_max_seq_len": max_seq_len,
        "get_max_context_len": max_seq_len,
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
    starting from empty chains saved 7% of lowering time on a 6-layer model. The
    ``.pte`` does not use them.
    """
    for node in program.graph_module.graph.nodes:
        node.meta.pop("from_node", None)


class _NodeBits:
    """A read-only set of graph nodes stored as an integer bitset over topological indices."""

    __slots__ = ("_bits", "_index", "_nodes")

    def __init__(self, bits: int, nodes: list[torch.fx.Node], index: dict[torch.fx.Node, int]):
        self._bits = bits
        self._nodes = nodes
        self._index = index

    def __contains__(self, node) -> bool:
        position = self._index.get(node)
        return position is not None and bool(self._bits >> position & 1)

    def __iter__(self):
        digits = bin(self._bits)[:1:-1]  # least significant bit first
        index = digits.find("1")
        while index != -1:
            yield self._nodes[index]
            index = digits.find("1", index + 1)

    def __len__(self) -> int:
        return self._bits.bit_count()


class CompactDependencyViewer:
    """Drop-in for the partitioners' ``_DependencyViewer``, in O(N^2) bits instead of O(N^2) set entries.

    torch's ``CapabilityBasedPartitioner`` and ExecuTorch's ``GroupBasedPartitioner``
    each precompute every node's transitive downstream (and upstream) nodes as Python
    sets. On the 30-layer SmolLM2-135M graph those sets briefly took ~800 MB, the
    largest single allocation of the whole export. The same relation as bitsets takes
    a few MB, and both partitioners only iterate it.
    """

    def __init__(self, graph_module: torch.fx.GraphModule):
        nodes = list(graph_module.graph.nodes)
        index = {node: position for position, node in enumerate(nodes)}
        downstream: dict[torch.fx.Node, int] = {}
        for node in reversed(nodes):
            bits = 0
            for user in node.users:
                bits |= (1 << index[user]) | downstream[user]
            downstream[node] = bits
        upstream: dict[torch.fx.Node, int] = {}
        for node in nodes:
            bits = 0
            for parent in node.all_input_nodes:
                bits |= (1 << index[parent]) | upstream[parent]
            upstream[node] = bits
        self._nodes = nodes
        self._index = index
        self._downstream = downstream
        self._upstream = upstream

    def downstreams_of(self, node: torch.fx.Node) -> _NodeBits:
        return _NodeBits(self._downstream.get(node, 0), self._nodes, self._index)

    def upstreams_of(self, node: torch.fx.Node) -> _NodeBits:
        return _NodeBits(self._upstream.get(node, 0), self._nodes, self._index)


@contextlib.contextmanager
def compact_dependency_viewers():
    """Use :class:`CompactDependencyViewer` in torch's and ExecuTorch's partitioners meanwhile."""
    import importlib

    patched = []
    for module_name in (
        "torch.fx.passes.infra.partitioner",
        "executorch.exir.backend.canonical_partitioners.group_partitioner",
    ):
        module = importlib.import_module(module_name)
        if hasattr(module, "_DependencyViewer"):
            patched.append((module, module._DependencyViewer))
            module._DependencyViewer = CompactDependencyViewer
    try:
        yield
    finally:
        for module, original in patched:
            module._DependencyViewer = original


def _op_names(ops) -> tuple[str, ...]:
    return tuple(op.__name__ for op in ops)


def _xnnpack_pass_triggers() -> dict[type, tuple[tuple[str, ...], ...]]:
    """XNNPACK preprocess passes that can only change a graph holding certain ops.

    Each entry lists alternatives: the pass can act only if every op of one
    alternative is in the graph. The op lists are the ones each pass's ``call``
    looks for (the pattern passes: every op of their match patterns; the others:
    the class attributes they scan with).
    """
    from executorch.backends.transforms.remove_getitem_op import RemoveGetItemPass
    from executorch.backends.xnnpack._passes.conv1d_unsqueeze_pass import Conv1dUnsqueezePass
    from executorch.backends.xnnpack._passes.convert_to_linear import ConvertToLinearPass
    from executorch.backends.xnnpack._passes.convert_to_sdpa import ConvertToSDPAPass
    from executorch.backends.xnnpack._passes.convert_to_upsample_bilinear2d import ConvertToUpsampleBilinear2d
    from executorch.backends.xnnpack._passes.decompose_batch_norm import DecomposeBatchNorm
    from executorch.backends.xnnpack._passes.decompose_cat import DecomposeConcatenate
    from executorch.backends.xnnpack._passes.fuse_activation_pass import FuseActivationPass
    from executorch.backends.xnnpack._passes.fuse_batch_norm import FuseBatchNormPass
    from executorch.backends.xnnpack._passes.prelu_reshape_pass import PReLUReshapePass
    from executorch.backends.xnnpack._passes.remove_redundant_copy_pass import RemoveRedundantCopyPass

    batch_norms = tuple((name,) for name in _op_names(DecomposeBatchNorm.BATCH_NORM_OPS))
    return {
        ConvertToUpsampleBilinear2d: (("aten.upsample_bilinear2d.vec",),),
        ConvertToLinearPass: tuple((name,) for name in _op_names(ConvertToLinearPass.targets)),
        ConvertToSDPAPass: (("aten.bmm.default", "aten._softmax.default"),),
        FuseBatchNormPass: batch_norms,
        DecomposeBatchNorm: batch_norms,
        FuseActivationPass: tuple((name,) for name in _op_names(FuseActivationPass.FUSEABLE_ACTIVATIONS)),
        DecomposeConcatenate: (("aten.cat.default",),),
        RemoveGetItemPass: (("aten.max_pool2d_with_indices.default",), ("aten.max.dim",)),
        Conv1dUnsqueezePass: (("aten.convolution.default",),),
        PReLUReshapePass: (("aten._prelu_kernel.default",),),
        RemoveRedundantCopyPass: (("aten._to_copy.default",),),
    }


def _graph_op_names(graph: torch.fx.Graph) -> set[str]:
    return {getattr(node.target, "__name__", str(node.target)) for node in graph.nodes if node.op == "call_function"}


@contextlib.contextmanager
def skipping_idle_xnnpack_passes():
    """Meanwhile, XNNPACK's preprocess skips passes that cannot change the partition at hand.

    Every pass ends by re-tracing the whole partition under FakeTensor, whether or not
    it found anything to rewrite. A decoder's partitions hold no convolution, batch
    norm, upsampling, PReLU, concatenation, matmul or decomposed SDPA, so 10 to 11 of
    the 17 passes would only re-trace. Skipping them took ``to_pte`` from 38.4 s to
    26.9 s (-30%) for 8da4w and from 17.0 s to 13.5 s (-21%) for 4w on a 6-layer
    SmolLM2-shaped model, with byte-identical ``.pte`` files (tests/test_lower.py
    checks the bytes). Triggers are checked on the graph as it is when each pass's turn
    comes, so ops an earlier pass introduces are seen.
    """
    from executorch.backends.xnnpack import _passes as xnnpack_passes
    from executorch.exir.pass_base import ExportPass
    from executorch.exir.program._program import _transform

    manager = xnnpack_passes.XNNPACKPassManager
    original = manager.transform
    triggers = _xnnpack_pass_triggers()

    def transform(self):
        program = self.exported_program
        for pass_type in self.passes:
            alternatives = triggers.get(pass_type)
            if alternatives is not None:
                present = _graph_op_names(program.graph_module.graph)
                if not any(all(op in present for op in ops) for ops in alternatives):
                    continue
            if issubclass(pass_type, xnnpack_passes.XNNPACKPass):
                program = _transform(program, pass_type(program))
            elif issubclass(pass_type, ExportPass):
                program = _transform(program, pass_type())
            else:
                raise RuntimeError(f"unexpected XNNPACK pass type {pass_type!r}")
        return program

    manager.transform = transform
    try:
        yield
    finally:
        manager.transform = original


def _weight_only_linear_config():
    """XNNPACK's linear config, extended to claim float-activation, integer-weight linears.

    The stock config treats a dequantized weight as static quantization and then wants
    the activation dequantized too, so it rejects :mod:`hub_export.weight_only`'s
    pattern and the graph falls back to a decomposition XNNPACK gets wrong. Claimed
    whole (dequantize + int weight + scales), it is serialized as an fp32-input,
    per-channel int8/int4 fully-connected node.
    """
    from executorch.backends.xnnpack.partition.config.gemm_configs import LinearConfig
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, tag_as_implicit_q_dq
    from executorch.backends.xnnpack.utils.utils import get_input_node, is_param_node

    class WeightOnlyLinearConfig(LinearConfig):
        def get_deps(self, node, ep):
            weight = get_input_node(node, 1)
            if is_dequant(get_input_node(node, 0)) or not is_dequant(weight):
                return super().get_deps(node, ep)
            if len(node.all_input_nodes) > 2 or not all(is_param_node(ep, arg) for arg in weight.all_input_nodes):
                return False, []
            tag_as_implicit_q_dq(weight)
            return True, [weight, *weight.all_input_nodes]

    return WeightOnlyLinearConfig


def partitioner():
    """The XNNPACK partitioner with :func:`_weight_only_linear_config` in place of the stock linear config."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.gemm_configs import LinearConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    weight_only = _weight_only_linear_config()
    return XnnpackPartitioner(configs=[weight_only if c is LinearConfig else c for c in ALL_PARTITIONER_CONFIGS])


def _tag_weights_external(tag: str):
    """A transform pass that sends XNNPACK's weights to the data file named ``tag``."""
    from torch.fx.passes.infra.pass_base import PassResult

    def tag_weights(graph_module: torch.fx.GraphModule) -> PassResult:
        for node in graph_module.graph.nodes:
            if node.op == "placeholder" and node.name not in ("input_ids", "cache_position"):
                node.meta.setdefault("custom", {})["delegate_constant_tag"] = tag
        return PassResult(graph_module, True)

    return tag_weights


def to_pte(
    program: torch.export.ExportedProgram, metadata: dict[str, Any], path: Path, data_path: Path | None = None
) -> int:
    """Partition to XNNPACK, plan memory and write the ``.pte`` to ``path``; returns its size.

    ``do_quant_fusion_and_const_prop`` folds torchao's weight-only dequantize patterns
    (e.g. quantized embeddings) into ops the runtime has kernels for.

    With ``data_path`` (a ``.ptd`` next to ``path``) every weight, the program's and
    XNNPACK's alike, goes to that data file, where ExecuTorch stores byte-identical
    buffers once: a tied embedding table and an output projection quantized the same
    way are kept once (``benchmarks/shared_embedding.py``).
    """
    if data_path is not None and data_path.parent != path.parent:
        raise ValueError("the data file must sit next to the .pte")
    tag = data_path.stem if data_path is not None else None
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    inferred_reshapes(program)
    drop_provenance(program)
    with forgetting_tracing_caches():
        with compact_dependency_viewers(), skipping_idle_xnnpack_passes():
            edge = to_edge_transform_and_lower(
                program,
                transform_passes=[_tag_weights_external(tag)] if tag else None,
                partitioner=[partitioner()],
                compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
                constant_methods=metadata,
            )
        executorch_program = edge.to_executorch(
            ExecutorchBackendConfig(
                extract_delegate_segments=True,
                memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
                do_quant_fusion_and_const_prop=True,
                external_constants=(lambda node: tag) if tag else False,
            )
        )
        del edge
        with open(path, "wb") as handle:
            executorch_program.write_to_file(handle)
        if tag:
            executorch_program.write_tensor_data_to_file(str(path.parent))
            if not data_path.is_file():
                raise RuntimeError(f"ExecuTorch wrote no {data_path.name}")
        del executorch_program
    return path.stat().st_size


@contextlib.contextmanager
def forgetting_tracing_caches():
    """On exit, drop what process-wide tracing caches still hold of the program lowered inside.

    - FakeTensorMode's class-level dispatch cache keys hold op arguments, among them
      the lowered delegate modules and, through them, the exported partitions with
      their weights (found with ``gc.get_referrers`` after a multi-variant run).
    - ExecuTorch's ``backend.utils.is_same_node`` has an unbounded ``lru_cache`` keyed
      by graph nodes, which keeps every partitioned graph alive.
    - torch.fx keeps the source of every recompiled graph in a module-level cache (and
      ``linecache``), and lowering recompiles the graph after most passes; entries
      created inside belong to graphs that are gone.
    """
    import linecache

    from executorch.exir.backend import utils as backend_utils
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx import graph_module

    fx_sources = graph_module._loader.eval_cache
    before = set(fx_sources)
    try:
        yield
    finally:
        FakeTensorMode.cache_clear()
        if hasattr(backend_utils.is_same_node, "cache_clear"):
            backend_utils.is_same_node.cache_clear()
        for key in set(fx_sources) - before:
            del fx_sources[key]
            linecache.cache.pop(key, None)
