"""JSON text that must hold an object (a credentials file, the settings the hub hands over)."""

from __future__ import annotations

import json


def json_object(text: str, source: str, error: type[Exception], holding: str = "") -> dict:
    """The object `text` holds; `error` naming `source` when it is not JSON or not an object
    (`holding` says what the object should have)."""
    try:
        found = json.loads(text)
    except ValueError as e:
        raise error(f"{source} is not JSON: {e}") from None
    if not isinstance(found, dict):
        raise error(f"{source} holds no JSON object {holding}".rstrip())
    return found
