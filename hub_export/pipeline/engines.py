"""Engines: where a run's work happens.

An export is two kinds of work: *preparing* the source (download, load, the fp32
reference) once, and *building* each variant (quantize, export, lower, verify). An
engine does both and hands back the same records and byte-identical files:

- :class:`LocalEngine` (the default): this machine. The source is prepared in this
  process; variants are built here one after another, or several at once in spawned
  worker processes (:mod:`hub_export.pipeline.workers`) when the cores and memory allow.
- :class:`RayEngine`: a Ray cluster (``pip install 'hub-export[ray]'``). Preparing is
  one task and each variant another, each declaring 1 CPU and the memory the local
  engine would budget for it, so Ray places them. A task reads the source through its
  node's Hub cache (one download per node, not through the object store) and sends its
  ``.pte`` back to the driver, which writes the export folder and pushes it as before.
  A task whose worker dies is run again up to ``retries`` times; Ctrl-C cancels the
  tasks still running.

Example:
    >>> with engine(ray_address="auto") as cluster:
    ...     export("HuggingFaceTB/SmolLM2-135M", "out", qmodes=["8da4w", "8da8w"], engine=cluster)
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hub_export.errors import ExportError, HubExportError, InputError, first_line, opt
from hub_export.options import ExportOptions
from hub_export.pipeline.manifest import sha256_file
from hub_export.pipeline.memory_budget import variant_peak
from hub_export.pipeline.prepare import Prepared, SourceRequest, prepare, source_on_this_node
from hub_export.pipeline.workers import (
    VariantJob,
    build_job,
    export_in_workers,
    usable_cpus,
    worker_count,
)
from hub_export.quiet import quiet_libraries, quiet_torch

if TYPE_CHECKING:
    from hub_export.pipeline.manifest import Variant

log = logging.getLogger(__name__)

Say = Callable[..., None]
DEFAULT_RETRIES = 2  # a variant whose worker dies is built at most 3 times
RAY_INSTALL_HINT = "pip install 'hub-export[ray]'"


class Engine(Protocol):
    """Prepares a source and builds its variants somewhere; see the module's text."""

    name: str
    retries: int

    def prepare(self, request: SourceRequest, say: Say) -> Prepared: ...

    def build(self, prepared: Prepared, request: SourceRequest, workdir: Path, say: Say) -> list[Variant]: ...

    def close(self) -> None: ...


def variant_memory(weight_bytes: int, qmodes: tuple[str, ...] | list[str] = ("fp32",), streamed: bool = False) -> int:
    """Bytes the largest of ``qmodes``' variant builds needs at its peak (:mod:`hub_export.pipeline.memory_budget`):
    ``streamed`` when the model is read one layer at a time."""
    return max(variant_peak(weight_bytes, mode, streamed) for mode in qmodes)


def _libraries_quiet() -> bool:
    """Whether the caller silenced the frameworks' warnings (the CLI does); workers follow suit."""
    return logging.getLogger("torch").getEffectiveLevel() >= logging.ERROR


def _jobs(
    prepared: Prepared, options: ExportOptions, workdir: Path, threads: int, lower_only: bool = False
) -> list[VariantJob]:
    return [
        VariantJob(
            index,
            qmode,
            prepared.src,
            options,
            prepared.max_seq_len,
            workdir,
            prepared.reference,
            threads=threads,
            quiet=_libraries_quiet(),
            mixed_plan=prepared.mixed_plan,
            int4_rounding=prepared.int4_rounding,
            lower_only=lower_only,
        )
        for index, qmode in enumerate(options.qmodes)
    ]


