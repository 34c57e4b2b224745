"""Inspect: what is inside a ``.pte`` without running it (``hub-export inspect``).

For each method: its inputs (dtype and shape as planned; a dynamic dimension shows its
upper bound), how many XNNPACK partitions it calls, and the operators it runs outside
them with their counts (what ``export_llm``'s delegation table shows); the file's
constant methods (the runner metadata); its size by part (delegate blobs, program
constants, the rest). A slow file usually shows why here: an operator that fell out of
XNNPACK splits a layer into several partitions with a runtime hop between them.

Example:
    >>> summary = inspect_pte("out/model-8da4w-emb8w.pte")
    >>> summary.methods[0].name, summary.methods[0].partitions
    ('forward', 1)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hub_export.errors import InputError

_DTYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 6: "float32", 7: "float64", 11: "bool"}


@dataclass
class MethodSummary:
    """One method of a program: what it takes, and where its work runs."""

    name: str
    inputs: list[str]  # "int64[1, 255]" per input (planned upper bounds)
    partitions: int  # calls into a delegate (XNNPACK)
    backends: dict[str, int]  # delegate calls by backend
    outside: dict[str, int]  # operator calls outside any delegate, by operator, most frequent first


@dataclass
class PteSummary:
    """What :func:`inspect_pte` reads from a file."""

    file: str
    size_bytes: int
    methods: list[MethodSummary]
    metadata: dict[str, Any]  # the constant methods
    size_by_part: dict[str, int] = field(default_factory=dict)  # delegate blobs, constants, the rest


def _value_description(value) -> str:
    if type(value).__name__ == "Tensor":
        return f"{_DTYPES.get(int(value.scalar_type), str(value.scalar_type))}{list(value.sizes)}"
    return type(value).__name__.lower()


def _method(plan) -> MethodSummary:
    backends: Counter[str] = Counter()
    outside: Counter[str] = Counter()
    for chain in plan.chains:
        for instruction in chain.instructions:
            kind = type(instruction.instr_args).__name__
            if kind == "DelegateCall":
                backends[plan.delegates[instruction.instr_args.delegate_index].id] += 1
            elif kind == "KernelCall":
                outside[plan.operators[instruction.instr_args.op_index].name] += 1
    return MethodSummary(
        name=plan.name,
        inputs=[_value_description(plan.values[index].val) for index in plan.inputs],
        partitions=sum(backends.values()),
        backends=dict(backends),
        outside=dict(outside.most_common()),
    )


def _sizes(program, total: int) -> dict[str, int]:
    """Bytes by part, from the program's table of segments (each part inline in the program where the file has
    no segments): XNNPACK's weights (named data), program constants (embedding tables...), delegate graphs."""
    segments = program.segments or []  # a program may hold none of these parts, or keep its weights in a .ptd
    weights = sum(segments[index].size for index in {entry.segment_index for entry in program.named_data or []})
    constants = sum(len(buffer.storage) for buffer in program.constant_buffer or [])
    if program.constant_segment is not None and program.constant_segment.offsets:
        constants += segments[program.constant_segment.segment_index].size
    graphs = sum(len(blob.data) for blob in program.backend_delegate_data or [])
    graphs += sum(
        segments[index].size
        for index in {
            delegate.processed.index
            for plan in program.execution_plan
            for delegate in plan.delegates
            if delegate.processed.location.name == "SEGMENT"
        }
    )
    return {
        "delegate weights": weights,
        "program constants": constants,
        "delegate graphs": graphs,
        "the rest": max(total - weights - constants - graphs, 0),
    }


def inspect_pte(path: str | Path) -> PteSummary:
    """Read ``path``'s program: methods, inputs, partitions, operators outside delegates, metadata, size by part.

    The file is parsed, not loaded by the runtime. Where this ExecuTorch cannot be read
    that way (another version), methods carry inputs only and partitions are 0.

    Raises:
        InputError: the file is not an ExecuTorch program.
    """
    from hub_export.patches import read_program  # the ExecuTorch serializer: loaded when a file is inspected
    from hub_export.runtime.pte import PteModel, program_size

    path = Path(path)
    try:
        program_bytes = program_size(path)  # the header checked, once
    except Exception as error:  # the header check's one line, whatever it raised
        raise InputError(f"{path.name} is not an ExecuTorch program ({error})") from None
    size = path.stat().st_size
    model = PteModel(path, load=())  # the program and its metadata: no method is loaded (a 1 GB file would be)
    try:
        program = read_program(path, program_bytes)
    except Exception as error:  # a damaged file the runtime accepted: say so, keep what the runtime read
        raise InputError(f"{path.name} cannot be parsed ({type(error).__name__}); pull or export it again") from None
    if program is None:
        methods = [MethodSummary(name, [], 0, {}, {}) for name in model.methods]
        return PteSummary(path.name, size, methods, model.metadata)
    plans = [plan for plan in program.execution_plan if plan.name in model.methods]
    return PteSummary(path.name, size, [_method(plan) for plan in plans], model.metadata, _sizes(program, size))


def delegation_record(summary: PteSummary) -> dict[str, Any]:
    """The manifest's record of where ``summary``'s methods run: partitions and the operators outside them."""
    return {
        method.name: {"partitions": method.partitions, "outside": dict(list(method.outside.items())[:32])}
        for method in summary.methods[:16]
    }


def delegation_line(record: dict[str, Any]) -> str:
    """``forward: 1 XNNPACK partition, 3 operator calls outside (embedding 1, ...)``, one method after another."""
    parts = []
    for method, entry in record.items():
        outside = entry.get("outside", {})
        calls = sum(outside.values())
        ops = ", ".join(f"{op.split('::')[-1]} {count}" for op, count in list(outside.items())[:4])
        partitions = entry.get("partitions", 0)
        parts.append(f"{method}: {partitions} XNNPACK partition{'s' if partitions != 1 else ''}, {calls} operator "
                     f"call{'s' if calls != 1 else ''} outside" + (f" ({ops})" if ops else ""))  # fmt: skip
    return "; ".join(parts)
