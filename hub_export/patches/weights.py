"""Lowering without a second copy of the weights: ExecuTorch keeps each partition's weights beside what XNNPACK
packed from them, as a deep copy while every partition is preprocessed, and in the Edge programs and the lowered
modules until the file is written. Each patch here gives the same ``.pte`` bytes (``tests/test_lower.py``)."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections import Counter
from collections.abc import Callable

import torch

from hub_export.patches import guarded


def _program_tensors(program: torch.export.ExportedProgram, inner: bool = False) -> list[torch.Tensor]:
    """Every tensor ``program`` holds as data: its state dict, its lifted constants, its graph module's attributes;
    with ``inner``, the tensors a tensor subclass (a quantized weight) is made of too."""
    tensors = [*program.state_dict.values(), *program.constants.values()]
    tensors += [value for value in vars(program.graph_module).values() if isinstance(value, torch.Tensor)]
    tensors += [*program.graph_module.parameters(), *program.graph_module.buffers()]
    tensors = [tensor for tensor in tensors if isinstance(tensor, torch.Tensor)]
    if inner:
        tensors += [part for tensor in tensors for part in _inner_tensors(tensor)]
    return tensors


def _inner_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    if not hasattr(tensor, "__tensor_flatten__") or type(tensor) in (torch.Tensor, torch.nn.Parameter):
        return []
    names, _ = tensor.__tensor_flatten__()
    parts = [getattr(tensor, name) for name in names]
    return parts + [inner for part in parts for inner in _inner_tensors(part)]


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
    "release-packed-weights",
    "executorch",
    ("1.5.",),
    upstream="backend_api.lower_all_submodules_to_backend",
    without="lowering holds every quantized weight beside what XNNPACK packed from it until the file is written"
    " (at 1B parameters about 1.5 GB of int8 codes)",
)
def packed_weights_released(programs: dict[str, torch.export.ExportedProgram]):
    """Meanwhile, each quantized weight is let go as soon as XNNPACK has packed the last partition that reads it.

    ``programs`` are handed over: once the Edge programs are made, which hold all lowering still needs, the dict is
    emptied. ExecuTorch keeps every weight until the file is written: in the Edge programs until every partition is
    packed, then in each lowered partition's own program (``original_module``), which ``to_executorch`` only runs
    under fake tensors to learn its outputs' shapes. Once packed, a weight that lowering made for itself (the
    unwrapped codes and scales of a quantized weight) becomes a zero-stride stand-in of its shape and dtype, wherever
    lowering holds it; the caller's own tensors, and those the graph still reads outside XNNPACK, are left alone.
    Same ``.pte`` bytes (``tests/test_lower.py``).
    """
    from executorch.exir.backend import backend_api

    # Weak references: an id alone could name a tensor made later, once the caller's is gone.
    callers = {id(t): weakref.ref(t) for program in programs.values() for t in _program_tensors(program, inner=True)}
    stock = backend_api.lower_all_submodules_to_backend

    def lowering_and_releasing(backend_id, method_to_submodules_nodes, method_to_tagged_edge_program):
        programs.clear()  # the Edge programs hold what lowering needs from here on
        gc.collect()  # a program's graph refers back to it: only the collector frees them
        partitions = [node for nodes in method_to_submodules_nodes.values() for node in nodes]
        uses = Counter(
            key for node in partitions for key in {id(t) for t in _program_tensors(node.meta["submodule_program"])}
        )
        beside = _read_beside(set(partitions), method_to_tagged_edge_program.values())

        def kept(tensor: torch.Tensor) -> bool:
            caller = callers.get(id(tensor))
            return id(tensor) in beside or (caller is not None and caller() is tensor)

        with _released_once_packed(uses, kept):
            return stock(backend_id, method_to_submodules_nodes, method_to_tagged_edge_program)

    backend_api.lower_all_submodules_to_backend = lowering_and_releasing
    try:
        yield
    finally:
        backend_api.lower_all_submodules_to_backend = stock


def _read_beside(partitions: set, owners) -> set[int]:
    """Ids of the tensors the owning programs' graphs read outside ``partitions`` (the lowered call nodes)."""
    kept: set[int] = set()
    for program in owners:
        signature = program.graph_signature
        sources = {**signature.inputs_to_parameters, **signature.inputs_to_buffers}
        constants = signature.inputs_to_lifted_tensor_constants
        for node in program.graph.nodes:
            if node.op != "placeholder" or all(user in partitions for user in node.users):
                continue
            if node.name in sources:
                kept.add(id(program.state_dict.get(sources[node.name], program.constants.get(sources[node.name]))))
            elif node.name in constants:
                kept.add(id(program.constants[constants[node.name]]))
    return kept


@contextlib.contextmanager
def _released_once_packed(uses: Counter, kept: Callable[[torch.Tensor], bool]):
    """Meanwhile, XNNPACK's preprocess stands in each weight it read once no partition left to pack reads it."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    stock = XnnpackBackend.__dict__["preprocess"]

    def preprocess(edge_program, compile_specs):
        read = {id(tensor): tensor for tensor in _program_tensors(edge_program)}  # before XNNPACK replaces any
        result = stock.__func__(edge_program, compile_specs)
        for key, tensor in read.items():
            uses[key] -= 1
            if uses[key] == 0 and not kept(tensor):
                _stand_in(tensor)
        return result

    XnnpackBackend.preprocess = staticmethod(preprocess)
    try:
        yield
    finally:
        XnnpackBackend.preprocess = stock


def _stand_in(tensor: torch.Tensor) -> None:
    """``tensor`` keeps its shape and dtype but no memory: every holder of this object sees a zero-stride view."""
    if tensor.numel() > 1 and not isinstance(tensor, torch._subclasses.FakeTensor):
        tensor.data = torch.zeros((), dtype=tensor.dtype).expand(tensor.shape)
