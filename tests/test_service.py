"""The service layer behind the Space: checked requests, background jobs, views. No Gradio, no model."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from hub_export.errors import InputError, opt
from hub_export.hub.views import TABLE_HEADERS, card_markdown, variant_rows
from hub_export.options import KV_DTYPES, ExportOptions, form_fields, form_kind
from hub_export.pipeline.quantize import QEMBEDDINGS, QMODES
from hub_export.redact import Redactor
from hub_export.service import (
    WAITING,
    BackgroundJob,
    drafter_choice,
    export_request,
    failure_line,
    options_from_form,
    preview_request,
    shown_default,
    source_id,
)
from hub_export.tasks.registry import TASKS
from hub_export.tasks.text_generation.run import Sampling

HUB = "https://hub.example"


def test_a_pasted_model_url_or_id_is_the_source_and_a_path_is_refused_on_a_public_service(tmp_path: Path) -> None:
    for text in (
        "acme/Model",
        " https://hub.example/acme/Model ",
        "https://huggingface.co/acme/Model/tree/v2",
        "https://hub.example/acme/Model/blob/main/config.json",
    ):
        assert source_id(text, HUB, allow_local=False) == "acme/Model", text
    with pytest.raises(InputError, match="not a Hub model id"):
        source_id(str(tmp_path), HUB, allow_local=False)
    assert source_id(str(tmp_path), HUB, allow_local=True) == str(tmp_path)
    with pytest.raises(InputError, match="enter the source model's id"):
        source_id("  ", HUB, allow_local=True)


def _form(**values):
    """An export form's option values: the defaults the page shows, with ``values`` typed over them."""
    return {**{spec.name: shown_default(spec) for spec in form_fields()}, **values}


def test_the_form_is_the_options_that_declare_a_form_control_and_shows_their_defaults() -> None:
    assert [spec.name for spec in form_fields()] == [
        "qmodes", "qembedding", "group_size", "max_seq_len", "kv_cache", "calibration_text", "revision", "task",
    ]  # fmt: skip
    assert _form() == {
        "qmodes": ["8da4w"], "qembedding": "none", "group_size": 32, "max_seq_len": 0, "kv_cache": "fp32",
        "calibration_text": None, "revision": "", "task": "none",
    }  # fmt: skip
    assert options_from_form(_form()) == ExportOptions() == options_from_form({})  # shown defaults read back
    offered = {spec.name: [value for _, value in spec.metadata["form"].choices] for spec in form_fields()}
    # The choices are the library's registries, so a new qmode or task is offered with no edit to the form.
    assert offered["qmodes"] == list(QMODES) and offered["kv_cache"] == list(KV_DTYPES)
    assert offered["qembedding"] == [None, *QEMBEDDINGS] and offered["task"] == [None, *TASKS]


def test_every_export_option_is_of_a_kind_a_form_can_offer() -> None:
    """Offering another option in the Space takes a FormControl in options.py and nothing else, for every type."""
    kinds = {spec.name: form_kind(spec) for spec in dataclasses.fields(ExportOptions)}
    assert kinds["qmodes"] == "several" and kinds["qembedding"] == "one" and kinds["group_size"] == "whole"
    assert kinds["calibration"] == "flag" and kinds["max_size_ratio"] == "number" and kinds["attention_sink"] == "text"
    assert kinds["calibration_text"] == "file"


def test_an_uploaded_calibration_text_reaches_the_options_and_a_server_path_does_not(tmp_path: Path) -> None:
    """The form's upload (a path in the web framework's upload folder, under the temporary folder) becomes
    ``calibration_text``; a path to one of the machine's own files, as an API caller could send, is refused."""
    upload = tmp_path / "domain.txt"
    upload.write_text("the pump's seal wears first; replace it before the bearing " * 20, encoding="utf-8")
    assert options_from_form(_form(calibration_text=str(upload))).calibration_text == str(upload.resolve())
    assert options_from_form(_form(calibration_text=None)).calibration_text is None
    for path in ("/etc/hostname", str(Path.home() / ".cache" / "huggingface" / "token")):
        with pytest.raises(InputError, match="--calibration-text: upload the file through the form") as refused:
            options_from_form(_form(calibration_text=path))
        assert refused.value.param == "calibration_text"
    upload.rename(tmp_path / "domain.bin")
    with pytest.raises(InputError, match=r"upload a \.txt file \(got \.bin\)"):
        options_from_form(_form(calibration_text=str(tmp_path / "domain.bin")))
    short = tmp_path / "short.txt"
    short.write_text("too short", encoding="utf-8")
    with pytest.raises(InputError, match="has 2 words"):  # the library's own check, as on the command line
        options_from_form(_form(calibration_text=str(short)))


