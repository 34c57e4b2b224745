"""Hostile repos, hostile files and unlucky users: each test replays an attack or fault.

A repo's ``manifest.json`` is written by whoever owns the repo; a ``.pte`` may come from
anywhere. Nothing in them may touch files outside the folder they are pulled to, crash
the process, or end in an "Internal error" instead of one line of advice.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import error_line, run_cli
from huggingface_hub import CommitOperationAdd

from hub_export.errors import InputError, VerificationError
from hub_export.hub.localhub.pytest_plugin import LocalHubFixture
from hub_export.hub.pull import pull
from hub_export.pipeline.manifest import MANIFEST_NAME, Manifest

PTE_BYTES = b"\x3c\x00\x00\x00ET12eh00" + bytes(100)  # a stand-in: pull checks hashes, not content
PTE_SHA256 = hashlib.sha256(PTE_BYTES).hexdigest()


def _manifest(**variant_changes) -> dict:
    """A valid manifest (as JSON data) of one variant ``model-8da4w.pte`` holding PTE_BYTES."""
    variant = {
        "file": "model-8da4w.pte",
        "qmode": "8da4w",
        "qembedding": None,
        "group_size": 32,
        "max_seq_len": 64,
        "size_bytes": len(PTE_BYTES),
        "sha256": PTE_SHA256,
        "metadata": {"get_max_seq_len": 64, "get_eos_ids": [0]},
        "verification": {"passed": True, "max_abs_diff": 0.004, "tolerance": 0.06, "top1_agreement": 1.0,
                         "quality": {"perplexity": {"eager": 1.0}}},
        "export_seconds": 24.3,
        "per_channel_fallback": [],
        "data_file": None,
        "data_size_bytes": None,
        "data_sha256": None,
    }  # fmt: skip
    variant.update(variant_changes)
    return {
        "schema_version": 1,
        "source": {"id": "acme/Tiny", "revision": None, "local": False},
        "versions": {"executorch": "1.5.1"},
        "variants": [variant],
        "command": "hub-export export acme/Tiny",
        "machine": "Test CPU",
    }


def _publish(hub: LocalHubFixture, repo_id: str, manifest: dict | bytes | str, **files: bytes) -> None:
    """Commit ``manifest`` (and ``files``) to a new repo of alice's, as any user can."""
    api = hub.api(hub.alice_token)
    api.create_repo(repo_id, exist_ok=True)
    text = manifest if isinstance(manifest, (bytes, str)) else json.dumps(manifest)
    content = text.encode() if isinstance(text, str) else text
    operations = [CommitOperationAdd(MANIFEST_NAME, content)]
    operations += [CommitOperationAdd(name, data) for name, data in files.items()]
    api.create_commit(repo_id, operations, commit_message="hostile")


# -- 1. the manifest schema ---------------------------------------------------------------

BAD_VARIANTS = {
    "delegation not an object": {"delegation": ["forward"]},
    "delegation with a negative count": {"delegation": {"forward": {"partitions": -1, "outside": {}}}},
    "delegation with text counts": {"delegation": {"forward": {"partitions": 1, "outside": {"aten::add": "many"}}}},
    "delegation of too many methods": {"delegation": {f"m{i}": {"partitions": 1} for i in range(17)}},
    "absolute file": {"file": "/etc/victim.pte"},
    "parent file": {"file": "../../victim.pte"},
    "folder file": {"file": "sub/model.pte"},
    "backslash file": {"file": "..\\victim.pte"},
    "hidden file": {"file": ".model.pte"},
    "not a pte": {"file": "model.bin"},
    "odd charset": {"file": "mo del$.pte"},
    "long name": {"file": "m" * 300 + ".pte"},
    "file not a string": {"file": 7},
    "parent data file": {"data_file": "../x.ptd", "data_size_bytes": 1, "data_sha256": "0" * 64},
    "data file without hash": {"data_file": "model.ptd"},
    "unknown qmode": {"qmode": "rm -rf"},
    "unknown qembedding": {"qembedding": "2w"},
    "negative size": {"size_bytes": -1},
    "huge size": {"size_bytes": 10**23},
    "size as text": {"size_bytes": "abc"},
    "uppercase sha256": {"sha256": PTE_SHA256.upper()},
    "short sha256": {"sha256": "abc"},
    "zero max_seq_len": {"max_seq_len": 0},
    "bool max_seq_len": {"max_seq_len": True},
    "verification a list": {"verification": []},
    "unknown key": {"evil": 1},
}