class LocalEngine:
    """This machine: variants in this process, or in worker processes when several fit at once."""

    name = "local"

    def __init__(self, retries: int = DEFAULT_RETRIES):
        self.retries = _checked_retries(retries)

    def prepare(self, request: SourceRequest, say: Say) -> Prepared:
        return prepare(request, say)

    def build(self, prepared: Prepared, request: SourceRequest, workdir: Path, say: Say) -> list[Variant]:
        # torch and the build stages load with the first build, not with `import hub_export`
        from hub_export.patches import release_memory
        from hub_export.pipeline.build import RunState, build_variant

        options = request.options
        memory = variant_memory(prepared.weight_bytes, options.qmodes, prepared.streamed)
        workers = worker_count(options.jobs, len(options.qmodes), memory)
        if prepared.streamed:
            return self._build_streamed(prepared, options, workdir, workers, say)
        if workers > 1:
            prepared.model = None
            release_memory()
            say(f"building {len(options.qmodes)} variants, {workers} at a time in worker processes")
            jobs = _jobs(prepared, options, workdir, threads=max(1, usable_cpus() // workers))
            return export_in_workers(jobs, workers, say, retries=self.retries)
        run = RunState(
            prepared.model,
            prepared.src,
            options,
            prepared.max_seq_len,
            workdir,
            prepared.reference,
            say,
            prepared.mixed_plan,
            prepared.int4_rounding,
        )
        prepared.model = None  # the run owns it now, and drops it once the last variant no longer needs it
        for index, qmode in enumerate(options.qmodes):
            run.variants.append(build_variant(run, qmode, last=index == len(options.qmodes) - 1))
        return run.variants

    def _build_streamed(
        self, prepared: Prepared, options: ExportOptions, workdir: Path, workers: int, say: Say
    ) -> list[Variant]:
        """Variants read layer by layer from the checkpoint: each file is quantized and lowered in a worker
        process, which returns all it used when it exits, and verified here afterwards, so lowering's peak and
        verification's never add up (nor add to what preparing left in this process's allocator)."""
        # torch and the build stages load with the first build, not with `import hub_export`
        from hub_export.patches import release_memory
        from hub_export.pipeline.build import RunState, finish_text_variant
        from hub_export.runtime.pte import MemoryProbe

        rounding = prepared.int4_rounding
        spill = workdir.parent / f".{workdir.name}.gptq-codes.safetensors"  # beside the staging folder, not in it
        try:
            if rounding is not None and rounding.packed:
                rounding.spill(spill)
            release_memory()
            say(f"building {len(options.qmodes)} variant(s), {workers} at a time in worker processes")
            jobs = _jobs(prepared, options, workdir, threads=max(1, usable_cpus() // workers), lower_only=True)
            lowered = export_in_workers(jobs, workers, say, retries=self.retries)
        finally:
            spill.unlink(missing_ok=True)
        run = RunState(None, prepared.src, options, prepared.max_seq_len, workdir, prepared.reference, say,
                       prepared.mixed_plan, rounding)  # fmt: skip
        for item in lowered:
            with MemoryProbe() if prepared.reference is not None else nullcontext() as probe:
                run.variants.append(finish_text_variant(run, item, probe))
        return run.variants

    def describe(self) -> str:
        return f"this machine ({usable_cpus()} cores)"

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _checked_retries(retries: int) -> int:
    if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= 10:
        raise InputError(f"{opt('retries')} must be a whole number from 0 to 10 (got {retries!r})", param="retries")
    return retries


# --- Ray ---------------------------------------------------------------------------------


def _import_ray():
    try:
        import ray
    except ImportError:
        raise InputError(f"running on a Ray cluster needs the ray package: {RAY_INSTALL_HINT}") from None
    return ray


# Variables a task needs to reach the same Hub the same way as the driver; never tokens.
_FORWARDED_ENV = ("HF_ENDPOINT", "HF_HUB_DISABLE_XET", "HF_HUB_OFFLINE", "HUB_EXPORT_CACHE")


def _task_setup(quiet: bool) -> None:
    if quiet:
        quiet_libraries()
        quiet_torch()


def _here() -> str:
    """Where a task runs, for the log: the Ray node, the host and the worker process."""
    import ray

    return f"node {ray.get_runtime_context().get_node_id()[:8]} ({socket.gethostname()}, pid {os.getpid()})"


def _attempt() -> int | None:
    """Which run of this task this is (0 the first): Ray's own count, so a worker killed before
    the task's first message still shows as a retry. None where this Ray does not say."""
    from hub_export.patches import (
        ray_task_attempt,  # imports torch: only inside a Ray task, which builds with it anyway
    )

    return ray_task_attempt()


def _send(relay, message: tuple) -> None:
    """Post ``message`` to the driver without waiting: a task blocked in ``ray.get`` lends its CPU
    to another task, which would put two builds on a one-CPU node."""
    relay.actor.put_nowait.remote(message)


def _prepare_task(request: SourceRequest, relay, quiet: bool) -> Prepared:
    """On a node: prepare ``request``'s source; the result goes back without the model."""
    _task_setup(quiet)
    _send(relay, ("note", -1, f"preparing {request.source} on {_here()}"))
    prepared = prepare(request, lambda *event: _send(relay, ("say", -1, event)))
    prepared.model = None
    return prepared


def _build_task(job: VariantJob, request: SourceRequest, relay) -> tuple[Variant, dict[str, bytes]]:
    """On a node: build ``job``'s variant and return its record and its files' bytes."""
    _send(relay, ("start", job.index, (_here(), _attempt())))
    _task_setup(job.quiet)
    src = source_on_this_node(job.src, request)
    with tempfile.TemporaryDirectory(prefix="hub-export-task-") as scratch:
        variant = build_job(
            replace(job, src=src, workdir=Path(scratch)), say=lambda *event: _send(relay, ("say", job.index, event))
        )
        names = [name for name in (variant.file, variant.data_file) if name]
        return variant, {name: (Path(scratch) / name).read_bytes() for name in names}


class RayEngine:
    """A Ray cluster: ``address`` as ``ray.init`` takes it (``"auto"``, ``"ray://host:10001"``,
    ``host:6379``), or None to start a Ray instance on this machine for the run."""

    name = "ray"

    def __init__(self, address: str | None = None, retries: int = DEFAULT_RETRIES):
        self.retries = _checked_retries(retries)
        ray = _import_ray()
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            env = {name: os.environ[name] for name in _FORWARDED_ENV if name in os.environ}
            own_instance = {} if address or os.environ.get("RAY_ADDRESS") else {"include_dashboard": False}
            try:
                ray.init(
                    address=address or None,
                    log_to_driver=False,
                    configure_logging=False,
                    runtime_env={"env_vars": env} if env else None,
                    **own_instance,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = address or "a new local instance"
                raise InputError(
                    f"could not connect to the Ray cluster at {where}: {first_line(exc) or type(exc).__name__}",
                    hint="start one with `ray start --head`, or check --ray-address / RAY_ADDRESS; a "
                    "cluster with token authentication also needs RAY_AUTH_MODE=token and its token "
                    "(~/.ray/auth_token or RAY_AUTH_TOKEN)",
                    param="ray_address",
                ) from None
        self.address = address
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop every task this engine is waiting for (another thread's Ctrl-C)."""
        self._cancelled.set()

    def close(self) -> None:
        if self._owns_ray:
            _import_ray().shutdown()
            self._owns_ray = False

    def __enter__(self) -> RayEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def describe(self) -> str:
        ray = _import_ray()
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        cpus = sum(node["Resources"].get("CPU", 0) for node in nodes)
        return f"Ray cluster of {len(nodes)} node(s), {cpus:.0f} CPU(s)"

    # -- the work -------------------------------------------------------------------------

    def prepare(self, request: SourceRequest, say: Say) -> Prepared:
        ray = _import_ray()
        with self._relay() as relay:
            task = ray.remote(_prepare_task).options(
                num_cpus=1,
                max_retries=self.retries,
                retry_exceptions=False,
                name=f"hub-export prepare {request.source}",
            )
            ref = task.remote(request, relay, _libraries_quiet())
            return self._gather({ref: None}, relay, say)[ref]

    def build(self, prepared: Prepared, request: SourceRequest, workdir: Path, say: Say) -> list[Variant]:
        ray = _import_ray()
        options = request.options
        memory = variant_memory(prepared.weight_bytes, options.qmodes, prepared.streamed)
        self._check_fits(memory)
        say(
            f"building {len(options.qmodes)} variant(s) on the {self.describe()}, each task 1 CPU and "
            f"{memory / 2**30:.1f} GiB"
        )
        jobs = _jobs(prepared, options, workdir, threads=1)
        with self._relay() as relay:
            task = ray.remote(_build_task)
            refs = {
                task.options(
                    num_cpus=1,
                    memory=memory,
                    max_retries=self.retries,
                    retry_exceptions=False,
                    name=f"hub-export {job.qmode} {request.source}",
                ).remote(job, request, relay): job
                for job in jobs
            }
            results = self._gather(refs, relay, say)
        variants = []
        for ref in refs:
            variant, files = results[ref]
            for name, content in files.items():
                (workdir / name).write_bytes(content)
            if sha256_file(workdir / variant.file) != variant.sha256:
                raise ExportError(f"{variant.file} changed on its way back from the cluster; rerun the export")
            variants.append(variant)
        return variants

    def _check_fits(self, memory: int) -> None:
        ray = _import_ray()
        largest = max((node["Resources"].get("memory", 0) for node in ray.nodes() if node.get("Alive")), default=0)
        if memory > largest:
            raise ExportError(
                f"each variant build needs {memory / 2**30:.1f} GiB and the largest Ray node offers "
                f"{largest / 2**30:.1f} GiB; add a node with more memory"
            )

    @contextmanager
    def _relay(self) -> Iterator[Any]:
        """A queue the tasks report their progress on (an actor that takes no CPU)."""
        from ray.util.queue import Queue

        relay = Queue(actor_options={"num_cpus": 0})
        try:
            yield relay
        finally:
            relay.shutdown(force=True)

    def _gather(self, refs: dict, relay, say: Say) -> dict:
        """Wait for ``refs``, relaying progress; the first failure cancels the rest and is raised."""
        ray = _import_ray()
        pending = list(refs)
        results: dict = {}
        starts: dict[int, int] = {}
        try:
            while pending:
                if self._cancelled.is_set():
                    raise KeyboardInterrupt
                ready, pending = ray.wait(pending, num_returns=1, timeout=0.5)
                self._relay_messages(relay, say, refs, starts)
                for ref in ready:
                    results[ref] = self._result(ref, refs[ref])
            self._relay_messages(relay, say, refs, starts)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        return results

    def _relay_messages(self, relay, say: Say, refs: dict, starts: dict[int, int]) -> None:
        from ray.util.queue import Empty

        qmodes = {job.index: job.qmode for job in refs.values() if job is not None}
        while True:
            try:
                kind, index, payload = relay.get_nowait()
            except Empty:
                return
            if kind == "say":
                say(*payload)
            elif kind == "note":
                say(payload)
            elif kind == "start":
                where, attempt = payload
                starts[index] = starts.get(index, 0) + 1
                retry = starts[index] - 1 if attempt is None else attempt
                qmode = qmodes.get(index, "?")
                if retry == 0:
                    say(f"[{qmode}] building on {where}")
                else:
                    say(
                        f"[{qmode}] the previous worker died; building again on {where} "
                        f"(retry {retry} of {self.retries})",
                        "retry",
                        qmode,
                    )

    def _result(self, ref, job: VariantJob | None) -> Any:
        ray = _import_ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, HubExportError):
                raise cause from None
            raise RuntimeError(f"a Ray task failed:\n{exc}") from None
        except ray.exceptions.TaskCancelledError:
            raise
        except ray.exceptions.RayError as exc:
            what = f"the worker building {job.qmode}" if job is not None else "the worker preparing the source"
            raise ExportError(
                f"{what} died {self.retries + 1} time(s) on the Ray cluster ({type(exc).__name__}: {first_line(exc) or type(exc).__name__})",
                hint=f"give the nodes more memory, or raise {opt('retries')}",
            ) from None


def engine(
    ray: bool = False, ray_address: str | None = None, retries: int = DEFAULT_RETRIES
) -> LocalEngine | RayEngine:
    """The engine a command asked for: Ray when ``ray`` or an address is given, else this machine."""
    if ray or ray_address:
        return RayEngine(ray_address, retries)
    return LocalEngine(retries)


__all__ = ["Engine", "LocalEngine", "RayEngine", "engine", "variant_memory", "DEFAULT_RETRIES"]
