"""A grant request as the spawner (or a launch) sends it to the queue, read into a record's
fields: the spawner has validated the options (image_catalog/launch_options.py); this only guards
the record's types, and refuses a malformed request with `Refused`, which never waits.
"""

from __future__ import annotations

import re

from image_catalog.job_options import parse_job
from queue_service.core.errors import Refusal

#: A request's key: a uuid4's 32 hex digits.
KEY_RE = re.compile(r"[0-9a-f]{32}")


class Refused(Refusal):
    """A request that must not wait: it can never fit, or it breaks a quota outright."""


def parse_key(data: dict) -> str | None:
    """The request key the spawner chose (32 hex digits, a uuid4's), or None for none given."""
    key = data.get("id")
    if key is None:
        return None
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise Refused("Malformed grant request: the key must be 32 hex digits.")
    return key


def parse_request(data: dict) -> dict:
    """The spawner has validated the options; this only guards the record's types."""
    try:
        return {
            "user": str(data["user"]),
            "account": _account(data.get("account")),
            "server_name": str(data.get("server_name") or ""),
            "image": str(data["image"]),
            "cpu": float(data["cpu"]),
            "mem": int(data["mem"]),
            "fgpu": float(data.get("fgpu") or 0),
            "resource_group": data.get("resource_group") or None,
            "job_json": _job(data.get("job")),
        }
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise Refused(f"Malformed grant request: {e}") from None


def _job(text) -> str | None:
    """A job's JSON as the spawner or a launch checked it (job_options.check_job): stored as it
    comes, so that the record and the spawn's request compare equal."""
    if text is None:
        return None
    if not isinstance(text, str) or not isinstance(parse_job(text), dict):
        raise ValueError("job must be a batch job's JSON object")
    return text


def _account(value) -> str:
    """The hub account's key (accounts.py) a request names; '' when it names none."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or not _ACCOUNT_KEY.fullmatch(value):
        raise Refused(f"Malformed grant request: account must be an account key, not {value!r}")
    return value


_ACCOUNT_KEY = re.compile(r"\d{8}T\d{12}Z")
