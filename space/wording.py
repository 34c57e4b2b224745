"""The Space's words for the library's errors: its field labels for option names, its advice for CLI advice."""

import gradio as gr

from hub_export import service
from hub_export.options import form_fields
from hub_export.redact import Redactor

# The library names options by their CLI flags and advises in CLI terms; the page names its
# fields and gives its own advice where a flag to pass makes no sense in a web form.
FIELD_LABELS = {
    **{spec.name: f"'{spec.metadata['form'].label}'" for spec in form_fields()},  # the export options' own labels
    "token": "your token", "source": "'Source model'", "repo_id": "'Target repo'", "endpoint": "the Space's HF_ENDPOINT", "branch": "the revision",
    "max_new_tokens": "'Max new tokens'", "system": "'System message'", "temperature": "'Temperature'",
    "top_p": "'Top-p'", "top_k": "'Top-k'", "repetition_penalty": "'Repetition penalty'", "seed": "'Seed'",
    # not a field of the export form: the file must come from `hub-export export --speculative`
    "speculative": "`hub-export export --speculative`", "lookup": "'Several tokens per step'",
}  # fmt: skip
SPACE_HINTS = {
    "login": "sign in again or paste a valid write token",
    "token_rejected": "sign in again or paste a valid write token",
    "read_only": "create a write token and use it here",
    "gated": "accept its conditions on the Hub, then retry with the token of an account that accepted them",
    "not_found": "check the id; for a private repo, use a token that can read it",
    "forbidden": "use a token with access to that repo, or choose a 'Target repo' in your own namespace",
    "other_source": "choose another 'Target repo'",
    "foreign_repo": "choose another 'Target repo'",
    "other_namespace": "choose a 'Target repo' in your own namespace",
    "no_chat_template": "untick 'Use the chat template' to send the prompt as is",
    "system_needs_chat": "tick 'Use the chat template', or clear the system message",
}


def field_label(name: str) -> str:
    """The form's name for a library option (``max_seq_len`` -> 'Max sequence length')."""
    return FIELD_LABELS.get(name, f"'{name.replace('_', ' ').capitalize()}'")


def failure_message(error: BaseException, job_id: str, redact: Redactor) -> str:
    """The one line the page shows for ``error``: the library's, in the form's words."""
    if isinstance(error, gr.Error):
        return redact(error.message)
    return service.failure_line(error, job_id, redact, field_label, SPACE_HINTS, logs="the Space's logs")
