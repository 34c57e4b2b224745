"""The Space's page: layout, views and the small helpers of its controls (no library logic, no auth).

``space/app.py`` wires these controls to its handlers; ``page.css`` and ``page.js`` make
the page readable (contrast, wrapping, a phone's one column) and accessible (names
Gradio leaves out, output boxes reachable by keyboard).
"""

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from hub_export.hub.api import default_repo_name
from hub_export.hub.views import TABLE_HEADERS
from hub_export.options import form_fields, form_kind
from hub_export.service import MAX_NEW_TOKENS, MAX_PROMPT_CHARS, MAX_UPLOAD_BYTES, shown_default
from hub_export.tasks.text_generation.run import Sampling

HERE = Path(__file__).parent
# Words, not emoji: status lines are read by API clients and screen readers too.
RUNNING, DONE, FAILED, QUEUED = "**Running:**", "**Done:**", "**Failed:**", "**Queued:**"
# The Preview's prompt follows the chat checkbox while the user has not typed one.
CHAT_PROMPT, PLAIN_PROMPT = "What is the capital of France?", "Once upon a time"


def bar(fraction: float, width: int = 16) -> str:
    """A text progress bar: it lives in the status line, which stays readable when a job fails."""
    done = round(max(0.0, min(fraction, 1.0)) * width)
    return "▰" * done + "▱" * (width - done)


@dataclass
class ExportView:
    """What the Export tab shows; :meth:`outputs` is the tuple the handler yields."""

    status: str = ""
    log_lines: list[str] = field(default_factory=list)
    link: str = ""
    rows: list[list[Any]] = field(default_factory=list)
    card: str = ""
    repo_id: str | None = None

    def outputs(self) -> tuple:
        table = pd.DataFrame(self.rows, columns=TABLE_HEADERS)
        return self.status, "\n".join(self.log_lines), self.link, table, self.card, self.repo_id


# -- the controls ----------------------------------------------------------------------------

INTRO = """\
# hub-export · Hugging Face → ExecuTorch

Export a causal language model to [ExecuTorch](https://github.com/pytorch/executorch) `.pte` files
for phones and laptops (XNNPACK), **verified** against the original model, and push them with a model card
to a repo in your account. Then try them in the **Preview** tab.
"""


def access_row(use_oauth: bool, env_token_allowed: bool) -> gr.Textbox:
    """Sign-in button (OAuth) or token field (offline); returns the token field (an API parameter either way)."""
    with gr.Row(equal_height=True):
        if use_oauth:
            gr.LoginButton(scale=0, min_width=260)
            gr.Markdown("Jobs act as **you**: the Space pushes to your account with your sign-in, never its own token.")
        # Visible text, not only a placeholder: a placeholder vanishes once typed in and is faint.
        info = "A write token, used for this job only; never stored or shown in the log."
        if env_token_allowed:
            info += " Blank: the server's HF_TOKEN."
        return gr.Textbox(
            "",
            label="Hugging Face token",
            type="password",
            placeholder="hf_…",
            visible=not use_oauth,
            info=info,
            scale=3,
        )


def option_elem_id(spec: dataclasses.Field) -> str:
    """The page's id of an option's control (``export-group-size``), for page.js and browser tests."""
    return "export-" + spec.name.replace("_", "-")


def option_control(spec: dataclasses.Field) -> gr.components.Component:
    """The control of one export option, from its :class:`~hub_export.options.FormControl`: the library's choices
    and limits, its default as :func:`~hub_export.service.options_from_form` reads it back."""
    form, kind, shown = spec.metadata["form"], form_kind(spec), shown_default(spec)
    common = dict(label=form.label, info=form.info or spec.metadata["help"], elem_id=option_elem_id(spec))
    if kind == "several":
        return gr.CheckboxGroup(form.choice_values(), value=shown, **common)
    if kind == "one":
        return gr.Radio(form.choice_values(), value=shown, **common)
    if kind == "flag":
        return gr.Checkbox(value=shown, **common)
    if kind in ("whole", "number"):
        steps = {"step": form.multiple_of} if form.multiple_of else {}
        return gr.Number(
            shown,
            precision=0 if kind == "whole" else None,
            minimum=form.minimum,
            maximum=form.maximum,
            **steps,
            **common,
        )
    if kind == "file":  # a file box has no hint line: the hint goes into its label
        label = f"{form.label} ({form.info})" if form.info else form.label
        return gr.File(
            file_types=list(form.upload), type="filepath", label=label, elem_id=common["elem_id"], height=120
        )
    return gr.Textbox(shown, placeholder=form.placeholder, **common)


