"""Lowering helpers that do not need a full export."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))

    def forward(self, x):
        return x + self.inner(x)


def test_compact_dependency_viewer_matches_the_partitioners_own():
    """Same transitive up/downstream sets as torch's and ExecuTorch's viewers, on a graph with branches."""
    from executorch.exir.backend.canonical_partitioners.group_partitioner import _DependencyViewer as ExecuTorchViewer
    from torch.fx.passes.infra.partitioner import _DependencyViewer as TorchViewer

    from hub_export.patches.lowering import CompactDependencyViewer

    model = nn.Sequential(*[_Residual() for _ in range(4)])
    graph_module = torch.export.export(model, (torch.randn(2, 8),)).graph_module
    torch_viewer, executorch_viewer = TorchViewer(graph_module), ExecuTorchViewer(graph_module)
    compact = CompactDependencyViewer(graph_module)
    for node in graph_module.graph.nodes:
        downstream = compact.downstreams_of(node)
        assert set(downstream) == torch_viewer.downstreams_of(node) == executorch_viewer.downstreams_of(node)
        assert len(downstream) == len(torch_viewer.downstreams_of(node))
        assert all(other in downstream for other in torch_viewer.downstreams_of(node))
        assert set(compact.upstreams_of(node)) == executorch_viewer.upstreams_of(node)
    first, last = next(iter(graph_module.graph.nodes)), list(graph_module.graph.nodes)[-1]
    assert last not in compact.upstreams_of(first) and first not in compact.downstreams_of(last)


def test_compact_viewers_are_installed_only_while_lowering():
    import executorch.exir.backend.canonical_partitioners.group_partitioner as group_partitioner
    import torch.fx.passes.infra.partitioner as fx_partitioner

    from hub_export.patches.lowering import CompactDependencyViewer, compact_dependency_viewers

    originals = fx_partitioner._DependencyViewer, group_partitioner._DependencyViewer
    with compact_dependency_viewers():
        assert fx_partitioner._DependencyViewer is CompactDependencyViewer
        assert group_partitioner._DependencyViewer is CompactDependencyViewer
    assert (fx_partitioner._DependencyViewer, group_partitioner._DependencyViewer) == originals


def test_merge_checks_on_bits_answer_as_the_group_partitioners_own(monkeypatch):
    """Every pair of a graph's candidate partitions: the bitset check merges exactly where ExecuTorch's would. Both
    end on torch's ``validate_partition``; it is taken out here, so the answers are the reachability checks' own."""
    import itertools

    import torch.fx.passes.utils.fuser_utils as fuser_utils

    monkeypatch.setattr(fuser_utils, "validate_partition", lambda nodes: True)

    from executorch.exir.backend.canonical_partitioners.group_partitioner import GroupBasedPartitioner
    from torch.fx.passes.infra.partitioner import Partition
    from torch.fx.passes.operator_support import OperatorSupport

    from hub_export.patches.lowering import CompactDependencyViewer, merge_checks_on_bits

    model = nn.Sequential(*[_Residual() for _ in range(3)])
    graph_module = torch.export.export(model, (torch.randn(2, 8),)).graph_module
    nodes = [node for node in graph_module.graph.nodes if node.op == "call_function"]
    # Single nodes and runs of three: merging across a residual branch would make a cycle.
    groups = [nodes[i : i + 1] for i in range(len(nodes))] + [nodes[i : i + 3] for i in range(0, len(nodes) - 2, 2)]
    partitions = {index: Partition(index, group) for index, group in enumerate(groups)}
    partitioner = GroupBasedPartitioner(graph_module, OperatorSupport())
    pairs = list(itertools.permutations(partitions, 2))
    stock = [partitioner._can_merge_partitions(p1, p2, partitions) for p1, p2 in pairs]
    with merge_checks_on_bits():
        partitioner.dependency_viewer = CompactDependencyViewer(graph_module)
        on_bits = [partitioner._can_merge_partitions(p1, p2, partitions) for p1, p2 in pairs]
    assert on_bits == stock and True in stock and False in stock


def _lowered_bytes(model_dir, tmp_path, name: str, qmode: str = "8da4w", shared: bool = False) -> bytes:
    from hub_export.pipeline import lower, quantize
    from hub_export.pipeline.build import load_model
    from hub_export.tasks.text_generation.export import ExportableDecoder, export_program

    model = load_model(model_dir, trust_remote_code=False)
    quantize.quantize_model(model, qmode, "8w", 32)
    program = export_program(ExportableDecoder(model, 32))
    path = tmp_path / name
    data_path = path.with_suffix(".ptd") if shared else None
    lower.to_pte(
        program,
        lower.runner_metadata(max_seq_len=32, bos_id=1, eos_ids=[2], vocab_size=512, dynamic_shape=True),
        path,
        data_path,
    )
    return path.read_bytes() + (data_path.read_bytes() if shared else b"")


def test_xnnpack_preprocesses_its_partitions_on_the_programs_own_weights(monkeypatch):
    """ExecuTorch deep-copies each partition's program, weights included, before XNNPACK preprocesses it; under
    the patch the copies share the weights (no second copy of a quantized model in memory), same bytes."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    from executorch.exir import to_edge_transform_and_lower

    from hub_export.patches.weights import preprocessing_on_shared_weights

    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64)).eval()
    weights = {parameter.data_ptr() for parameter in model.parameters()}
    seen: list[int] = []
    stock = XnnpackBackend.preprocess

    def spy(edge_program, compile_specs):
        seen.extend(tensor.data_ptr() for tensor in edge_program.state_dict.values())
        return stock(edge_program, compile_specs)

    monkeypatch.setattr(XnnpackBackend, "preprocess", staticmethod(spy))

    def lowered() -> bytes:
        program = torch.export.export(model, (torch.randn(2, 64),))
        return to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch().buffer

    with preprocessing_on_shared_weights():
        shared = lowered()
    shared_seen, seen[:] = list(seen), []
    copied = lowered()
    assert shared == copied
    assert len(shared_seen) == 4 and set(shared_seen) <= weights
    assert len(seen) == 4 and not set(seen) & weights  # ExecuTorch's own path copies every weight
    assert "copy_exported_program_for_preprocess" not in XnnpackBackend.__dict__  # put back as it was


