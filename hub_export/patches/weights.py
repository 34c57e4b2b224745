"""Lowering without a second copy of the weights: ExecuTorch keeps each partition's weights beside what XNNPACK
packed from them, first as a deep copy while every partition is preprocessed, then in the lowered modules while
the file is written. Each patch here gives the same ``.pte`` bytes (``tests/test_lower.py``)."""

from __future__ import annotations

import torch

from hub_export.patches import guarded


def _program_tensors(program: torch.export.ExportedProgram) -> list[torch.Tensor]:
    """Every tensor ``program`` holds as data: its state dict, its lifted constants, its graph module's attributes."""
    tensors = [*program.state_dict.values(), *program.constants.values()]
    tensors += [value for value in vars(program.graph_module).values() if isinstance(value, torch.Tensor)]
    tensors += [*program.graph_module.parameters(), *program.graph_module.buffers()]
    return [tensor for tensor in tensors if isinstance(tensor, torch.Tensor)]


@guarded(
    "preprocess-on-shared-weights",
    "executorch",
    ("1.5.",),
    upstream="BackendDetails.copy_exported_program_for_preprocess",
    without="lowering holds a second copy of every quantized weight (1 byte per weight: 3.7 GB for a 4B model)",
)
def preprocessing_on_shared_weights():
    """Meanwhile, XNNPACK preprocesses copies of its partitions' graphs that share their weights.

    ExecuTorch deep-copies every partition's program, weights included, before the backend
    preprocesses any of them, in case a backend changes the graph; all the copies live
    until the last partition is done. XNNPACK's passes rewrite graphs and replace constants
    (assigning new tensors into the copy's own state dict) but never write into a weight,
    so sharing the tensors gives the same ``.pte`` bytes (``tests/test_lower.py``) without
    the copy.
    """
    import copy

    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    name = "copy_exported_program_for_preprocess"
    own = XnnpackBackend.__dict__.get(name)

    def copy_sharing_weights(cls, edge_program, compile_specs):
        return copy.deepcopy(edge_program, {id(tensor): tensor for tensor in _program_tensors(edge_program)})

    setattr(XnnpackBackend, name, classmethod(copy_sharing_weights))
    try:
        yield
    finally:
        if own is None:
            delattr(XnnpackBackend, name)
        else:
            setattr(XnnpackBackend, name, own)


@guarded(
    "forget-delegated-weights",
    "executorch",
    ("1.5.",),
    upstream="LoweredBackendModule.original_module",
    without="writing the file holds every delegated weight twice: as the graph had it and as XNNPACK packed it",
)
def delegated_weights_forgotten(edge):
    """Meanwhile, the partitions XNNPACK lowered keep their weights' shapes and dtypes, not their bytes.

    Each lowered module keeps the partition it was made from, weights included, although the file stores
    what XNNPACK packed (at Phi-4-mini's widths, about 3.6 GB of int8 codes beside the 1.8 GB packed from them
    while the file is written). ``to_executorch`` only runs that partition under fake tensors, to learn its outputs'
    shapes, and the emitter reads its graph: a zero-stride stand-in of each weight's shape and dtype gives the
    same ``.pte`` bytes (``tests/test_lower.py``) once nothing else holds the weights.
    """
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    for method in edge.methods:
        for module in edge.exported_program(method).graph_module.modules():
            if isinstance(module, LoweredBackendModule):
                _stand_in_weights(module.original_module)
    yield


def _stand_in_weights(program: torch.export.ExportedProgram) -> None:
    for table in (program.state_dict, program.constants):
        for name, value in list(table.items()):
            if isinstance(value, torch.Tensor) and value.numel() > 1:
                stand_in = torch.zeros((), dtype=value.dtype).expand(value.shape)
                is_parameter = isinstance(value, torch.nn.Parameter)
                table[name] = torch.nn.Parameter(stand_in, requires_grad=False) if is_parameter else stand_in