def option_controls() -> dict[str, gr.components.Component]:
    """One control per option the form offers, by option name, in rows of three, in the order ExportOptions
    declares them: an option given a FormControl appears here with no change to the Space."""
    controls: dict[str, gr.components.Component] = {}
    specs = form_fields()
    for row in range(0, len(specs), 3):
        with gr.Row():
            for spec in specs[row : row + 3]:
                controls[spec.name] = option_control(spec)
    return controls


def export_tab(allow_local_sources: bool) -> dict[str, Any]:
    ui: dict[str, Any] = {}
    with gr.Row():
        ui["source"] = gr.Textbox(
            label="Source model",
            placeholder="HuggingFaceTB/SmolLM2-135M" + (" or a local folder" if allow_local_sources else ""),
            info="A transformers causal LM or sentence encoder with safetensors weights; remote code is refused.",
            scale=3,
        )
    ui["options"] = option_controls()
    with gr.Row(equal_height=True):
        ui["repo_name"] = gr.Textbox(
            "",
            label="Target repo",
            placeholder="{source name}-ExecuTorch",
            info="A name in your namespace, or namespace/name (an org you can write to).",
            scale=3,
        )
        ui["private"] = gr.Checkbox(label="Private", value=False, scale=1)
    ui["run"] = gr.Button("Export & push", variant="primary")
    ui["status"] = gr.Markdown("Fill in the form and press **Export & push**.", label="Status", elem_id="export-status")
    ui["log"] = gr.Textbox(
        label="Log", lines=12, max_lines=12, autoscroll=True, interactive=False, buttons=["copy"], elem_id="export-log"
    )
    ui["link"] = gr.Markdown(label="Repo link", elem_id="export-link")
    ui["table"] = gr.Dataframe(
        headers=TABLE_HEADERS, label="Variants in the repo", interactive=False, wrap=True, elem_id="export-table"
    )
    with gr.Accordion("Model card", open=False):
        ui["card"] = gr.Markdown(label="Model card")
    ui["pushed"] = gr.State(None)
    return ui


def preview_tab() -> dict[str, Any]:
    ui: dict[str, Any] = {}
    with gr.Row(equal_height=True):
        ui["repo"] = gr.Textbox(label="Repo", placeholder="alice/SmolLM2-135M-ExecuTorch", scale=3)
        ui["variant"] = gr.Dropdown(
            label="Variant", choices=[], value="", allow_custom_value=True, scale=2, info="Blank: the first one."
        )
        ui["refresh"] = gr.Button("↻ Variants", scale=0, min_width=120)
    ui["prompt"] = gr.Textbox(
        label="Prompt",
        value=CHAT_PROMPT,
        lines=3,
        max_length=MAX_PROMPT_CHARS,
        info="For a sentence-embedding repo: two or more sentences, one per line, to compare. "
        "For a fill-mask repo: a text with [MASK] (or <mask>) where a word is missing.",
    )
    with gr.Row(equal_height=True):
        ui["image"] = gr.Image(
            label="Image (for an image-classification or vision-language repo)",
            type="filepath",
            image_mode=None,  # the path as uploaded: Gradio decodes nothing (an animated GIF's frames included)
            sources=["upload"],
            height=180,
            elem_id="preview-image",
        )
        ui["audio"] = gr.Audio(
            label="Recording (for a speech-recognition repo)",
            type="filepath",
            sources=["upload", "microphone"],  # upload first: a server or desktop often has no microphone
            elem_id="preview-audio",
        )
    with gr.Row(equal_height=True):
        ui["chat"] = gr.Checkbox(
            label="Use the chat template",
            value=True,
            info="The model's own, when it has one: the prompt goes in as a user message.",
            scale=1,
        )
        ui["system"] = gr.Textbox(
            "", label="System message", placeholder="optional; needs the chat template", lines=1, scale=3
        )
    ui["max_new_tokens"] = gr.Slider(1, MAX_NEW_TOKENS, value=48, step=1, label="Max new tokens")
    ui["lookup"] = gr.Dropdown(
        [("off", "off"), ("prompt lookup", "lookup")],
        value="off",
        label="Several tokens per step",
        info="For a file exported with --speculative: tokens proposed from the prompt, or by a cheaper variant of "
        "the repo, checked several at a time; the text is the same.",
    )
    ui.update(sampling_controls())
    ui["run"] = gr.Button("Generate", variant="primary")
    ui["text"] = gr.Textbox(
        label="Generated text", lines=8, interactive=False, buttons=["copy"], elem_id="preview-text"
    )
    ui["stats"] = gr.Markdown(label="Status and speed", elem_id="preview-stats")
    return ui


