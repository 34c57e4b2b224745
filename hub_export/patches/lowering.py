"""Private parts of torch and ExecuTorch that make lowering faster and lighter: each declared and version-guarded with :func:`hub_export.patches.guarded`, each with what happens without it."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hub_export.patches import guarded


@guarded(
    "compiled-globals",
    "torch",
    ("2.13.",),
    upstream="torch._dynamo.functional_export's __compiled_fn_* globals",
    without="each variant's traced graph stays in memory until the run ends",
)
def forget_compiled_globals():
    """Remove the ``__compiled_fn_*`` globals strict export leaves behind.

    Dynamo installs each traced graph as a global of the module whose frame it traced
    (``torch._dynamo.functional_export``) and never removes it; the graph holds the
    model's (quantized) weights as constants, so in a multi-variant run every variant
    stayed resident (found with ``gc.get_referrers``).
    """
    try:
        from torch._dynamo import functional_export as traced_module
    except ImportError:  # another torch layout: nothing known to clean
        yield
        return

    def compiled() -> set[str]:
        return {name for name in vars(traced_module) if name.startswith("__compiled_fn_")}

    before = compiled()
    try:
        yield
    finally:
        for name in compiled() - before:
            delattr(traced_module, name)


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
    sets, quadratic in the graph's size: on a 30-layer decoder the largest single
    allocation of the whole export. The same relation as bitsets takes a few MB, and
    both partitioners only iterate it.
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

    def bits_of(self, nodes) -> int:
        """``nodes`` as a bitset (nodes the graph did not hold when this was made are left out: none reach them)."""
        bits = 0
        for node in nodes:
            position = self._index.get(node)
            if position is not None:
                bits |= 1 << position
        return bits

    def downstream_bits(self, node: torch.fx.Node) -> int:
        return self._downstream.get(node, 0)


@guarded(
    "dependency-viewers",
    "executorch",
    ("1.5.",),
    upstream="the partitioners' _DependencyViewer",
    without="partitioning holds far more memory on large graphs",
)
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


def _can_merge_on_bits(partitioner, p1, p2, partitions_by_id) -> bool:
    """``GroupBasedPartitioner._can_merge_partitions`` with the same answer, its reachability test done on bitsets.

    The stock check asks, for every node just outside the two partitions, whether any of
    its transitive downstream nodes is inside them, walking that downstream set node by
    node: on a 30-layer decoder's 8da4w graph, most of a minute of every lowering. Here
    the partitions are one bitset and each outside node's downstream set another, and the
    question is one AND. The final ``validate_partition`` is kept as it is.
    """
    from torch.fx.passes.utils.fuser_utils import validate_partition

    combined = set(partitions_by_id[p1].nodes) | set(partitions_by_id[p2].nodes)
    viewer = partitioner.dependency_viewer
    inside = viewer.bits_of(combined)
    for node in combined:
        for user in node.users:
            if user not in combined and viewer.downstream_bits(user) & inside:
                return False
    return validate_partition(list(combined))


@guarded(
    "partition-merge-on-bits",
    "executorch",
    ("1.5.",),
    upstream="GroupBasedPartitioner._can_merge_partitions",
    without="XNNPACK's partitioner spends most of a minute per 135M variant checking merges",
)
def merge_checks_on_bits():
    """Meanwhile, ExecuTorch's group partitioner checks merges with :func:`_can_merge_on_bits` where its dependency
    viewer is a :class:`CompactDependencyViewer` (inside :func:`compact_dependency_viewers`)."""
    from executorch.exir.backend.canonical_partitioners.group_partitioner import GroupBasedPartitioner

    stock = GroupBasedPartitioner._can_merge_partitions

    def can_merge(self, p1, p2, partitions_by_id):
        if isinstance(self.dependency_viewer, CompactDependencyViewer):
            return _can_merge_on_bits(self, p1, p2, partitions_by_id)
        return stock(self, p1, p2, partitions_by_id)

    GroupBasedPartitioner._can_merge_partitions = can_merge
    try:
        yield
    finally:
        GroupBasedPartitioner._can_merge_partitions = stock


def _op_names(ops) -> tuple[str, ...]:
    return tuple(op.__name__ for op in ops)


def _xnnpack_pass_triggers() -> dict[type, tuple[tuple[str, ...], ...] | Callable[[torch.fx.GraphModule], bool]]:
    """XNNPACK preprocess passes that can only change a graph holding certain ops.

    Each entry lists alternatives: the pass can act only if every op of one
    alternative is in the graph. The op lists are the ones each pass's ``call``
    looks for (the pattern passes: every op of their match patterns; the others:
    the class attributes they scan with). An entry may instead be a function that
    tells from the graph whether the pass has anything to do.
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
    from executorch.backends.xnnpack._passes.propagate_custom_meta_pass import PropagateCustomMetaPass
    from executorch.backends.xnnpack._passes.remove_redundant_copy_pass import RemoveRedundantCopyPass
    from executorch.exir.passes.memory_format_ops_pass import DimOrderOpsRevertPass, MemoryFormatOpsMap

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
        DimOrderOpsRevertPass: tuple((name,) for name in _op_names(MemoryFormatOpsMap)),
        PropagateCustomMetaPass: _custom_meta_to_propagate,
    }


