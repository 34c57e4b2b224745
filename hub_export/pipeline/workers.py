"""Workers: lower several variants at once, each in its own process.

Lowering is single-threaded Python (FX passes interpreted under FakeTensor): a
30-layer export keeps one core busy and leaves the others idle (its CPU time is
nearly its wall time). On a machine with N cores, N variants lower in about
the time of one, which is what makes a further variant cheaper than the first.

Each worker is a *spawned* process, not a forked one: forking a process that has
run torch's OpenMP pool or holds live threads (a progress spinner, a web server)
can deadlock the child. A worker maps the checkpoint the parent already downloaded,
builds its one variant with the same code as the in-process path, writes the
``.pte`` into the run's staging folder and exits, which returns every byte it used
to the operating system.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import multiprocessing
import os
import pickle
import queue
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hub_export.errors import ExportError, HubExportError, opt
from hub_export.options import ExportOptions
from hub_export.pipeline.quantize import QMODES
from hub_export.quiet import quiet_libraries, quiet_torch

if TYPE_CHECKING:
    from hub_export.pipeline.build import LoweredText
    from hub_export.pipeline.calibrate import MixedPlan
    from hub_export.pipeline.gptq import Int4Rounding
    from hub_export.pipeline.manifest import Variant
    from hub_export.pipeline.source import Source
    from hub_export.pipeline.verify import Reference

log = logging.getLogger(__name__)


@dataclass
class VariantJob:
    """Everything a worker needs to build one variant; sent to it pickled."""

    index: int
    qmode: str
    src: Source
    options: ExportOptions
    max_seq_len: int
    workdir: Path
    reference: Reference | None
    threads: int
    quiet: bool
    mixed_plan: MixedPlan | None = None
    int4_rounding: Int4Rounding | None = None
    lower_only: bool = False  # a text variant: quantize and lower, leave verifying to the parent


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (``MemAvailable``)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def worker_count(requested: int | None, variants: int, per_worker: int) -> int:
    """How many variants to lower at once.

    ``requested`` (``--jobs``) wins when given. Otherwise: one per usable core, no
    more than there are variants, and no more than the available memory holds at
    ``per_worker`` bytes each (:func:`hub_export.pipeline.memory_budget.variant_peak`).
    """
    if requested is not None:
        return max(1, min(requested, variants))
    count = min(variants, usable_cpus())
    memory = available_memory()
    if memory is not None:
        count = min(count, max(1, memory // per_worker))
    return max(1, count)


# --- in the worker -----------------------------------------------------------------


def portable(exc: BaseException) -> BaseException:
    """The exception to hand back to the parent: ours as they are, others with their traceback."""
    if isinstance(exc, HubExportError):
        return exc
    remote = "".join(traceback.format_exception(exc)).rstrip()
    return RuntimeError(f"a worker process failed:\n{remote}")


def build_job(job: VariantJob, say: Callable[..., None]) -> Variant | LoweredText:
    """Build ``job``'s variant in this process from its checkpoint (what every engine's worker runs); with
    ``job.lower_only``, only its file (:func:`hub_export.pipeline.build.lower_text_variant`)."""
    # torch and the build stages load here, in the worker: the parent that spawns workers never needs them.
    import torch

    from hub_export.patches import map_large_allocations
    from hub_export.pipeline.build import RunState, build_variant, load_model, lower_text_variant
    from hub_export.pipeline.streaming import can_stream  # with the build stages, in the worker

    torch.set_num_threads(job.threads)
    map_large_allocations()
    run = RunState(
        None,
        job.src,
        job.options,
        job.max_seq_len,
        job.workdir,
        job.reference,
        say=say,
        mixed_plan=job.mixed_plan,
        int4_rounding=job.int4_rounding,
    )
    if not can_stream(job.src, job.options, run.task):  # otherwise each layer is read as it is quantized
        run.model = load_model(job.src.path, job.options.trust_remote_code, run.task)
    if job.lower_only:
        return lower_text_variant(run, job.qmode, last=True)
    return build_variant(run, job.qmode, last=True)


def _work(job: VariantJob, messages) -> None:
    """Worker entry point: build ``job``'s variant and report it on ``messages``."""
    try:
        if job.quiet:
            quiet_libraries()
            quiet_torch()
        handler = logging.handlers.QueueHandler(messages)
        package_log = logging.getLogger("hub_export")
        package_log.handlers[:] = [handler]
        package_log.propagate = False
        package_log.setLevel(logging.INFO)
        variant = build_job(job, say=lambda *event: messages.put(("say", job.index, event)))
        # Pickled here by value: through the queue, torch would send a tensor (a lowered file's expected logits) as
        # shared memory that vanishes when this process exits before the parent has read it.
        messages.put(("done", job.index, pickle.dumps(variant)))
    except BaseException as exc:
        messages.put(("error", job.index, portable(exc)))


