"""Layer by layer: a causal LM whose decoder layers are read from the checkpoint only while they are needed.

A 4B model's float32 weights are 16 GB; loading them whole, then quantizing a copy,
then lowering it, needs about 1.6 times that. Here the model is built on the meta
device, only its outer parts (embeddings, final norm, output head, rotary tables) are
loaded, and each decoder layer is read from the safetensors files when it is needed
and dropped after. What needs the float32 model runs as passes over the layers:

- :meth:`LayerwiseModel.start` runs the model once with every decoder layer replaced
  by a stand-in that records what the model hands it (the hidden states entering the
  first layer; each layer's attention mask and rotary tables) and passes its input on;
- :meth:`LayerPass.advance` runs one loaded layer over every recorded window, so the
  next layer's inputs are this layer's float32 outputs;
- :meth:`LayerwiseModel.logits` runs the model's own final norm and head over the
  last layer's outputs (the stand-ins pass the final hidden states through).

The model's own forward code does the embedding, the masks and the head, so every
family's details (Gemma's scaled embedding and soft-capping, sliding-window masks,
per-layer rotary tables) are kept without knowing them here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hub_export.errors import SourceError
from hub_export.pipeline.quantize import STORED_ROWS
from hub_export.progress import time_left

if TYPE_CHECKING:
    import torch
    from torch import nn

INDEX_FILE = "model.safetensors.index.json"


class Checkpoint:
    """The safetensors files of a model folder, read a few tensors at a time.

    Each read opens the file's memory map, copies the tensors out as float32 and closes
    it, so the pages it touched leave the process's resident memory with it.
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self.files: dict[str, Path] = {}
        index = folder / INDEX_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
            for name, file in weight_map.items():
                self.files[str(name)] = self._inside(str(file))
        else:
            from safetensors import safe_open

            for path in sorted(folder.glob("*.safetensors")):
                with safe_open(str(path), framework="pt") as handle:
                    self.files.update(dict.fromkeys(handle.keys(), path))

    def _inside(self, name: str) -> Path:
        path = (self.folder / name).resolve()
        if self.folder.resolve() not in path.parents or path.suffix != ".safetensors":
            raise SourceError(f"{INDEX_FILE} names {name!r}, which is not a safetensors file in the model folder")
        return path

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def read(self, names: list[str]) -> dict[str, torch.Tensor]:
        """``names``' tensors as float32 copies that own their memory."""
        import torch
        from safetensors import safe_open

        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.files[name], []).append(name)
        tensors = {}
        for path, wanted in by_file.items():
            with safe_open(str(path), framework="pt") as handle:
                for name in wanted:
                    mapped = handle.get_tensor(name)
                    tensors[name] = mapped.to(torch.float32, copy=True)
                    del mapped
        return tensors

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape tensor ``name`` is stored with, read from its file's header."""
        from safetensors import safe_open

        with safe_open(str(self.files[name]), framework="pt") as handle:
            return tuple(handle.get_slice(name).get_shape())

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of tensor ``name`` as a float32 copy: the rest of it is never read."""
        import torch
        from safetensors import safe_open

        with safe_open(str(self.files[name]), framework="pt") as handle:
            mapped = handle.get_slice(name)[start:stop]
            return mapped.to(torch.float32, copy=True)


class StoredRows:
    """A 2-D weight of the checkpoint, read a slice of rows at a time: ``rows[a:b]`` is float32 [b - a, cols].

    What a pass needs of an output head after the walk (GPTQ's rounding, the logits) goes through its rows in
    order, so the whole float32 table (2.5 GB at Phi-4-mini's 200,064 x 3,072) is never held at once.
    """

    def __init__(self, checkpoint: Checkpoint, name: str, shape: tuple[int, int]):
        self.checkpoint, self.name, self.shape = checkpoint, name, shape

    def __getitem__(self, rows: slice) -> torch.Tensor:
        start, stop, step = rows.indices(self.shape[0])
        if step != 1:
            raise IndexError("stored rows are read as one contiguous slice")
        return self.checkpoint.read_rows(self.name, start, stop)


def _check_shape(name: str, module: nn.Module, attribute: str, stored: tuple[int, ...]) -> None:
    """Raise :class:`SourceError` when the checkpoint stores ``name`` in another shape than the config builds."""
    expected = tuple(module._parameters[attribute].shape)
    if expected != stored:
        raise SourceError(f"the checkpoint's {name} is shaped {stored}; the config makes it {expected}")


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The name and the list of ``model``'s decoder layers (the module list as long as its layer count)."""
    from torch import nn

    count = model.config.get_text_config().num_hidden_layers
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == count and count > 0:
            return name, module
    raise SourceError(f"{type(model).__name__} has no list of {count} decoder layers to read one at a time")


def _parameter_aliases(model: nn.Module) -> dict[str, list[tuple[nn.Module, str]]]:
    """Each parameter by its first name, with every (module, attribute) that holds it (tied weights share one)."""
    groups: dict[int, str] = {}
    aliases: dict[str, list[tuple[nn.Module, str]]] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for attribute, param in module._parameters.items():
            if param is None:
                continue
            name = f"{module_name}.{attribute}" if module_name else attribute
            first = groups.setdefault(id(param), name)
            aliases.setdefault(first, []).append((module, attribute))
    return aliases


class _StopForward(Exception):
    """Raised where the rest of a forward pass is not needed."""


def _stand_in_class():
    from torch import nn

    class StandIn(nn.Module):
        """Stands in for a decoder layer during a pass: records its arguments and passes hidden states through."""

        def __init__(self, layer: nn.Module, calls: list, stop: bool, output: torch.Tensor | None = None):
            super().__init__()
            # Kept outside nn.Module's registries: the stand-in must not own the layer's weights.
            object.__setattr__(self, "_layer", layer)
            self.calls, self.stop, self.output = calls, stop, output

        def __getattr__(self, name: str) -> Any:  # the model's loop may read a layer's attributes (its type)
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(object.__getattribute__(self, "_layer"), name)

        def forward(self, hidden_states, *args, **kwargs):
            self.calls.append((hidden_states, args, kwargs))
            if self.stop:
                raise _StopForward
            return hidden_states if self.output is None else self.output

    return StandIn


@dataclass
class LayerPass:
    """Windows of token ids on their way through the decoder layers: the hidden states entering the next layer,
    and what the model handed each layer (mask, rotary tables) per window."""

    windows: list[torch.Tensor]
    eager: bool
    # (index, layer) -> a context around this pass's run through the layer (hooks that only this pass feeds)
    observe: Callable[[int, nn.Module], Any] | None = None
    hidden: list[torch.Tensor] = field(default_factory=list)
    arguments: list[list[tuple[tuple, dict]]] = field(default_factory=list)  # [window][layer] -> (args, kwargs)

    def advance(self, model: LayerwiseModel, index: int, layer: nn.Module) -> None:
        """Run loaded ``layer`` (number ``index``) over every window: its outputs become the next layer's inputs."""
        import contextlib

        import torch

        observed = self.observe(index, layer) if self.observe is not None else contextlib.nullcontext()
        with torch.no_grad(), model.attention(self.eager), observed:
            for window, hidden in enumerate(self.hidden):
                args, kwargs = self.arguments[window][index]
                self.hidden[window] = layer(hidden, *args, **kwargs)


class LayerwiseModel:
    """A causal LM of ``folder`` with its outer parts loaded and its decoder layers still on disk.

    Example:
        >>> lw = LayerwiseModel.open(folder)
        >>> state = lw.start([torch.tensor([[1, 2, 3]])])
        >>> for index in range(lw.count):
        ...     with lw.layer(index) as layer:
        ...         state.advance(lw, index, layer)
        >>> lw.logits(state, 0).shape
        torch.Size([3, 49152])
    """

    def __init__(self, model: nn.Module, checkpoint: Checkpoint, tables: bool = True):
        self.model = model
        self.checkpoint = checkpoint
        self.prefix, self.layers = decoder_layers(model)
        self.count = len(self.layers)
        self._aliases = _parameter_aliases(model)
        outer = [name for name in self._aliases if not self._in_layers(name)]
        on_disk = [] if tables else self._table_names()
        self._assign(self._read([name for name in outer if name not in on_disk]))
        self._leave_on_disk(on_disk)

    @classmethod
    def open(cls, folder: Path, trust_remote_code: bool = False, tables: bool = True) -> LayerwiseModel:
        """Build ``folder``'s model on the meta device and load its outer parts; with ``tables=False``, all but the
        input embedding table and a linear output head's weight, which stay on disk as :meth:`release_tables`
        leaves them (for a quantizer that reads them a slice of rows at a time).

        Raises:
            SourceError: the checkpoint does not hold the weights the model's class expects under its names.
        """
        import torch
        import transformers
        from accelerate import init_empty_weights

        config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        with init_empty_weights(include_buffers=False):
            model = transformers.AutoModelForCausalLM.from_config(
                config, dtype=torch.float32, trust_remote_code=trust_remote_code
            )
        model.tie_weights()  # built on meta, transformers leaves tied weights apart until asked
        return cls(model.eval(), Checkpoint(folder), tables)

    @staticmethod
    def can_stream(folder: Path) -> bool:
        """Whether ``folder``'s weights are safetensors files that can be read one layer at a time."""
        return (folder / INDEX_FILE).is_file() or any(folder.glob("*.safetensors"))

    def _in_layers(self, name: str) -> bool:
        return name.startswith(self.prefix + ".")

    def layer_prefix(self, index: int) -> str:
        """The names of decoder layer ``index``'s modules start with this."""
        return f"{self.prefix}.{index}."

    def _stored_name(self, name: str) -> str:
        """``name`` as the checkpoint spells it: whole, or without the base model's prefix (``transformer.``,
        ``model.``), as older checkpoints saved the bare base model."""
        prefix = f"{getattr(self.model, 'base_model_prefix', '')}."
        if name not in self.checkpoint and name.startswith(prefix) and name[len(prefix) :] in self.checkpoint:
            return name[len(prefix) :]
        return name

    def _read(self, names: list[str]) -> dict[str, torch.Tensor]:
        stored = {name: self._stored_name(name) for name in self._present(names)}
        tensors = self.checkpoint.read(list(stored.values()))
        return {name: tensors[spelled] for name, spelled in stored.items()}

    def _present(self, names: list[str]) -> list[str]:
        """``names``, each of which the checkpoint must hold (whole or without the base model's prefix)."""
        missing = [name for name in names if self._stored_name(name) not in self.checkpoint]
        if missing:
            raise SourceError(
                f"the checkpoint has no weight {missing[0]!r} that {type(self.model).__name__} expects"
                f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; re-save the model with "
                "save_pretrained"
            )
        return names

    def _assign(self, tensors: dict[str, torch.Tensor]) -> None:
        import torch

        for name, tensor in tensors.items():
            param = torch.nn.Parameter(tensor, requires_grad=False)
            for module, attribute in self._aliases[name]:
                _check_shape(name, module, attribute, tuple(tensor.shape))
                module._parameters[attribute] = param

    def layer_names(self, index: int) -> list[str]:
        return [name for name in self._aliases if name.startswith(self.layer_prefix(index))]

    def load_layer(self, index: int) -> nn.Module:
        """Decoder layer ``index`` with its float32 weights read from the checkpoint."""
        self._assign(self._read(self.layer_names(index)))
        return self.layers[index]

    def unload_layer(self, index: int) -> None:
        """Put decoder layer ``index``'s weights back on the meta device (their memory is freed)."""
        self._unload(self.layer_names(index))

    def _unload(self, names: list[str]) -> None:
        import torch

        for name in names:
            for module, attribute in self._aliases[name]:
                old = module._parameters[attribute]
                module._parameters[attribute] = torch.nn.Parameter(torch.empty_like(old, device="meta"), False)

    def _name_of(self, module: nn.Module) -> str:
        """The name ``module``'s weight is stored under (a head tied to the table holds the table's)."""
        return next(name for name, holders in self._aliases.items() if (module, "weight") in holders)

    def _input_embedding(self) -> str:
        return self._name_of(self.model.get_input_embeddings())

    def release_tables(self) -> None:
        """Let the float32 input embedding table and the output head's weight go once every pass has started
        (each 2.5 GB at Phi-4-mini's widths): the layers are all a walk needs after :meth:`start`, which reads the
        table back when it runs again, and what comes after the walk reads the head a slice of rows at a time
        (:meth:`head_rows`). Each module whose weight went carries its :class:`StoredRows`
        (:data:`~hub_export.pipeline.quantize.STORED_ROWS`)."""
        self._leave_on_disk(self._table_names())

    def _table_names(self) -> list[str]:
        """The input embedding table and a linear output head's weight (tied or not); none when a head of another
        kind runs whole over the table."""
        import torch

        head = self.model.get_output_embeddings()
        names = [self._input_embedding()]
        if isinstance(head, torch.nn.Linear):
            names.append(self._name_of(head))
        elif head is not None and head.weight is self.model.get_input_embeddings().weight:
            return []
        return list(dict.fromkeys(names))

    def _leave_on_disk(self, names: list[str]) -> None:
        self._unload([name for name in names if not self._is_meta(name)])
        for name in self._present(names):
            stored = self._stored_name(name)
            shape = self.checkpoint.shape(stored)
            for module, attribute in self._aliases[name]:
                _check_shape(name, module, attribute, shape)
                if attribute == "weight":
                    setattr(module, STORED_ROWS, StoredRows(self.checkpoint, stored, shape))

    def _is_meta(self, name: str) -> bool:
        module, attribute = self._aliases[name][0]
        return module._parameters[attribute].device.type == "meta"

    def _released(self) -> bool:
        return self._is_meta(self._input_embedding())

    def head_rows(self) -> StoredRows | torch.Tensor:
        """The output head's float32 weight: held, or read from the checkpoint a slice of rows at a time once
        :meth:`release_tables` let it go."""
        stored = self._stored_head()
        return self.model.get_output_embeddings().weight if stored is None else stored

    def _stored_head(self) -> StoredRows | None:
        head = self.model.get_output_embeddings()
        if head is None or head.weight.device.type != "meta":
            return None
        return getattr(head, STORED_ROWS)  # a head is let go only by _leave_on_disk, which hangs its rows on it

    def _inputs(self, window: torch.Tensor) -> dict[str, torch.Tensor]:
        """What the model's forward is given for ``window`` when the stand-ins replace every layer's output:
        its token ids, or, with the embedding table let go, float32 zeros of the embeddings' shape (never read)."""
        import torch

        if not self._released():
            return {"input_ids": window}
        width = self.model.get_input_embeddings().embedding_dim
        return {"inputs_embeds": torch.zeros(window.shape[0], window.shape[1], width)}

    @contextmanager
    def layer(self, index: int) -> Iterator[nn.Module]:
        """Decoder layer ``index`` loaded for the duration of the block."""
        try:
            yield self.load_layer(index)
        finally:
            self.unload_layer(index)

    @contextmanager
    def attention(self, eager: bool):
        """The model's own attention (what calibration sees), or transformers' eager math (what references use)."""
        from hub_export.tasks.text_generation.export import (
            eager_attention,  # wrap imports torch: loaded when a pass runs
        )

        if not eager:
            yield
            return
        with eager_attention(self.model):
            yield

    @contextmanager
    def _stand_ins(self, calls: list[list], stop_after: int | None, output: torch.Tensor | None = None):
        stand_in = _stand_in_class()
        originals = list(self.layers)
        last = self.count - 1
        for index, layer in enumerate(originals):
            self.layers[index] = stand_in(layer, calls[index], index == stop_after, output if index == last else None)
        try:
            yield
        finally:
            for index, layer in enumerate(originals):
                self.layers[index] = layer

    def start(self, windows: list[torch.Tensor], eager: bool = False) -> LayerPass:
        """Record what the model hands each decoder layer for each of ``windows`` (token ids [1, n], fed from 0)."""
        import torch

        state = LayerPass(list(windows), eager)
        if self._released():
            self._assign(self._read([self._input_embedding()]))
        for window in windows:
            calls: list[list] = [[] for _ in range(self.count)]
            with torch.no_grad(), self.attention(eager), self._stand_ins(calls, stop_after=self.count - 1):
                try:
                    self.model(input_ids=window, use_cache=False)
                except _StopForward:
                    pass
            state.hidden.append(calls[0][0][0])
            state.arguments.append([(call[0][1], call[0][2]) for call in calls])
        return state

    def logits(self, state: LayerPass, window: int) -> torch.Tensor:
        """The model's logits [n, vocab] (float32) for ``state``'s window after its last layer."""
        import torch

        from hub_export.tasks.text_generation.export import sliced_head  # wrap imports torch: loaded by a pass

        calls: list[list] = [[] for _ in range(self.count)]
        with torch.no_grad(), self.attention(state.eager), self._stand_ins(calls, None, state.hidden[window]):
            with sliced_head(self.model, weight=self._stored_head()):
                return self.model(**self._inputs(state.windows[window]), use_cache=False).logits[0].float()

    def head_inputs(self, state: LayerPass, window: int, head: nn.Module) -> torch.Tensor:
        """What the output ``head`` receives for ``state``'s window (the final norm's output), without running it."""
        import torch

        seen = []

        def catch(module, inputs):
            seen.append(inputs[0])
            raise _StopForward

        handle = head.register_forward_pre_hook(catch)  # the head's weight may be let go: it is never run
        calls: list[list] = [[] for _ in range(self.count)]
        try:
            with torch.no_grad(), self.attention(state.eager), self._stand_ins(calls, None, state.hidden[window]):
                self.model(**self._inputs(state.windows[window]), use_cache=False)
        except _StopForward:
            pass
        finally:
            handle.remove()
        return seen[0]

    def walk(
        self,
        passes: list[LayerPass],
        after: Callable[[int, nn.Module], None] = lambda index, layer: None,
        say: Callable[[str], None] = lambda message: None,
        what: str = "layer",
    ) -> None:
        """Load each decoder layer once, run every pass through it, call ``after(index, layer)``, then drop it.

        ``say`` gets one line per layer with an estimate of the time left.
        """
        started = time.perf_counter()
        for index in range(self.count):
            with self.layer(index) as layer:
                for state in passes:
                    state.advance(self, index, layer)
                after(index, layer)
            say(f"{what}: decoder layer {index + 1} of {self.count}{time_left(started, index + 1, self.count)}")

    def full_pass(self, window: torch.Tensor, eager: bool = False) -> torch.Tensor:
        """The float32 model's logits [n, vocab] on ``window``: every layer read from the checkpoint once."""
        state = self.start([window], eager)
        self.walk([state])
        return self.logits(state, 0)
