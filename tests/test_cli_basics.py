"""The CLI's options come from ExportOptions, and the local Hub is an optional part: no model needed."""

from __future__ import annotations

import importlib
import sys

import pytest
from typer.testing import CliRunner

from hub_export.cli import app
from hub_export.errors import InputError
from hub_export.options import ExportOptions, cli_flags, option_fields


def _options_seen_by(monkeypatch, verb: str, arguments: list[str]) -> ExportOptions:
    """The ExportOptions the CLI hands the library for ``hub-export VERB ARGUMENTS``."""
    seen = {}

    def spy(source, where, options, **_):
        seen["options"] = options
        raise InputError("stop here")

    verb_module = importlib.import_module(f"hub_export.cli.{verb}")  # the verb calls the library through this name
    monkeypatch.setattr(verb_module, "run_export" if verb == "export" else verb, spy)
    result = CliRunner().invoke(app, [verb, *arguments])
    assert isinstance(result.exception, InputError) and str(result.exception) == "stop here", result.output
    return seen["options"]


def test_every_option_field_is_a_flag_of_the_commands_that_take_it() -> None:
    import typer.main

    commands = typer.main.get_command(app).commands
    for verb in ("export", "push"):
        flags = {flag for param in commands[verb].params for flag in (*param.opts, *param.secondary_opts)}
        for spec in option_fields(verb):
            assert cli_flags(spec)[0] in flags, (verb, spec.name)
        helps = {param.name: param.help for param in commands[verb].params}
        assert helps["qmodes"].count(":") >= 5  # the qmode registry describes every qmode in the help
    push_flags = {flag for param in commands["push"].params for flag in (*param.opts, *param.secondary_opts)}
    assert "--no-verify" not in push_flags  # only what was verified is published


def test_the_reproduce_command_parses_back_to_the_same_options(monkeypatch) -> None:
    options = ExportOptions(
        qmodes=("8da4w", "mixed"),
        qembedding="8w",
        group_size=64,
        max_seq_len=128,
        quality_tokens=256,
        int4_scales="minmax",
        max_size_ratio=1.2,
        max_ppl_ratio=1.3,
        gguf_file="model.Q4_0.gguf",
        base_model="acme/Base",
        license="mit",
        model_name="Tiny Chat",
        revision="v1",
        trust_remote_code=True,
        allow_pickle=True,
    )
    command = options.command("acme/model")
    assert command.startswith("hub-export export acme/model --base-model acme/Base --license mit")
    arguments = command.split(" ", 2)[2]
    import shlex

    parsed = _options_seen_by(monkeypatch, "export", [*shlex.split(arguments), "-o", "out"])
    assert parsed == options
    assert _options_seen_by(monkeypatch, "push", shlex.split(arguments)) == options
    plain = ExportOptions(qmodes=("mixed",), calibration=False)
    assert plain.command("m") == "hub-export export m --qmode mixed --no-calibration"
    assert _options_seen_by(monkeypatch, "export", ["m", "-o", "out", "--qmode", "mixed", "--no-calibration"]) == plain
    # Options that do not change the files stay out of the command, not out of the object.
    fast = options.replace(jobs=2, verify=False)
    assert fast.command("acme/model") == command


def test_bad_options_are_refused_with_the_flag_to_change(monkeypatch) -> None:
    result = CliRunner().invoke(app, ["export", "acme/model", "-o", "out", "--max-seq-len", "1"])
    assert isinstance(result.exception, InputError)
    assert str(result.exception) == "--max-seq-len must be at least 2 (got 1)"
    assert result.exception.param == "max_seq_len"
    with pytest.raises(TypeError, match="unknown export option.*qmode\\b"):
        from hub_export import export

        export("acme/model", "out", qmode="8da4w")  # a typo in the Python API is a TypeError, as for any function


def test_the_local_hub_is_an_extra_with_a_clear_message(monkeypatch) -> None:
    """Without fastapi installed, `hub-export hub ...` says how to get it, and nothing else breaks."""
    from hub_export import cli

    for name in [m for m in sys.modules if m.startswith("hub_export.hub.localhub") or m.split(".")[0] == "fastapi"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "fastapi", None)  # what an absent package looks like to import
    import typer

    without_hub = typer.Typer()
    without_hub.command("version")(lambda: None)  # a second command, so that `hub` stays a subcommand
    cli.mount_hub(without_hub)
    result = CliRunner().invoke(without_hub, ["hub", "serve", "--port", "0"])
    assert isinstance(result.exception, InputError)
    assert "pip install 'hub-export[hub]'" in str(result.exception)
    assert result.exception.exit_code == 2


def test_a_bug_in_hub_export_says_so_and_keeps_its_traceback(monkeypatch, tmp_path, capsys) -> None:
    from helpers import run_cli

    import hub_export.cli.archs

    def broken_table():
        return {}["a key hub-export forgot, next to the token hf_secretsecretsecretsecret"]

    monkeypatch.setattr(hub_export.cli.archs, "markdown_table", broken_table)
    monkeypatch.setenv("HUB_EXPORT_LOG_DIR", str(tmp_path))
    monkeypatch.setenv("HF_TOKEN", "hf_secretsecretsecretsecret")
    code, out, err = run_cli(["archs", "--markdown"], capsys)
    assert code == 70, err
    (line,) = [line for line in err.splitlines() if line.strip()]
    assert line.startswith("Internal error: hub-export failed while running hub-export archs (KeyError")
    assert "bug in hub-export" in line
    (log,) = tmp_path.iterdir()
    assert log.name in line
    text = log.read_text()
    assert "broken_table" in text and "secret" not in text + err