class _ThreePartitions(nn.Module):
    """Three linears that XNNPACK lowers as three partitions: a cumulative sum, which it has no kernel for, between."""

    def __init__(self):
        super().__init__()
        self.first, self.second, self.third = nn.Linear(64, 128), nn.Linear(128, 128), nn.Linear(128, 64)

    def forward(self, x):
        x = torch.cumsum(self.first(x), dim=-1)
        return self.third(torch.cumsum(self.second(x), dim=-1))


@pytest.mark.parametrize("qmode", ["8da4w", "8da8w"])
def test_each_quantized_weight_is_let_go_as_soon_as_xnnpack_has_packed_it(tmp_path, monkeypatch, qmode):
    """A caller that hands its programs over in a dict, and lets its model's weights go, holds a quantized weight
    only until XNNPACK has packed it: as each partition's turn comes, the weights of those packed before it are gone,
    and none is held while the file is written; same bytes as when lowering keeps them all."""
    import contextlib

    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    from torch.multiprocessing.reductions import StorageWeakRef

    from hub_export.pipeline import lower, quantize
    from hub_export.pipeline.build import let_weights_go

    def lowered(name: str) -> tuple[bytes, list[int]]:
        torch.manual_seed(0)
        model = _ThreePartitions().eval()
        quantize.quantize_linears(model, qmode, 32)
        storages = [
            StorageWeakRef(m.weight.qdata.untyped_storage()) for m in model.modules() if isinstance(m, nn.Linear)
        ]
        programs = {"forward": torch.export.export(model, (torch.randn(2, 64),))}
        let_weights_go(model)
        held: list[int] = []

        def count_held():
            held.append(sum(not storage.expired() for storage in storages))

        def preprocess(edge_program, compile_specs):  # called as each partition's turn comes
            count_held()
            return stock_preprocess(edge_program, compile_specs)

        def config_while_writing(*args, **kwargs):  # called as to_executorch starts
            count_held()
            return stock_config(*args, **kwargs)

        monkeypatch.setattr(XnnpackBackend, "preprocess", staticmethod(preprocess))
        monkeypatch.setattr(lower, "backend_config", config_while_writing)
        lower.to_pte(programs, {}, tmp_path / name)
        assert programs == {}
        return (tmp_path / name).read_bytes(), held

    stock_preprocess, stock_config = XnnpackBackend.preprocess, lower.backend_config
    released, held = lowered("released.pte")
    assert held == [3, 2, 1, 0]
    assert XnnpackBackend.__dict__["preprocess"].__func__.__name__ == "preprocess"  # the test's spy, put back
    monkeypatch.setattr(lower, "packed_weights_released", lambda programs: contextlib.nullcontext())
    kept, held = lowered("kept.pte")
    assert held == [3, 3, 3, 3]  # the Edge programs, then the lowered partitions' own programs, hold them all
    assert released == kept


