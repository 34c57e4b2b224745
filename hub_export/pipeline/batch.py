"""Batch: a catalogue of exports from one plan file, each repo pushed in one commit.

A plan is YAML: ``defaults`` (export options by their field names) and ``jobs``, each a
``source``, a target ``repo`` and any options of its own::

    defaults: {qmodes: [8da4w], max_seq_len: 256, qembedding: 8w}
    jobs:
      - {source: HuggingFaceTB/SmolLM2-135M, repo: me/SmolLM2-135M-ExecuTorch, qmodes: [8da4w, 8da8w]}
      - {source: Qwen/Qwen3-0.6B, repo: me/Qwen3-0.6B-ExecuTorch}

Each job is a :func:`hub_export.hub.push.push`: its variants are built (on this machine,
or on a Ray cluster where jobs run side by side), verified, and pushed in one commit
once all of them pass. A failed variant fails its own repo's push only. Rerunning a
plan builds only the variants its repos do not already hold, built the same way.

Example:
    >>> plan = read_plan("catalogue.yaml")
    >>> states = run_batch(plan, engine=LocalEngine())
    >>> [(s.job.repo_id, s.state) for s in states]
    [('me/SmolLM2-135M-ExecuTorch', 'pushed'), ('me/Qwen3-0.6B-ExecuTorch', 'pushed')]
"""

from __future__ import annotations

import threading
import time
import typing
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hub_export.bug_log import as_bug, shown_path
from hub_export.errors import HubExportError, InputError
from hub_export.hub.api import check_repo_id, resolve_endpoint, resolve_token
from hub_export.hub.push import push
from hub_export.options import ExportOptions, option_fields
from hub_export.pipeline.engines import LocalEngine
from hub_export.redact import Redactor

if TYPE_CHECKING:
    from hub_export.hub.push import PushResult
    from hub_export.pipeline.engines import Engine

MAX_PLAN_BYTES = 1 << 20
MAX_JOBS = 500
JOB_KEYS = ("source", "repo", "private")
STATES = (
    "queued",
    "checking",
    "preparing",
    "building",
    "verifying",
    "pushing",
    "pushed",
    "up to date",
    "failed",
    "cancelled",
)
_STAGE_STATES = {
    "check": "checking",
    "resolve": "preparing",
    "load": "preparing",
    "reference": "preparing",
    "calibrate": "preparing",
    "quantize": "building",
    "export": "building",
    "lower": "building",
    "verify": "verifying",
    "upload": "pushing",
}


@dataclass(frozen=True)
class PlanJob:
    """One source to export into one repo, with its options (the plan's defaults under its own)."""

    source: str
    repo_id: str
    options: ExportOptions
    private: bool = False


def _plan_options() -> dict[str, Any]:
    """The option fields a plan may set, with their types."""
    hints = typing.get_type_hints(ExportOptions)
    return {spec.name: hints[spec.name] for spec in option_fields("push")}


def _typed(value: Any, hint: Any, where: str, key: str) -> Any:
    """``value`` from YAML checked against the option's type (a lone string is a one-item list)."""
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if value is None and type(None) in typing.get_args(hint):
        return None
    if typing.get_origin(hint) is tuple:
        items = [value] if isinstance(value, str) else value
        if isinstance(items, list) and items and all(isinstance(item, str) for item in items):
            return tuple(items)
        raise InputError(f"{where}: {key} must be a list of names, e.g. [8da4w, 8da8w] (got {value!r})")
    wanted = args[0] if args else hint
    ok = isinstance(value, wanted) and not (wanted in (int, float) and isinstance(value, bool))
    if wanted is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise InputError(f"{where}: {key} must be {_type_name(wanted)} (got {value!r})")
    return value


def _type_name(kind: type) -> str:
    return {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}.get(kind, kind.__name__)


