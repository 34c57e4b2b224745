"""Lowering helpers that do not need a full export."""

from __future__ import annotations

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

    from hub_export.lower import CompactDependencyViewer

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

    from hub_export.lower import CompactDependencyViewer, compact_dependency_viewers

    originals = fx_partitioner._DependencyViewer, group_partitioner._DependencyViewer
    with compact_dependency_viewers():
        assert fx_partitioner._DependencyViewer is CompactDependencyViewer
        assert group_partitioner._DependencyViewer is CompactDependencyViewer
    assert (fx_partitioner._DependencyViewer, group_partitioner._DependencyViewer) == originals