def test_the_export_form_becomes_validated_options() -> None:
    request = export_request(
        "acme/Model", _form(qmodes=["8da4w", "8da4w", "fp32"], group_size="", revision=" v1 "), "", True, endpoint=HUB
    )
    assert request.source == "acme/Model" and request.repo_name == "Model-ExecuTorch" and request.private
    options = request.options
    assert options.qmodes == ("8da4w", "fp32") and options.qembedding is None  # a double tick is one variant
    assert options.group_size == 32 and options.max_seq_len is None and options.revision == "v1"
    assert options.task is None and options.trust_remote_code is False  # a service never runs a model's code
    assert options_from_form(_form(revision="none")).revision == "none"  # "none" is no choice's None in a text box
    typed = options_from_form(_form(max_seq_len=256, qembedding="8w"))
    assert (typed.max_seq_len, typed.qembedding) == (256, "8w")
    with pytest.raises(InputError, match="pick at least one of --qmode") as no_variant:
        export_request("acme/Model", _form(qmodes=[]), "x", False, endpoint=HUB)
    assert no_variant.value.param == "qmodes"
    with pytest.raises(InputError, match="--max-seq-len must be a whole number"):
        export_request("acme/Model", _form(max_seq_len="long"), "x", False, endpoint=HUB)
    assert options.kv_cache == "fp32"
    assert export_request("acme/Model", _form(kv_cache="int8"), "x", False, endpoint=HUB).options.kv_cache == "int8"
    with pytest.raises(InputError) as bad_cache:
        export_request("acme/Model", _form(kv_cache="int3"), "x", False, endpoint=HUB)
    assert bad_cache.value.param == "kv_cache"


def test_the_form_refuses_what_the_library_refuses_in_its_words() -> None:
    with pytest.raises(InputError) as from_the_form:
        options_from_form(_form(group_size=48))
    with pytest.raises(InputError) as from_the_library:
        ExportOptions(group_size=48)
    assert from_the_form.value.param == "group_size" and str(from_the_form.value) == str(from_the_library.value)
    request = export_request("acme/Model", _form(task="feature-extraction", qmodes=["8da8w"]), "x", False, endpoint=HUB)
    assert request.options.task == "feature-extraction"


def test_the_preview_form_is_checked_before_any_download() -> None:
    request = preview_request(" acme/Model-ExecuTorch ", "", "Hi", "", True, "  ", Sampling(temperature=0.5))
    assert (request.repo_id, request.variant, request.max_new_tokens, request.chat, request.system) == (
        "acme/Model-ExecuTorch",
        None,
        64,
        None,
        None,
    )
    assert preview_request("acme/M", "8w", "Hi", 8, False).chat is False
    for bad, match in (
        (("", None, "Hi", 8, True), "enter the repo"),
        (("acme/M", None, " ", 8, True), "type a prompt"),
        (("acme/M", None, "Hi", 999, True), "at most 256"),
    ):
        with pytest.raises(InputError, match=match):
            preview_request(*bad)
    with pytest.raises(InputError, match="top_p|Top-p|--top-p"):
        preview_request("acme/M", None, "Hi", 8, True, None, Sampling(top_p=2.0))


def test_failures_are_one_line_worded_by_the_front_end(caplog: pytest.LogCaptureFixture) -> None:
    error = InputError(f"{opt('max_seq_len')} 5000 is above the model's limit", param="max_seq_len", code="x")
    assert failure_line(error, "j1", Redactor()) == "--max-seq-len 5000 is above the model's limit"
    worded = failure_line(error, "j1", Redactor(), lambda name: "'Max'", {"x": "lower it"})
    assert worded == "'Max' 5000 is above the model's limit; lower it"
    token = "hf_" + "u" * 34
    generic = failure_line(RuntimeError(f"boom in /srv/secret with {token}"), "job42", Redactor())
    assert "RuntimeError" in generic and "job42" in generic and "boom" not in generic
    assert "boom" in caplog.text and token not in caplog.text  # the details go to the logs, redacted


def test_card_markdown_shows_front_matter_as_code() -> None:
    assert card_markdown("---\nlicense: mit\n---\n\n# Title\n") == "```yaml\nlicense: mit\n```\n\n# Title\n"
    assert card_markdown("# No front matter") == "# No front matter"