def _custom_meta_to_propagate(graph_module: torch.fx.GraphModule) -> bool:
    """Whether a quantize or dequantize node has a parent with ``meta["custom"]`` (what PropagateCustomMetaPass copies)."""
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, is_quant

    return any(
        (is_quant(node) or is_dequant(node))
        and node.args
        and isinstance(node.args[0], torch.fx.Node)
        and "custom" in node.args[0].meta
        for node in graph_module.graph.nodes
    )


def _graph_op_names(graph: torch.fx.Graph) -> set[str]:
    return {getattr(node.target, "__name__", str(node.target)) for node in graph.nodes if node.op == "call_function"}


@guarded(
    "idle-xnnpack-passes",
    "executorch",
    ("1.5.",),
    upstream="executorch's XNNPACKPassManager.transform",
    without="every XNNPACK preprocess pass re-traces each partition (slower lowering)",
)
def skipping_idle_xnnpack_passes(on_partition: Callable[[], None] | None = None):
    """Meanwhile, XNNPACK's preprocess skips passes that cannot change the partition at hand.

    Every pass ends by re-tracing the whole partition under FakeTensor, whether or not
    it found anything to rewrite. A decoder's partitions hold no convolution, batch
    norm, upsampling, PReLU, concatenation, matmul or decomposed SDPA, so 10 to 11 of
    the 17 passes would only re-trace; skipping them makes lowering markedly faster with
    byte-identical ``.pte`` files (tests/test_lower.py checks the bytes). Triggers are checked on the graph as it is when each pass's turn
    comes, so ops an earlier pass introduces are seen.
    """
    from executorch.backends.xnnpack import _passes as xnnpack_passes
    from executorch.exir.pass_base import ExportPass
    from executorch.exir.program._program import _transform

    manager = xnnpack_passes.XNNPACKPassManager
    original = manager.transform
    triggers = _xnnpack_pass_triggers()

    def transform(self):
        if on_partition is not None:
            on_partition()  # XNNPACK preprocesses each partition through here: progress within lowering
        program = self.exported_program
        for pass_type in self.passes:
            trigger = triggers.get(pass_type)
            if callable(trigger) and not trigger(program.graph_module):
                continue
            if isinstance(trigger, tuple):
                present = _graph_op_names(program.graph_module.graph)
                if not any(all(op in present for op in ops) for ops in trigger):
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


@guarded(
    "tracing-caches",
    "executorch",
    ("1.5.",),
    upstream="FakeTensorMode, is_same_node and torch.fx source caches",
    without="lowered programs stay referenced until the process exits (more memory in multi-variant runs)",
)
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


