"""``hub-export batch``: a catalogue of exports from one plan file."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from hub_export.cli import common
from hub_export.hub.card import human_size
from hub_export.pipeline.batch import fp32_weight_bytes, read_plan, run_batch, summary
from hub_export.pipeline.engines import engine as make_engine
from hub_export.pipeline.engines import variant_memory
from hub_export.pipeline.streaming import streams
from hub_export.quiet import quiet_torch
from hub_export.tasks.registry import TEXT_GENERATION


def _jobs_table(states) -> Table:
    table = Table(title="batch")
    for column in ("repo", "variants", "state", "time", "detail"):
        table.add_column(
            column,
            justify="right" if column == "time" else "left",
            no_wrap=True,
            overflow="ellipsis",
            ratio=3 if column == "detail" else None,
        )
    colours = {"pushed": "green", "up to date": "green", "failed": "red", "cancelled": "yellow"}
    for state in states:
        colour = colours.get(state.state, "cyan")
        detail = state.error or state.detail
        if state.result is not None and state.result.commit_oid:
            detail = f"commit {state.result.commit_oid[:10]}"
        table.add_row(
            escape(state.job.repo_id),
            ", ".join(state.job.options.qmodes),
            f"[{colour}]{state.state}[/{colour}]",
            f"{state.seconds:.0f} s" if state.started else "",
            escape(detail),
        )
    return table


def _plan_table(jobs, engine_name: str, token: str | None, endpoint: str | None) -> Table:
    table = Table(title=f"plan: {len(jobs)} job(s), on {engine_name}")
    for column in ("repo", "source", "variants", "fp32 weights", "memory per variant"):
        table.add_column(
            column, justify="right" if "memory" in column or "weights" in column else "left", overflow="fold"
        )
    for job in jobs:
        weights = fp32_weight_bytes(job, token, endpoint)
        table.add_row(
            escape(job.repo_id),
            escape(job.source),
            escape(", ".join(job.options.qmodes)),
            human_size(weights) if weights else "unknown",
            human_size(variant_memory(weights, job.options.qmodes, streams(job.options, TEXT_GENERATION)))
            if weights
            else "unknown",
        )
    return table


@common.app.command(
    "batch",
    epilog=(
        "Example plan (keys are the export options' names):\n\n"
        "  defaults: {qmodes: [8da4w], max_seq_len: 256, qembedding: 8w}\n\n"
        "  jobs:\n\n"
        "    - {source: HuggingFaceTB/SmolLM2-135M, repo: me/SmolLM2-135M-ExecuTorch, qmodes: [8da4w, 8da8w]}\n\n"
        "Examples:\n\n"
        "  hub-export batch catalogue.yaml --dry-run\n\n"
        "  hub-export batch catalogue.yaml --ray-address 10.0.0.5:6379"
    ),
)
def batch_command(
    plan: Path = typer.Argument(..., help="YAML plan: defaults and a list of jobs (source, repo, options)."),
    dry_run: bool = typer.Option(False, help="Print the plan with each job's estimated memory; build nothing."),
    ray: common.RayOption = False,
    ray_address: common.RayAddressOption = None,
    retries: common.RetriesOption = 2,
    endpoint: common.EndpointOption = None,
    token: common.TokenOption = None,
):
    """Export and push a catalogue: every job of PLAN, each repo in one commit, with a live table."""
    from rich.live import Live

    jobs = read_plan(plan)
    if dry_run:
        common.out.print(_plan_table(jobs, "Ray" if ray or ray_address else "this machine", token, endpoint))
        return
    quiet_torch()
    with make_engine(ray, ray_address, retries) as engine:
        where = engine.describe() if hasattr(engine, "describe") else "this machine"
        common.err.print(f"[dim]{len(jobs)} job(s) on {escape(where)}[/dim]")
        started = time.perf_counter()
        with Live(_jobs_table([]), console=common.err, refresh_per_second=2, transient=False) as live:

            def log_line(state, line: str) -> None:  # printed above the live table
                live.console.print(
                    f"[dim]{time.perf_counter() - started:7.1f}s[/dim]  {escape(state.job.repo_id)}: {escape(line)}",
                    soft_wrap=True,
                )

            states = run_batch(
                jobs,
                engine=engine,
                token=token,
                endpoint=endpoint,
                on_event=log_line,
                on_change=lambda current: live.update(_jobs_table(current)),
            )
            live.update(_jobs_table(states))
    for state in states:
        if state.error:
            common.err.print(f"[bold red]{escape(state.job.repo_id)}:[/bold red] {escape(state.error)}", soft_wrap=True)
    common.out.print(summary(states))
    if any(state.state == "failed" for state in states):
        raise typer.Exit(1)
