"""What an upload request says, checked: a preupload item, a commit's header and operations (NDJSON)."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from hub_export.hub.localhub.context import (
    field_of,
    parse_json,
    required_field,
)
from hub_export.hub.localhub.objects import Entry
from hub_export.hub.localhub.records import AddFile, AddLfs, Delete, HubAPIError, validate_path
from hub_export.hub.localhub.store import LocalHubStore, Operation

SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def preupload_item(item: Any) -> tuple[str, int, bytes]:
    """``(path, size, sample)`` of one file the client is about to upload."""
    if not isinstance(item, dict):
        raise HubAPIError(400, "Invalid request: each of 'files' must be an object")
    try:
        sample = base64.b64decode(field_of(item, "sample", str, ""), validate=True)
    except binascii.Error as e:
        raise HubAPIError(400, f"Invalid request: 'sample' is not base64: {e}") from e
    return required_field(item, "path", str), field_of(item, "size", int, 0), sample


def parse_commit(store: LocalHubStore, body: bytes) -> tuple[dict[str, Any], list[Operation]]:
    """Decode the ndjson commit payload; inline file contents go to the blob store right away."""
    header: dict[str, Any] = {}
    operations: list[Operation] = []
    for number, line in enumerate(body.splitlines(), 1):
        if not line.strip():
            continue
        item = parse_json(line, f"Commit payload line {number}")
        if not isinstance(item, dict) or not isinstance(item.get("value"), dict):
            raise HubAPIError(400, f'Malformed commit payload line {number}: expected {{"key": ..., "value": {{...}}}}')
        if item.get("key") == "header":
            header = item["value"]
        else:
            operations.append(parse_operation(store, item.get("key"), item["value"]))
    if not field_of(header, "summary", str):
        raise HubAPIError(400, "A commit needs a summary (the commit message)")
    return header, operations


def parse_operation(store: LocalHubStore, key: Any, value: dict[str, Any]) -> Operation:
    """One operation of a commit payload, its fields checked before anything is stored."""
    path = required_field(value, "path", str)
    if key == "file":
        validate_path(path)
        content = field_of(value, "content", str, "")
        try:
            data = base64.b64decode(content, validate=True) if value.get("encoding") == "base64" else content.encode()
        except binascii.Error as e:
            raise HubAPIError(400, f"Invalid content for '{path}': {e}") from e
        store.blobs.put(data)
        return AddFile(path, Entry.regular(data))
    if key == "lfsFile":
        oid = field_of(value, "oid", str, "")
        if field_of(value, "algo", str, "sha256") != "sha256" or not SHA256_HEX.fullmatch(oid):
            raise HubAPIError(400, f"Invalid LFS oid for '{path}': expected a sha256")
        return AddLfs(validate_path(path), oid, field_of(value, "size", int))
    if key in ("deletedFile", "deletedFolder"):
        return Delete(path, folder=key == "deletedFolder")
    raise HubAPIError(400, f"Unsupported commit operation '{key}'")