@pytest.mark.parametrize("changes", BAD_VARIANTS.values(), ids=BAD_VARIANTS.keys())
def test_manifest_schema_refuses_malformed_variants(changes: dict) -> None:
    with pytest.raises(InputError) as caught:
        Manifest.from_dict(_manifest(**changes), "alice/x/manifest.json")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("invalid alice/x/manifest.json: variants[0]")
    assert "re-publish" in message


def test_manifest_schema_refuses_malformed_documents(tmp_path: Path) -> None:
    valid = _manifest()
    read = Manifest.from_dict(copy.deepcopy(valid)).variants[0].verification
    assert read.passed and read.top1_agreement == 1.0 and read.max_abs_diff == 0.004  # typed, unknown keys dropped
    broken = {
        "a list": "[1, 2]",
        "a string": '"manifest"',
        "not JSON": "{not json",
        "binary": b"\xff\xfe\x00",
        "deep nesting": "[" * 100_000,
        "variants an object": json.dumps({**valid, "variants": {}}),
        "variant not an object": json.dumps({**valid, "variants": ["model.pte"]}),
        "no source": json.dumps({k: v for k, v in valid.items() if k != "source"}),
        "unknown top-level key": json.dumps({**valid, "extra": 1}),
        "schema_version true": json.dumps({**valid, "schema_version": True}),
    }
    for name, text in broken.items():
        folder = tmp_path / name.replace(" ", "-")
        folder.mkdir()
        (folder / MANIFEST_NAME).write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(InputError) as caught:
            Manifest.read(folder)
        assert "\n" not in str(caught.value) and MANIFEST_NAME in str(caught.value), name


# -- 1. pull and generate REPO never touch files outside their folder -----------------------


