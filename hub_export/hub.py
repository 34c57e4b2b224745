"""Hub access shared by every stage: endpoint and token, and one translator of Hub failures.

Reading a source, pushing, listing and pulling all go through ``huggingface_hub``, and
all of their failures go through :func:`hub_errors`: the same gated repo or missing
token gets the same advice whichever command met it. Errors carry a ``code`` (``login``,
``gated``, ``not_found``, ``token_rejected``, ``forbidden``, ``revision``, ``network``,
``conflict``) so that a front end can give its own advice; the token never appears in
a message.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from .errors import HubError, HubExportError, InputError, opt
from .redact import redact

LOGIN_HINT = f"pass {opt('token')}, set HF_TOKEN or run `hf auth login`"


def resolve_endpoint(endpoint: str | None = None) -> str:
    """``endpoint``, else ``HF_ENDPOINT`` (read by huggingface_hub), without a trailing slash."""
    from huggingface_hub import constants

    return (endpoint or constants.ENDPOINT).rstrip("/")


def resolve_token(token: str | None = None) -> str | None:
    """``token``, else ``HF_TOKEN``, else the huggingface_hub login; None when not logged in."""
    from huggingface_hub import get_token

    return token or get_token()


def network_errors() -> tuple[type[BaseException], ...]:
    """Connection-level failures of whichever HTTP client huggingface_hub uses (httpx2 in 2.x)."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module_name in ("httpx2", "httpx"):
        try:
            errors.append(__import__(module_name).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def not_logged_in(endpoint: str) -> HubError:
    return HubError(f"not logged in to {endpoint}", hint=LOGIN_HINT, param="token", code="login")


def _http_failure(error, repo_id: str, endpoint: str, action: str, failure: type[HubExportError]) -> HubExportError:
    status = error.response.status_code if getattr(error, "response", None) is not None else None
    detail = " ".join((getattr(error, "server_message", None) or "").split())[:200]
    if status == 400:
        return InputError(f"the Hub refused to {action} {repo_id} (HTTP 400: {detail or 'bad request'})",
                          hint="check the repo name", repo_id=repo_id)
    if status == 401:
        return failure(f"the Hub at {endpoint} rejected the token (HTTP 401)", hint=f"{LOGIN_HINT} with a valid token",
                       param="token", code="token_rejected")
    if status == 403:
        return failure(f"permission denied: your token cannot {action} {repo_id} (HTTP 403)",
                       hint="use a token with access to that repo, or push to your own namespace",
                       param="token", repo_id=repo_id, code="forbidden")
    if status == 409:
        return failure(f"conflict while trying to {action} {repo_id} (HTTP 409: {detail})", hint="retry in a moment",
                       repo_id=repo_id, code="conflict")
    if status == 412:
        return failure(f"{repo_id} changed while pushing (HTTP 412)", hint="run the command again", repo_id=repo_id,
                       code="conflict")
    return failure(f"the Hub failed to {action} {repo_id} (HTTP {status or '?'}{': ' + detail if detail else ''})",
                   hint="retry later", repo_id=repo_id)


@contextmanager
def hub_errors(
    repo_id: str,
    endpoint: str,
    action: str = "access",
    token: str | None = None,
    failure: type[HubExportError] = HubError,
    revision: str | None = None,
) -> Iterator[None]:
    """Turn huggingface_hub and network failures into one-line, actionable errors.

    ``failure`` is the error class for what the Hub refused or could not serve
    (:class:`~hub_export.errors.SourceError` while reading a source, exit code 3;
    :class:`~hub_export.errors.HubError` otherwise, exit code 5).

    Example:
        >>> with hub_errors("alice/repo", "https://huggingface.co", "push to", token):
        ...     api.create_commit(...)
    """
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        LocalTokenNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except HubExportError:
        raise
    except LocalTokenNotFoundError:
        raise not_logged_in(endpoint) from None
    except GatedRepoError:
        raise failure(
            f"{repo_id} is gated", repo_id=repo_id, param="token", code="gated",
            hint=f"accept its conditions on the Hub, then retry with the token ({opt('token')} or HF_TOKEN) of an "
                 "account that accepted them",
        ) from None
    except RepositoryNotFoundError:
        raise failure(
            f"repo {repo_id} not found on {endpoint}, or your token cannot see it", repo_id=repo_id, code="not_found",
            hint=f"check the id; for a private repo use a token that can read it ({opt('token')} or HF_TOKEN)",
        ) from None
    except RevisionNotFoundError:
        asked = f"revision {revision!r}" if revision else "revision"
        raise failure(f"{asked} not found in {repo_id}", hint=f"check {opt('revision')} or {opt('branch')}",
                      param="revision", repo_id=repo_id, code="revision") from None
    except LocalEntryNotFoundError:
        raise failure(f"cannot download from {endpoint} (unreachable, and not in the local cache)",
                      hint=f"check the network or {opt('endpoint')}/HF_ENDPOINT", code="network") from None
    except EntryNotFoundError as error:
        raise failure(f"{repo_id} lacks a file hub-export needs ({redact(str(error).splitlines()[0], token)})",
                      repo_id=repo_id) from None
    except HfHubHTTPError as error:
        translated = _http_failure(error, repo_id, endpoint, action, failure)
        translated.reason = redact(translated.reason, token)
        raise type(translated)(translated.reason, hint=translated.hint, param=translated.param,
                               repo_id=translated.repo_id, code=translated.code) from None
    except HFValidationError as error:
        raise InputError(redact(str(error).splitlines()[0], token)) from None
    except network_errors() as error:
        raise failure(f"cannot reach {endpoint} ({type(error).__name__})",
                      hint=f"check the network or {opt('endpoint')}/HF_ENDPOINT", code="network") from None
