"""JupyterHub group properties as the hub's admin panel leaves them.

The admin panel edits a group's properties as key/value text boxes, so a quota typed there,
`{"fgpu": 2, "sessions": 4}`, is stored as a string, where the REST API and `jupyterhub_config.py`
store the object itself. Both mean the same: a value that is the JSON text of an object or a list
is read as that object. Other strings (`"8h"`) stay strings, and text that is not valid JSON stays
the text it is, for the reader to refuse with the group and the property named.
"""

from __future__ import annotations

import json


def decoded(properties: dict | None) -> dict:
    """A group's `properties`, with object and list values typed as JSON text read as such."""
    return {key: _decoded(value) for key, value in (properties or {}).items()}


def _decoded(value: object) -> object:
    if not isinstance(value, str) or not value.strip().startswith(("{", "[")):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value