class _AlreadyDecomposed(torch.export.ExportedProgram):
    """A program already functional and decomposed: ``run_decompositions({})`` returns it as it is."""

    def run_decompositions(self, decomp_table=None, decompose_custom_triton_ops=False):
        if decomp_table == {}:
            return self
        return super().run_decompositions(decomp_table, decompose_custom_triton_ops)


def _refused_nodes(program: torch.export.ExportedProgram, partitioner) -> list[torch.fx.Node]:
    """Nodes of the ops ``partitioner`` asks to keep whole that it would then refuse to take."""
    kept, claims = partitioner.ops_to_not_decompose(program)  # its check reads the program it is given
    if claims is None:
        return []
    return [
        node for node in program.graph.nodes if node.op == "call_function" and node.target in kept and not claims(node)
    ]


@guarded(
    "one-decomposition",
    "executorch",
    ("1.5.",),
    upstream="to_edge_transform_and_lower's decomposition (three full re-traces of the program)",
    without="lowering re-traces the whole program twice more (slower export)",
    otherwise=None,
)
def decomposing_once(programs: dict[str, torch.export.ExportedProgram], name: str, partitioner):
    """Meanwhile, ``programs[name]`` is decomposed in one trace, ready for ``to_edge_transform_and_lower``.

    For a partitioner that checks each node of the ops it keeps whole (XNNPACK does),
    ``to_edge_transform_and_lower`` traces the program three times: to functionalize it,
    to decompose all but those ops, and to decompose again the nodes the check refused.
    Each trace runs every node under FakeTensor with a symbolic sequence length; on
    SmolLM2 they are most of the time before partitioning. Here the program is
    decomposed once, keeping those ops; when the check accepts every such node, the
    other two traces could change nothing, so they are skipped (same ``.pte`` bytes:
    ``tests/test_lower.py``), and this yields True. When it refuses one, the program is
    left as it was, for the stock way, and this yields None. Only ``programs`` holds the
    program meanwhile, so a caller that empties it lets the program go.
    """
    from executorch.exir.program._program import _default_decomposition_table

    kept = partitioner.ops_to_not_decompose(programs[name])[0]  # not its check, which holds the program
    table = _default_decomposition_table()
    for op in kept:
        table.pop(op, None)
    decomposed = programs[name].run_decompositions(table)
    if _refused_nodes(decomposed, partitioner):
        yield None
        return
    decomposed.__class__ = _AlreadyDecomposed
    programs[name] = decomposed
    del decomposed
    # With no per-node check left, ExecuTorch keeps the ops whole without re-tracing.
    partitioner.ops_to_not_decompose = lambda ep: (list(kept), None)
    try:
        yield True
    finally:
        del partitioner.ops_to_not_decompose


def _tensor_slots(node: torch.fx.Node) -> list:
    """The arguments of ``node`` whose schema type is a Tensor, found as the Edge passes find them."""
    from executorch.exir.pass_base import map_args

    slots = []

    def collect(value, argument):
        if isinstance(argument.type, torch.TensorType):
            slots.append(value)
        return value

    map_args(node.target, collect, tuple(node.args), dict(node.kwargs))
    return slots


def _operator_nodes(graph_module: torch.fx.GraphModule):
    return (
        node
        for node in graph_module.graph.nodes
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
    )


def _example(graph_module: torch.fx.GraphModule, value):
    """What a pass sees of an argument: a node's (fake) tensor or symbol, a constant's tensor, a literal."""
    if isinstance(value, torch.fx.Node):
        if value.op == "get_attr":
            return getattr(graph_module, value.target, None)
        return value.meta.get("val")
    return value


def _transposes(graph_module) -> bool:
    return any(node.target == torch.ops.aten.t.default for node in _operator_nodes(graph_module))


def _views(graph_module) -> bool:
    return any(node.target.is_view for node in _operator_nodes(graph_module))