@pytest.mark.slow  # two full lowerings (110 s): make test-all
def test_skipping_idle_xnnpack_passes_leaves_the_pte_unchanged(tiny_model, tmp_path, monkeypatch):
    """The passes skipped on a decoder would only have re-traced it: same bytes with and without skipping."""
    import contextlib

    from hub_export.pipeline import lower

    skipped = _lowered_bytes(tiny_model, tmp_path, "skipped.pte")
    monkeypatch.setattr(lower, "skipping_idle_xnnpack_passes", contextlib.nullcontext)
    every_pass = _lowered_bytes(tiny_model, tmp_path, "every-pass.pte")
    assert skipped == every_pass


@pytest.mark.slow  # six full lowerings (about 3 min): make test-all
@pytest.mark.parametrize("qmode, shared", [("8da4w", False), ("4w", False), ("8da4w", True)])
def test_skipped_traces_leave_the_pte_unchanged(tiny_model, tmp_path, monkeypatch, qmode, shared):
    """One decomposition and no idle ATen-to-Edge pass: same bytes as ExecuTorch's own path.

    8da4w has torchao's dynamic-quantization ops kept whole; 4w has the weight-only linear
    that hub-export's own partitioner config claims; a shared data file tags the weights
    with the custom metadata that one XNNPACK pass copies.
    """
    import contextlib

    from hub_export.pipeline import lower

    fast = _lowered_bytes(tiny_model, tmp_path, "fast.pte", qmode, shared)
    monkeypatch.setattr(lower, "decomposing_once", lambda programs, name, partitioner: contextlib.nullcontext())
    monkeypatch.setattr(lower, "skipping_idle_edge_passes", contextlib.nullcontext)
    stock = _lowered_bytes(tiny_model, tmp_path, "stock.pte", qmode, shared)
    assert fast == stock


@pytest.mark.slow  # two full lowerings (about 1 min): make test-all
def test_non_strict_export_gives_the_strict_pte(tiny_model, tmp_path, monkeypatch):
    """TorchDynamo's strict tracing, which the export used before, gives the same bytes, only slower."""
    non_strict = _lowered_bytes(tiny_model, tmp_path, "non-strict.pte")
    stock = torch.export.export
    monkeypatch.setattr(torch.export, "export", lambda *args, **kwargs: stock(*args, **{**kwargs, "strict": True}))
    strict = _lowered_bytes(tiny_model, tmp_path, "strict.pte")
    assert non_strict == strict


class _Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(x)


class _DoubleHardswish(nn.Module):
    def forward(self, x):
        return nn.functional.hardswish(x.double())  # XNNPACK keeps hardswish whole but has no float64 kernel


def test_decomposing_once_yields_a_program_that_needs_no_more_tracing():
    from hub_export.patches.lowering import decomposing_once
    from hub_export.pipeline.lower import partitioner

    program = torch.export.export(_Linear(), (torch.randn(2, 8),))
    xnnpack = partitioner()
    programs = {"forward": program}
    with decomposing_once(programs, "forward", xnnpack) as done:
        decomposed = programs["forward"]
        assert done and decomposed is not program
        assert decomposed.run_decompositions({}) is decomposed
        assert [n.target for n in decomposed.graph.nodes if n.op == "call_function"] == [torch.ops.aten.linear.default]
        assert xnnpack.ops_to_not_decompose(decomposed)[1] is None
    assert xnnpack.ops_to_not_decompose(program)[1] is not None  # the partitioner's own check again


def test_decomposing_once_gives_way_when_the_partitioner_refuses_a_kept_node(tmp_path):
    """A hardswish XNNPACK cannot take must be decomposed the stock way; the program still lowers."""
    from hub_export.patches.lowering import decomposing_once
    from hub_export.pipeline import lower

    program = torch.export.export(_DoubleHardswish(), (torch.randn(2, 8),))
    programs = {"forward": program}
    with decomposing_once(programs, "forward", lower.partitioner()) as done:
        assert done is None and programs["forward"] is program
    path = tmp_path / "hardswish.pte"
    assert lower.to_pte(program, {}, path) > 0