def _options(values: dict, where: str, allowed: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise InputError(
            f"{where}: unknown key {unknown[0]!r}; the options are {', '.join(allowed)}",
            hint="keys are the export options' names, e.g. qmodes, max_seq_len, qembedding",
        )
    return {key: _typed(value, allowed[key], where, key) for key, value in values.items()}


def parse_plan(text: str, name: str = "plan") -> list[PlanJob]:
    """The jobs of a plan's YAML ``text`` (``name`` is how errors refer to it)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{name} is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list) or not data["jobs"]:
        raise InputError(f"{name} needs a list of jobs: `jobs: [{{source: ORG/MODEL, repo: YOU/MODEL-ExecuTorch}}]`")
    extra = sorted(set(data) - {"defaults", "jobs"})
    if extra:
        raise InputError(f"{name}: unknown top-level key {extra[0]!r}; a plan has `defaults` and `jobs`")
    if len(data["jobs"]) > MAX_JOBS:
        raise InputError(f"{name} has {len(data['jobs'])} jobs; split it into plans of at most {MAX_JOBS}")
    allowed = _plan_options()
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise InputError(f"{name}: defaults must be a mapping of options, e.g. {{qmodes: [8da4w], max_seq_len: 256}}")
    shared = _options(defaults, f"{name} defaults", allowed)
    jobs: list[PlanJob] = []
    seen: dict[str, int] = {}
    for number, entry in enumerate(data["jobs"], 1):
        where = f"{name} job {number}"
        if not isinstance(entry, dict):
            raise InputError(f"{where} must be a mapping like {{source: ORG/MODEL, repo: YOU/MODEL-ExecuTorch}}")
        for key in ("source", "repo"):
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                raise InputError(f"{where} needs a {key}")
        private = entry.get("private", False)
        if not isinstance(private, bool):
            raise InputError(f"{where}: private must be true or false (got {private!r})")
        own = _options({k: v for k, v in entry.items() if k not in JOB_KEYS}, where, allowed)
        try:
            repo_id = check_repo_id(entry["repo"].strip())
            options = ExportOptions(**{**shared, **own})
        except InputError as error:
            raise InputError(f"{where}: {error.reason}", hint=error.hint) from None
        if repo_id in seen:
            raise InputError(
                f"{where} pushes to {repo_id} like job {seen[repo_id]}; one job per repo "
                "(list every variant in one job's qmodes)"
            )
        seen[repo_id] = number
        jobs.append(PlanJob(entry["source"].strip(), repo_id, options, private))
    return jobs


def read_plan(path: str | Path) -> list[PlanJob]:
    """The jobs of the plan file at ``path``."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path} is not a file; give the plan's YAML file")
    if path.stat().st_size > MAX_PLAN_BYTES:
        raise InputError(f"{path} is over {MAX_PLAN_BYTES // 1024} KiB; a plan is a short list of jobs")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text") from None
    return parse_plan(text, path.name)


# --- estimates -----------------------------------------------------------------------------


def fp32_weight_bytes(job: PlanJob, token: str | None = None, endpoint: str | None = None) -> int | None:
    """The fp32 size of ``job``'s weights from the checkpoint's headers, without downloading it (None: unknown)."""
    source = Path(job.source).expanduser()
    try:
        if job.options.gguf_file or job.source.endswith(".gguf"):
            gguf = source if source.is_file() else source / (job.options.gguf_file or "")
            return _gguf_parameters(gguf) * 4 if gguf.is_file() else None
        if source.is_dir():
            return _local_safetensors_parameters(source) * 4 or None
        from huggingface_hub import get_safetensors_metadata

        metadata = get_safetensors_metadata(
            job.source, revision=job.options.revision, token=token or False, endpoint=resolve_endpoint(endpoint)
        )
        return sum(metadata.parameter_count.values()) * 4
    except Exception:
        return None


def _local_safetensors_parameters(folder: Path) -> int:
    from safetensors import safe_open

    total = 0
    for path in folder.glob("*.safetensors"):
        with safe_open(path, "np") as tensors:
            for key in tensors.keys():
                count = 1
                for dim in tensors.get_slice(key).get_shape():
                    count *= dim
                total += count
    return total


def _gguf_parameters(path: Path) -> int:
    from gguf import GGUFReader

    return sum(int(tensor.n_elements) for tensor in GGUFReader(path).tensors)


# --- running -------------------------------------------------------------------------------


@dataclass
class JobState:
    """Where one job of a batch stands."""

    job: PlanJob
    state: str = "queued"
    detail: str = ""
    started: float | None = None
    ended: float | None = None
    result: PushResult | None = None
    error: str | None = None
    retries: int = 0
    log_file: str | None = None  # the traceback of a bug in hub-export that failed this job

    @property
    def seconds(self) -> float:
        if self.started is None:
            return 0.0
        return (self.ended or time.monotonic()) - self.started

    @property
    def done(self) -> bool:
        return self.state in ("pushed", "up to date", "failed", "cancelled")


@dataclass
class _Batch:
    states: list[JobState]
    on_change: Callable[[list[JobState]], None]
    on_event: Callable[[JobState, str], None]
    redactor: Redactor
    cancelled: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def update(self, job_state: JobState, **changes: Any) -> None:
        with self.lock:
            for key, value in changes.items():
                setattr(job_state, key, value)
            self.on_change(self.states)


