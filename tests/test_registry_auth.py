"""fgpu_shared/registry_auth.py: the registry's credentials file, as the hub's side reads it."""

from __future__ import annotations

import base64
import json

import pytest

from fgpu_shared.registry_auth import (
    RegistryAuthError,
    basic_authorization,
    parse_registry_auth,
    read_registry_auth,
)
from node_agent import agent

CREDENTIALS = {"username": "fgpu-nodes", "password": "s3cret:x", "serveraddress": "r.example:5000"}


def test_the_credentials_are_the_three_fields_of_docker_s_registry_auth():
    text = json.dumps({**CREDENTIALS, "comment": "ignored"})
    assert parse_registry_auth(text) == CREDENTIALS
    # The node agent reads the same file into the header it pushes with.
    header = json.loads(base64.urlsafe_b64decode(agent.registry_auth_header(text)))
    assert header == CREDENTIALS
    for bad, why in [
        ("{", "is not JSON"),
        ('"x"', "holds no JSON object"),
        ('{"username": "u", "password": 3}', "lacks password, serveraddress"),
    ]:
        with pytest.raises(RegistryAuthError, match=why):
            parse_registry_auth(bad, "the file")


def test_basic_authorization_encodes_user_and_password():
    value = basic_authorization(CREDENTIALS)
    assert value.startswith("Basic ")
    assert base64.b64decode(value.removeprefix("Basic ")) == b"fgpu-nodes:s3cret:x"


def test_a_missing_or_world_readable_file_is_refused_by_name(tmp_path):
    path = tmp_path / "auth.json"
    with pytest.raises(RegistryAuthError, match=f"{path}: No such file"):
        read_registry_auth(path)
    path.write_text(json.dumps(CREDENTIALS))
    path.chmod(0o644)
    with pytest.raises(RegistryAuthError, match="readable by every user .mode 0644.: chmod 0600"):
        read_registry_auth(path)
    path.chmod(0o600)
    assert read_registry_auth(path) == CREDENTIALS
    with pytest.raises(RegistryAuthError, match="not a regular file"):
        read_registry_auth(tmp_path)