class _EdgePassFodder(nn.Module):
    """One node of each kind an idle-skipped ATen-to-Edge pass rewrites."""

    def forward(self, x, count):
        return x.view(-1) * count.int(), x + x.shape[0]


def test_edge_pass_triggers_find_the_nodes_their_passes_rewrite():
    from hub_export.patches.lowering import _mixed_types, _symbols_as_tensors, _transposes, _views

    x = torch.randn(2, 3)
    plain = torch.export.export(nn.Linear(3, 3), (x,)).run_decompositions({}).graph_module
    assert not any(found(plain) for found in (_mixed_types, _symbols_as_tensors, _transposes, _views))

    fodder = (
        torch.export.export(
            _EdgePassFodder(), (x, torch.tensor(2.0)), dynamic_shapes=({0: torch.export.Dim("rows")}, None)
        )
        .run_decompositions({})
        .graph_module
    )
    assert _views(fodder) and _mixed_types(fodder) and _symbols_as_tensors(fodder)
    graph = torch.fx.Graph()
    graph.output(graph.call_function(torch.ops.aten.t.default, (graph.placeholder("x"),)))
    assert _transposes(torch.fx.GraphModule({}, graph))

    from executorch.exir.dialects._ops import ops as exir_ops

    from hub_export.patches.lowering import _portable_layout_ops

    graph = torch.fx.Graph()
    graph.output(graph.call_function(exir_ops.edge.aten.mean.dim, (graph.placeholder("x"), [0])))
    assert _portable_layout_ops(torch.fx.GraphModule({}, graph)) and not _portable_layout_ops(plain)


def test_idle_edge_passes_are_skipped_only_while_lowering():
    from executorch.exir.passes.sym_to_tensor_pass import SymToTensorPass

    from hub_export.patches.lowering import skipping_idle_edge_passes

    stock = SymToTensorPass.call
    graph_module = torch.export.export(nn.Linear(3, 3), (torch.randn(2, 3),)).run_decompositions({}).graph_module
    with skipping_idle_edge_passes():
        result = SymToTensorPass()(graph_module)
        assert result.graph_module is graph_module and not result.modified  # nothing re-traced
    assert SymToTensorPass.call is stock


def test_passes_run_when_their_ops_are_present(monkeypatch):
    """A ReLU after a linear is fused by FuseActivationPass, so that pass must still run; the cat pass must not."""
    from executorch.backends.xnnpack._passes.decompose_cat import DecomposeConcatenate
    from executorch.backends.xnnpack._passes.fuse_activation_pass import FuseActivationPass
    from executorch.exir import to_edge_transform_and_lower

    from hub_export.patches.lowering import skipping_idle_xnnpack_passes
    from hub_export.pipeline.lower import partitioner

    ran = []
    for pass_type in (FuseActivationPass, DecomposeConcatenate):
        original = pass_type.call

        def recording(self, graph_module, _original=original, _name=pass_type.__name__):
            ran.append(_name)
            return _original(self, graph_module)

        monkeypatch.setattr(pass_type, "call", recording)
    from executorch.backends.xnnpack._passes import XNNPACKPassManager

    stock = XNNPACKPassManager.transform
    program = torch.export.export(_Residual(), (torch.randn(2, 8),))
    with skipping_idle_xnnpack_passes():
        to_edge_transform_and_lower(program, partitioner=[partitioner()])
    assert "FuseActivationPass" in ran and "DecomposeConcatenate" not in ran
    assert XNNPACKPassManager.transform is stock  # only while lowering


def test_a_patch_for_other_versions_is_left_out_and_said_once(monkeypatch, caplog):
    """After an upgrade the export must still work without the workaround, and tell the user once."""
    import executorch.exir.backend.canonical_partitioners.group_partitioner as group_partitioner

    from hub_export import patches
    from hub_export.patches import lowering

    stock = group_partitioner._DependencyViewer
    monkeypatch.setattr(patches, "_version", lambda package: "9.9.9")
    monkeypatch.setattr(patches, "_announced", set())
    with caplog.at_level("WARNING", logger="hub_export.patches"):
        for _ in range(2):
            with lowering.compact_dependency_viewers():
                assert group_partitioner._DependencyViewer is stock  # not patched
    warnings = [r.getMessage() for r in caplog.records if r.name == "hub_export.patches"]
    assert len(warnings) == 1
    assert "dependency-viewers" in warnings[0] and "9.9.9" in warnings[0] and "memory" in warnings[0]
    assert "executorch 1.5.x" in warnings[0]