def test_an_abandoned_job_keeps_its_slot_and_cleans_up(tmp_path: Path) -> None:
    """Gradio closes the handler of a closed page in its event loop: closing must not wait for torch."""
    slots, release = threading.BoundedSemaphore(1), threading.Event()

    def slow(folder: Path, emit) -> str:
        emit(("stage", "working"))
        (folder / "partial.pte").write_text("x")
        release.wait(10)  # the library call that cannot be interrupted
        return "first"

    first = BackgroundJob(slow, slots=slots, root=tmp_path, kind="export")
    events = first.events()
    assert next(events) == [("stage", "working")]
    started = time.monotonic()
    events.close()
    assert time.monotonic() - started < 0.5

    second = BackgroundJob(lambda folder, emit: "second", slots=slots, root=tmp_path, kind="preview")
    seen: list = []
    for batch in second.events():
        seen += batch
        release.set()  # the abandoned job ends only now; the second one waited for its slot
    assert seen[0] == ("wait", WAITING) and second.outcome() == "second"
    assert not list(tmp_path.iterdir()), "both job folders are removed"


def test_variants_table_shows_quality_and_verification() -> None:
    from hub_export.pipeline.manifest import Manifest, Variant
    from hub_export.pipeline.records import Verification

    def variant(qmode: str, verification: dict) -> Variant:
        return Variant(
            file=f"model-{qmode}.pte", qmode=qmode, qembedding=None, group_size=None, max_seq_len=64,
            size_bytes=235776, sha256="0" * 64, metadata={}, verification=Verification.from_dict(verification),
            export_seconds=1.0,
        )  # fmt: skip

    current = {
        "passed": True, "mean_kl_vs_eager": 0.0238, "top1_agreement": 1.0, "top1_within_ties": 1.0,
        "max_kl": 0.1, "min_top1": 0.8, "positions": 530, "max_abs_diff": 0.00406,
        "runner_prefill_tokens_per_s": 2800.0, "runner_decode_tokens_per_s": 1500.0,
        "quality": {"text": "eval_en.txt", "tokens": 2048, "perplexity": 33.68, "fp32_perplexity": 22.39,
                    "ratio": 1.504, "top1": 0.604, "kl": 0.4685},
    }  # fmt: skip
    older = {"passed": True, "max_abs_diff": 0.00406, "tolerance": 0.05}  # a manifest from before quality and KL
    manifest = Manifest(source={}, versions={}, variants=[variant("8da4w", current), variant("fp32", older)])
    new, old = (dict(zip(TABLE_HEADERS, row, strict=False)) for row in variant_rows(manifest, ["model-8da4w.pte"]))
    assert new["perplexity (vs fp32)"] == "33.7 (1.50x fp32)"
    assert new["verification"] == "KL 0.024, top-1 100% vs eager"
    assert (new["this job"], new["verified"]) == ("yes", "yes")
    assert (new["prefill tok/s"], new["decode tok/s"]) == ("2800", "1500")
    assert old["perplexity (vs fp32)"] == "n/a" and old["verification"] == "diff 0.0041 vs eager"
    assert "tolerance" not in " ".join(TABLE_HEADERS)


def test_streamed_events_are_coalesced_to_a_few_redraws_a_second(tmp_path: Path) -> None:
    """A preview emits a piece per token; the page should redraw about ten times a second, not per token."""

    def chatty(folder: Path, emit) -> str:
        for index in range(60):
            emit(("text", f"{index} "))
            time.sleep(0.005)
        return "done"

    def batches(every: float) -> list[list]:
        job = BackgroundJob(chatty, slots=threading.BoundedSemaphore(1), root=tmp_path, kind="preview")
        seen = [batch for batch in job.events(every=every) if batch]
        assert [value for batch in seen for _, value in batch] == [f"{index} " for index in range(60)]
        assert job.outcome() == "done"
        return seen

    assert len(batches(0.1)) <= 6  # about 0.3 s of tokens in batches of 0.1 s
    assert len(batches(0.0)) > 10  # as they come


def test_the_preview_drafter_field_is_off_lookup_or_a_variant_of_the_repo() -> None:
    assert drafter_choice(False) == drafter_choice("off") == drafter_choice(None) == (False, None)
    assert drafter_choice(True) == drafter_choice("lookup") == (True, None)
    assert drafter_choice("draft:model-8da4w.pte") == (False, "model-8da4w.pte")
    for bad in ("draft:../model.pte", "draft:", "faster", 3):
        with pytest.raises(InputError, match="several tokens per step"):
            drafter_choice(bad)