def _symbols_as_tensors(graph_module) -> bool:
    symbols = (torch.SymInt, torch.SymFloat, torch.SymBool)
    return any(
        isinstance(_example(graph_module, value), symbols)
        for node in _operator_nodes(graph_module)
        for value in _tensor_slots(node)
    )


def _mixed_types(graph_module) -> bool:
    """Whether RemoveMixedTypeOperators would cast an argument (it computes the same promotion)."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    aten, default = torch.ops.aten, ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
    # The pass's own allow-list (executorch 1.5), which it keeps inside its call_operator.
    kinds = {
        aten.add.Tensor: default,
        aten.mul.Tensor: default,
        aten.sub.Tensor: default,
        aten.div.Tensor: ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT,
        aten.div.Tensor_mode: default,
        aten.minimum.default: default,
    }
    for node in _operator_nodes(graph_module):
        if node.target not in kinds or len(node.args) <= 1:
            continue
        slots = [_example(graph_module, value) for value in _tensor_slots(node)]
        if not all(isinstance(value, torch.Tensor) for value in slots):
            return True  # a literal or symbol in a tensor slot would be converted
        kind = kinds[node.target]
        if node.target == aten.div.Tensor_mode and node.kwargs.get("rounding_mode") is None:
            kind = ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT
        arguments = [_example(graph_module, value) for value in node.args]
        promoted = elementwise_dtypes(*arguments, type_promotion_kind=kind)[1]
        if any(value.dtype != promoted for value in slots):
            return True
    return False


def _portable_layout_ops(graph_module) -> bool:
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass

    return any(node.target in LegalizePortableDimOrderPass._target_ops for node in graph_module.graph.nodes)


def _edge_pass_triggers() -> dict[type, Callable[[torch.fx.GraphModule], bool]]:
    """Edge-dialect passes that rewrite only nodes of a certain kind, and how to find such a node."""
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
    from executorch.exir.passes.remove_mixed_type_operators import RemoveMixedTypeOperators
    from executorch.exir.passes.replace_broken_ops_with_function_ops_pass import ReplaceBrokenOpsWithFunctionalOpsPass
    from executorch.exir.passes.sym_to_tensor_pass import SymToTensorPass

    return {
        NormalizeTransposePass: _transposes,
        ReplaceBrokenOpsWithFunctionalOpsPass: _views,
        SymToTensorPass: _symbols_as_tensors,
        RemoveMixedTypeOperators: _mixed_types,
        LegalizePortableDimOrderPass: _portable_layout_ops,  # in to_executorch, on the ops left outside delegates
    }


@guarded(
    "idle-edge-passes",
    "executorch",
    ("1.5.",),
    upstream="executorch's ATen-to-Edge and dim-order passes",
    without="five more re-traces of the whole program (slower lowering)",
)
def skipping_idle_edge_passes():
    """Meanwhile, the ATen-to-Edge passes that would find nothing to rewrite are skipped.

    Each is an ExportPass: it re-traces the whole program under FakeTensor even when no
    node is of the kind it rewrites. On a decoder, four of the ATen-to-Edge passes and
    ``to_executorch``'s dim-order legalization never find one, and on SmolLM2 each
    re-trace costs about as much as a decomposition. The triggers are
    checked on the graph as it is when each pass's turn comes (same ``.pte`` bytes:
    ``tests/test_lower.py``).
    """
    from torch.fx.passes.infra.pass_base import PassResult

    originals = {}
    for pass_type, acts_on in _edge_pass_triggers().items():
        original = originals[pass_type] = pass_type.call

        def call(self, graph_module, _original=original, _acts_on=acts_on):
            if not _acts_on(graph_module):
                return PassResult(graph_module, False)
            return _original(self, graph_module)

        pass_type.call = call
    try:
        yield
    finally:
        for pass_type, original in originals.items():
            pass_type.call = original