def _run_job(batch: _Batch, state: JobState, engine: Engine, token: str | None, endpoint: str | None) -> None:

    if batch.cancelled.is_set():
        batch.update(state, state="cancelled")
        return
    batch.update(state, state="checking", started=time.monotonic())

    def progress(event) -> None:
        if batch.cancelled.is_set():
            raise KeyboardInterrupt
        stage = _STAGE_STATES.get(getattr(event, "stage", ""), state.state)
        retried = getattr(event, "stage", "") == "retry"
        line = batch.redactor(str(event))
        batch.update(state, state=stage, detail=line[:160], retries=state.retries + int(retried))
        batch.on_event(state, line)

    job = state.job
    try:
        result = push(
            job.source,
            job.repo_id,
            job.options,
            private=job.private,
            token=token,
            endpoint=endpoint,
            progress=progress,
            engine=engine,
        )
    except KeyboardInterrupt:
        batch.update(state, state="cancelled", ended=time.monotonic(), detail="cancelled")
        raise
    except HubExportError as error:
        batch.update(
            state,
            state="failed",
            ended=time.monotonic(),
            error=batch.redactor(str(error)),
            log_file=getattr(error, "log_file", None),
        )
        return
    except Exception as error:
        bug = as_bug(error, f"pushing {job.repo_id}", batch.redactor)
        batch.update(state, state="failed", ended=time.monotonic(), error=str(bug), log_file=bug.log_file)
        return
    batch.update(
        state,
        state="pushed" if result.pushed else "up to date",
        ended=time.monotonic(),
        result=result,
        detail=batch.redactor(result.summary),
    )


def run_batch(
    jobs: list[PlanJob],
    *,
    engine: Engine | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    on_change: Callable[[list[JobState]], None] | None = None,
    on_event: Callable[[JobState, str], None] | None = None,
    parallel: int | None = None,
) -> list[JobState]:
    """Export and push every job of a plan; returns each job's final :class:`JobState`.

    On this machine jobs run one after another (each builds its variants in parallel
    as ``push`` does); on a Ray cluster up to ``parallel`` jobs (default: all) run at
    once and the cluster schedules their tasks. ``on_change`` receives the states
    whenever one changes, ``on_event`` each job's progress messages (tokens redacted).
    Ctrl-C cancels what is still running; no job is half-pushed.
    """

    engine = engine or LocalEngine()
    token = resolve_token(token)
    states = [JobState(job) for job in jobs]
    batch = _Batch(states, on_change or (lambda _: None), on_event or (lambda *_: None), Redactor(token))
    if engine.name == "local":
        try:
            for state in states:
                _run_job(batch, state, engine, token, endpoint)
        except KeyboardInterrupt:
            _cancel_rest(batch)
            raise
        return states
    workers = max(1, min(parallel or len(jobs), len(jobs)))
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hub-export-batch")
    futures = [pool.submit(_run_job, batch, state, engine, token, endpoint) for state in states]
    try:
        while not all(future.done() for future in futures):
            time.sleep(0.2)
    except KeyboardInterrupt:
        batch.cancelled.set()
        cancel = getattr(engine, "cancel", None)
        if cancel is not None:
            cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        _cancel_rest(batch)
        raise
    pool.shutdown(wait=True)
    for future in futures:
        future.result()  # a bug in the runner itself is raised, not lost
    return states


def _cancel_rest(batch: _Batch) -> None:
    for state in batch.states:
        if not state.done:
            batch.update(state, state="cancelled", ended=time.monotonic() if state.started else None)


def summary(states: list[JobState]) -> str:
    """One line: how many repos were pushed, already up to date, failed."""
    counts = {
        name: sum(1 for s in states if s.state == name) for name in ("pushed", "up to date", "failed", "cancelled")
    }
    parts = [f"{count} {name}" for name, count in counts.items() if count]
    retried = sum(s.retries for s in states)
    if retried:
        parts.append(f"{retried} variant build(s) retried after a worker died")
    line = f"{len(states)} job(s): " + ", ".join(parts or ["nothing done"])
    logs = [shown_path(Path(s.log_file)) for s in states if s.log_file]
    return line + (f"; tracebacks of hub-export bugs: {', '.join(logs)}" if logs else "")


__all__ = ["PlanJob", "JobState", "parse_plan", "read_plan", "run_batch", "fp32_weight_bytes", "summary"]