# --- in the parent -----------------------------------------------------------------


def export_in_workers(
    jobs: list[VariantJob], workers: int, say: Callable[..., None], retries: int = 0
) -> list[Variant | LoweredText]:
    """Build ``jobs`` in at most ``workers`` processes at once; variants come back in job order.

    A worker that dies without a word (killed, out of memory) is started again up to
    ``retries`` times. Any other failure stops every other worker and is raised here,
    so the caller's cleanup (removing the staging folder) runs once nothing writes
    into it any more.
    """
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    # Costliest first (longest-processing-time order): cheap variants fill in at the end.
    pending = sorted(jobs, key=lambda job: -QMODES[job.qmode].relative_cost)
    by_index = {job.index: job for job in jobs}
    running: dict[int, multiprocessing.process.BaseProcess] = {}
    results: dict[int, Variant] = {}
    silent: dict[int, float] = {}
    deaths: dict[int, int] = {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                job = pending.pop(0)
                process = context.Process(
                    target=_work, args=(job, messages), name=f"hub-export {job.qmode}", daemon=True
                )
                with _main_not_rerun():
                    process.start()
                running[job.index] = process
            for index, code in _dead(running, silent):
                job = by_index[index]
                deaths[index] = deaths.get(index, 0) + 1
                _retry_or_fail(job, code, deaths[index], retries, say)
                running.pop(index).join()
                silent.pop(index, None)
                pending.insert(0, job)
            try:
                message = messages.get(timeout=1.0)
            except queue.Empty:
                continue
            if isinstance(message, logging.LogRecord):  # from the worker's QueueHandler
                logging.getLogger(message.name).handle(message)
                continue
            kind, index, payload = message
            if kind == "say":
                say(*payload)
            elif kind == "done":
                results[index] = pickle.loads(payload)
                running.pop(index).join()
            elif kind == "error":
                raise payload
    finally:
        for process in running.values():
            process.terminate()
        for process in running.values():
            process.join()
        messages.close()
    return [results[job.index] for job in jobs]


@contextlib.contextmanager
def _main_not_rerun():
    """While a worker is started: a spawned process runs the parent's main script again before its target unless
    the script guards itself with ``if __name__ == "__main__"``, and a script calling ``hub_export.export`` at its
    top level would then export again inside the worker and fail. The worker needs nothing from that script (its
    job is made of hub-export's own types), so it is not told where the script is."""
    main = sys.modules.get("__main__")
    saved = {name: getattr(main, name) for name in ("__file__", "__spec__") if hasattr(main, name)}
    try:
        for name in saved:
            delattr(main, name) if name == "__file__" else setattr(main, name, None)
        yield
    finally:
        for name, value in saved.items():
            setattr(main, name, value)


def _retry_or_fail(job: VariantJob, code: int | None, deaths: int, retries: int, say: Callable[..., None]) -> None:
    """Say that ``job``'s worker is started again after its ``deaths``-th silent death, or raise past ``retries``."""
    if deaths > retries:
        raise ExportError(
            f"the worker exporting {job.qmode} exited with code {code} without a result "
            f"{_times(deaths)}(out of memory?); rerun with {opt('jobs')} 1 to export one variant at a time"
        )
    say(
        f"the worker exporting {job.qmode} exited with code {code} without a result; starting it again "
        f"(retry {deaths} of {retries})",
        "retry",
        job.qmode,
    )


def _times(count: int) -> str:
    return f"{count} times " if count > 1 else ""


def _dead(running: dict, silent: dict[int, float], grace: float = 2.0) -> list[tuple[int, int | None]]:
    """``(index, exit code)`` of the workers that died without a word (e.g. killed for memory).

    A worker that just exited may still have its last message in the pipe, so it is
    given ``grace`` seconds before being called dead.
    """
    now = time.monotonic()
    dead = []
    for index, process in running.items():
        if process.is_alive():
            continue
        if now - silent.setdefault(index, now) > grace:
            dead.append((index, process.exitcode))
    return dead