@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_pull_of_a_hostile_manifest_deletes_nothing(
    local_hub: LocalHubFixture, tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "home" / "victim.pte"
    victim.parent.mkdir()
    victim.write_bytes(b"precious")
    out = tmp_path / "home" / "work" / "out"
    out.parent.mkdir()
    name = str(victim) if how == "absolute" else "../../victim.pte"  # relative to out/ and to a cache snapshot
    repo_id = f"alice/hostile-{how}"
    _publish(local_hub, repo_id, _manifest(file=name, sha256="0" * 64))

    with pytest.raises(InputError, match=r"variants\[0\]\.file is .*not a plain file name"):
        pull(repo_id, output_dir=out, endpoint=local_hub.endpoint)
    assert victim.read_bytes() == b"precious"
    assert not out.exists()  # nothing left behind either

    monkeypatch.chdir(out.parent)  # relative names would resolve against the cache, or here
    with pytest.raises(InputError, match="not a plain file name"):
        pull(repo_id, endpoint=local_hub.endpoint)  # into the HF cache
    assert victim.read_bytes() == b"precious"


def test_generate_from_a_hostile_repo_deletes_nothing(local_hub: LocalHubFixture, tmp_path: Path, capsys) -> None:
    victim = tmp_path / "victim.pte"
    victim.write_bytes(b"precious")
    repo_id = "alice/hostile-generate"
    _publish(local_hub, repo_id, _manifest(file=str(victim), sha256="0" * 64))

    code, _, err = run_cli(["generate", repo_id, "--prompt", "hi", "--endpoint", local_hub.endpoint], capsys)
    assert code == InputError.exit_code and "not a plain file name" in error_line(err)
    assert victim.read_bytes() == b"precious"


# -- 9. advice instead of internal errors ---------------------------------------------------------


@pytest.mark.parametrize(
    "name, manifest, expected",
    [
        ("not-json", "{not json", "is not valid JSON"),
        ("list", "[1, 2, 3]", "holds a list, not a JSON object"),
        ("unknown-key", json.dumps(_manifest(bogus=1)), "has unknown key 'bogus'"),
        ("path", json.dumps(_manifest(file="../x.pte")), "not a plain file name"),
    ],
)
def test_ls_and_pull_of_a_malformed_manifest_give_advice(
    local_hub: LocalHubFixture, tmp_path: Path, capsys, name: str, manifest: str, expected: str
) -> None:
    repo_id = f"alice/malformed-{name}"
    _publish(local_hub, repo_id, manifest)
    for command in (["ls", repo_id], ["pull", repo_id, "-o", str(tmp_path / "out")]):
        code, _, err = run_cli([*command, "--endpoint", local_hub.endpoint], capsys)
        assert code == InputError.exit_code, err
        assert expected in error_line(err) and "Internal error" not in err
    assert not (tmp_path / "out").exists()


def test_ls_shows_a_variant_whose_verification_lacks_figures(local_hub: LocalHubFixture, capsys) -> None:
    repo_id = "alice/sparse-verification"
    _publish(local_hub, repo_id, _manifest(verification={"passed": True, "runner_decode_tokens_per_s": "fast"}))
    code, out, err = run_cli(["ls", repo_id, "--endpoint", local_hub.endpoint], capsys)
    assert code == 0, err
    assert "model-8da4w.pte" in out and "unknown" in out


def test_failed_pull_leaves_nothing_it_created(local_hub: LocalHubFixture, tmp_path: Path, capsys) -> None:
    repo_id = "alice/valid-small"
    _publish(local_hub, repo_id, _manifest(), **{"model-8da4w.pte": PTE_BYTES, "tokenizer.json": b"{}"})
    out = tmp_path / "out"
    code, _, err = run_cli(
        ["pull", repo_id, "--variant", "missing", "-o", str(out), "--endpoint", local_hub.endpoint], capsys
    )
    assert code == InputError.exit_code and "no variant 'missing'" in error_line(err)
    assert not out.exists()

    # A folder that was there keeps what it held, and only that.
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, _ = run_cli(
        ["pull", repo_id, "--variant", "missing", "-o", str(out), "--endpoint", local_hub.endpoint], capsys
    )
    assert code == InputError.exit_code
    assert [p.name for p in out.iterdir()] == ["notes.txt"]

    # The same pull of a real variant works into that folder.
    code, _, err = run_cli(["pull", repo_id, "-o", str(out), "--endpoint", local_hub.endpoint], capsys)
    assert code == 0, err
    assert (out / "model-8da4w.pte").read_bytes() == PTE_BYTES and (out / "notes.txt").read_text() == "mine"


def test_pull_into_a_file_is_refused(local_hub: LocalHubFixture, tmp_path: Path, capsys) -> None:
    target = tmp_path / "a-file"
    target.write_text("mine")
    code, _, err = run_cli(["pull", "alice/valid-small", "-o", str(target), "--endpoint", local_hub.endpoint], capsys)
    assert code == InputError.exit_code and "is a file, not a folder" in error_line(err)
    assert target.read_text() == "mine"


# -- 10. a mistyped option is a usage error ----------------------------------------------------------


def test_mistyped_option_is_a_usage_error(capsys) -> None:
    code, _, err = run_cli(["export", "x", "--outpt", "y"], capsys)
    assert code == 2
    assert "Error: No such option: --outpt" in err and "--output" in err  # click's close match
    assert "Internal error" not in err


# -- 4. `hub-export hub ...` fails with a non-zero exit ----------------------------------------------


def test_hub_commands_exit_non_zero_on_errors(tmp_path: Path, capsys) -> None:
    code, out, err = run_cli(["hub", "serve", "--host", "0.0.0.0", "--root", str(tmp_path)], capsys)
    assert code == 2 and "--allow-remote" in error_line(err) and out == ""

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out, err = run_cli(["hub", "serve", "--port", str(port), "--root", str(tmp_path)], capsys)
    assert code == 2 and f"Cannot listen on 127.0.0.1:{port}" in error_line(err) and out == ""

    code, out, err = run_cli(["hub", "add-user", "../evil", "--root", str(tmp_path)], capsys)
    assert code == 2 and "Invalid user name '../evil'" in error_line(err)
    assert out == ""  # `TOKEN=$(hub-export hub add-user ... | tail -1)` gets nothing, and the exit status says why


# -- 5. a malformed .pte is an error, not an abort -----------------------------------------------------


@pytest.fixture(scope="module")
def seed_pte(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small valid ExecuTorch program (a linear layer) to damage."""
    import torch
    from executorch.exir import to_edge

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, tokens, positions):
            return self.linear(tokens.float()) + positions.float().sum()

    program = torch.export.export(Tiny(), (torch.ones(1, 4, dtype=torch.long), torch.arange(1)))
    path = tmp_path_factory.mktemp("seed") / "seed.pte"
    path.write_bytes(to_edge(program).to_executorch().buffer)
    return path


def _damaged(seed: bytes, folder: Path) -> list[Path]:
    """A fixed corpus of damaged programs: random, truncated, bit-flipped and crafted files."""
    rng = random.Random(17)
    files = {
        "empty.pte": b"",
        "random-64.pte": rng.randbytes(64),
        "random-same-size.pte": rng.randbytes(len(seed)),
        "foreign-identifier.pte": seed[:4] + b"\xc3(\xa0\xa1" + seed[8:],  # logged by the runtime: not UTF-8
        "truncated-header.pte": seed[:30],
        "truncated-half.pte": seed[: len(seed) // 2],
        "truncated-tail.pte": seed[:-1],
        "huge-program-size.pte": seed[:16] + (2**63).to_bytes(8, "little") + seed[24:],
    }
    # An operator name that is not UTF-8: passes every header check, aborted the runtime.
    at = seed.index(b"aten::") + 2
    files["operator-name.pte"] = seed[:at] + b"\xc3" + seed[at + 1 :]
    for index in range(3):
        flipped = bytearray(seed)
        for _ in range(4):
            position = rng.randrange(len(flipped))
            flipped[position] ^= 1 << rng.randrange(8)
        files[f"bit-flips-{index}.pte"] = bytes(flipped)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return [folder / name for name in files]


DRIVER = """
import json, sys
from hub_export.cli import main
tokenizer, files = sys.argv[1], sys.argv[2:]
for path in files:
    sys.argv = ["hub-export", "generate", path, "--tokenizer", tokenizer, "--prompt", "Once upon a time"]
    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code
    print(json.dumps([path, code]), flush=True)
"""


def test_malformed_pte_files_fail_cleanly(seed_pte: Path, tiny_model: Path, tmp_path: Path) -> None:
    corpus = _damaged(seed_pte.read_bytes(), tmp_path)
    env = {**os.environ, "COLUMNS": "400"}
    # One process for the corpus; before the fix it died of SIGABRT on the first crafted file.
    run = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tiny_model), *map(str, corpus)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, f"the process died ({run.returncode}): {run.stderr[-2000:]}"
    codes = dict(json.loads(line) for line in run.stdout.splitlines() if line.startswith("["))
    assert set(codes) == {str(p) for p in corpus}
    crafted = {p.name: codes[str(p)] for p in corpus if not p.name.startswith("bit-flips")}
    assert set(crafted.values()) == {VerificationError.exit_code}, crafted
    assert set(codes.values()) <= {VerificationError.exit_code, InputError.exit_code}, codes  # a flip may load
    errors = [line for line in run.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == len(corpus) and "Internal error" not in run.stderr
    assert any("crashes the ExecuTorch runtime (SIGABRT)" in line for line in errors)
    assert any("lacks the ExecuTorch file identifier" in line for line in errors)


def test_pte_header_check_accepts_what_executorch_writes(seed_pte: Path, tmp_path: Path) -> None:
    from executorch.exir._serialize._program import _get_extended_header

    from hub_export.runtime.pte import check_pte_header

    check_pte_header(seed_pte)  # no error
    data = seed_pte.read_bytes()
    assert _get_extended_header(data) is not None  # executorch agrees the header is there
    for damaged in _damaged(data, tmp_path):
        if not damaged.name.startswith(("bit-flips", "operator-name")):
            with pytest.raises(VerificationError):
                check_pte_header(damaged)


def test_pull_checks_paths_even_past_the_schema(
    local_hub: LocalHubFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Defence in depth: were the schema check ever skipped, pull still touches nothing outside its folder.
    import hub_export.pipeline.manifest

    victim = tmp_path / "victim.pte"
    victim.write_bytes(b"precious")
    repo_id = "alice/hostile-unchecked"
    _publish(local_hub, repo_id, _manifest(file=str(victim), sha256="0" * 64))
    monkeypatch.setattr(hub_export.pipeline.manifest, "check_manifest", lambda data, where=None: None)
    for out in (tmp_path / "out", None):
        with pytest.raises(InputError, match="refusing to touch"):
            pull(repo_id, output_dir=out, endpoint=local_hub.endpoint)
        assert victim.read_bytes() == b"precious"
