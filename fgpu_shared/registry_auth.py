"""The credentials of the site's registry, for the hub's side: the spawner, the queue service, tests.

In Swarm mode the nodes pull session images from the site's registry, which wants a login for every
pull and push (docs/source/howto/adding-nodes.md, "The registry"). Its credentials live in one
file, readable by the hub's user only:

    {"username": "fgpu-nodes", "password": "...", "serveraddress": "registry.example.org:5000"}

the fields of Docker's `X-Registry-Auth`, so that the node agent (node_agent/agent.py, which reads
the same file with the standard library only) sends it as it is. The hub hands them to the Swarm
with each service it creates (docker-py sends `X-Registry-Auth` on `services.create` once its
client has logged in), and the queue service asks the registry with them (registry_images.py).
Sessions never get them.

`parse_registry_auth` and `basic_authorization` are pure; `read_registry_auth` reads and checks the
file; `log_in` logs a docker-py client in.
"""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

from fgpu_shared.json_text import json_object

FIELDS = ("username", "password", "serveraddress")


class RegistryAuthError(ValueError):
    """The credentials file is missing, readable by everyone, or not what it should hold."""


def parse_registry_auth(text: str, source: str = "the registry credentials") -> dict[str, str]:
    """The credentials in a file's text: a JSON object with a non-empty string for each field."""
    found = json_object(text, source, RegistryAuthError, f"with {', '.join(FIELDS)}")
    missing = [f for f in FIELDS if not isinstance(found.get(f), str) or not found[f]]
    if missing:
        raise RegistryAuthError(f"{source} lacks {', '.join(missing)} (a JSON string each)")
    return {field: found[field] for field in FIELDS}


def read_registry_auth(path: str | os.PathLike) -> dict[str, str]:
    """The credentials in the file at `path`, which must be a regular file that other users
    cannot read (it opens the registry every node pulls from)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise RegistryAuthError(f"registry credentials file {path}: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise RegistryAuthError(f"registry credentials file {path} is not a regular file")
    if mode & 0o007:
        raise RegistryAuthError(
            f"registry credentials file {path} is readable by every user "
            f"(mode {stat.S_IMODE(mode):04o}): chmod 0600 it"
        )
    return parse_registry_auth(path.read_text(), f"registry credentials file {path}")


def basic_authorization(auth: dict[str, str]) -> str:
    """The `Authorization` header value of HTTP basic auth with these credentials."""
    pair = f"{auth['username']}:{auth['password']}".encode()
    return "Basic " + base64.b64encode(pair).decode()


def log_in(api, auth: dict[str, str]) -> None:
    """Log a docker-py `APIClient` in to the registry: the engine checks the credentials once
    (`POST /auth`), and the client sends them with every later pull, push and service creation
    for that registry. Raises docker.errors.APIError when the registry refuses them."""
    api.login(username=auth["username"], password=auth["password"], registry=auth["serveraddress"])
