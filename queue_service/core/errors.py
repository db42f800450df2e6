"""Refusals: what the service's domain raises when it will not do what was asked.

The domain says *why* (a `cause`) and *what to tell the person* (a message); it never picks an HTTP
status. The handler layer turns a cause into a status in one table (`handlers/base.py`), so a rule
such as "a quota refusal is a 403" lives in one place, and no handler guesses a status from the
wording of a message.
"""

from __future__ import annotations

from typing import Literal

#: Why a request was refused:
#: - `invalid`: the request itself is wrong (a malformed body, an unknown image or group);
#: - `capacity`: it can never fit on any node it may use;
#: - `forbidden`: the caller may not do this;
#: - `quota`: a quota refuses it (now, or ever);
#: - `full`: a storage quota leaves no room for what would be written (HTTP's 507);
#: - `not_found`: what it names does not exist (or is not the caller's to see);
#: - `conflict`: the state it needs is not there (a session not running, a name taken);
#: - `engine`: the Docker engine failed to do its part;
#: - `unavailable`: a part the service needs (the engine) is away; try again later.
Cause = Literal[
    "invalid",
    "capacity",
    "forbidden",
    "quota",
    "full",
    "not_found",
    "conflict",
    "engine",
    "unavailable",
]


class Refusal(Exception):
    """A request the domain refuses: `message` is for people, `cause` for the handler layer."""

    def __init__(self, message: str, cause: Cause = "invalid"):
        super().__init__(message)
        self.message = message
        self.cause = cause