def sampling_controls() -> dict[str, Any]:
    """Sampling fields, greedy by default (the output then depends on the model only)."""
    default = Sampling()
    ui: dict[str, Any] = {}
    with gr.Accordion("Sampling", open=False):
        with gr.Row():
            ui["temperature"] = gr.Slider(
                0, 2, value=default.temperature, step=0.05, label="Temperature", info="0: greedy (the likeliest token)."
            )
            ui["top_p"] = gr.Slider(0.05, 1, value=default.top_p, step=0.05, label="Top-p", info="1: off.")
        with gr.Row():
            ui["top_k"] = gr.Number(default.top_k, label="Top-k", precision=0, minimum=0, info="0: off.")
            ui["repetition_penalty"] = gr.Slider(
                0.5, 2, value=default.repetition_penalty, step=0.05, label="Repetition penalty", info="1: off."
            )
            ui["seed"] = gr.Number(default.seed, label="Seed", precision=0, minimum=0, info="Same seed, same text.")
    return ui


# Accessible names Gradio leaves out, by elem_id (space/page.js sets them): a group of choices has no legend.
ACCESSIBLE_NAMES = {
    **{
        option_elem_id(spec): spec.metadata["form"].label
        for spec in form_fields()
        if form_kind(spec) in ("several", "one")
    },
    "export-log": "Log",
    "preview-text": "Generated text",
}
PAGE_SCRIPT = (
    "<script>\n"
    + (HERE / "page.js").read_text().replace("__ACCESSIBLE_NAMES__", json.dumps(ACCESSIBLE_NAMES))
    + "</script>"
)
PAGE_CSS = (HERE / "page.css").read_text()  # contrast, word wrapping, one column on a phone


API_NOTE = """\
---
This Space is also an HTTP API (`/export`, `/preview`; see **Use via API** below and the README).
With OAuth, API callers pass their token as `Client(..., oauth_token="hf_...")`; otherwise as the `token` parameter.
"""


# Gradio's run history would keep every job's inputs, the token field included, in the
# browser (or a Hub bucket): off. The footer keeps the API docs link.
# (Gradio 6 takes the page's CSS and head at launch.)
LAUNCH_OPTIONS: dict[str, Any] = {
    "run_history": False,
    "footer_links": ["api", "gradio"],
    "css": PAGE_CSS,
    "head": PAGE_SCRIPT,
    # Uploads over this are refused by Gradio before they are stored; what they hold (pixels,
    # frames, seconds) is checked from their headers when a preview reads them.
    "max_file_size": MAX_UPLOAD_BYTES,
}


def export_queued() -> tuple:
    """The Export outputs at the click: cleared, with a status saying the job is on its way."""
    return ExportView(status=f"{QUEUED} starting as soon as an export slot is free…").outputs()[:5]


def preview_queued() -> tuple[str, str]:
    """The Preview outputs at the click: the old answer gone, and a sign that work started."""
    return "", f"{QUEUED} generating as soon as a preview slot is free…"


def default_name(source: str) -> str | Any:
    """Prefill the target repo from the source (a repo id or a folder)."""
    source = (source or "").strip()
    return default_repo_name(source) if source else gr.skip()


def default_prompt(chat: bool, prompt: str) -> str | Any:
    """Swap the default prompt for the other one when chat is toggled; a typed prompt stays."""
    if prompt not in (CHAT_PROMPT, PLAIN_PROMPT):
        return gr.skip()
    return CHAT_PROMPT if chat else PLAIN_PROMPT


def fill_preview(repo_id: str | None) -> str | Any:
    return repo_id if repo_id else gr.skip()
