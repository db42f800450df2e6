"""The node agent's deployment (queue_service/engine/node_agent_deploy.py): the pure service builder and
the token file. Deploying on a real Swarm, one service and key per node, is tried in
tests/test_node_agent_lab.py."""

from __future__ import annotations

import os
import stat

import pytest

from queue_service.engine.node_agent_deploy import (
    AGENT_SOURCE,
    agent_service_kwargs,
    content_name,
    node_agent_token,
    pinned_image,
    service_name,
)

NODE_ID = "x3q8k2m5n7p9r1t4v6w8y0z2a"


def build(**changes):
    args = {
        "name": "fgpu-node-agent",
        "image": "10.213.0.1:5000/fgpu/jupyter-base:py3.11",
        "config": ("cfg-id", "fgpu-node-agent-code-0123456789ab"),
        "secret": ("sec-id", "fgpu-node-agent-token-ba9876543210"),
        "key_secret": ("key-id", "fgpu-node-agent-key-x3q8k2m5n7p9-0123456789ab"),
        "node": (NODE_ID, "worker-2"),
        "report_url": "http://10.213.0.1:8000/services/queue/",
        "interval": 5.0,
        "deployment_id": "d1",
    }
    return agent_service_kwargs(**{**args, **changes})


def test_each_node_has_its_own_agent_service_pinned_to_its_node_id():
    kwargs = build()
    assert kwargs["mode"].mode == "replicated" and kwargs["mode"]["replicated"]["Replicas"] == 1
    assert kwargs["constraints"] == [f"node.id=={NODE_ID}"]
    assert (
        kwargs["name"] == service_name("fgpu-node-agent", NODE_ID) == "fgpu-node-agent-x3q8k2m5n7p9"
    )
    assert kwargs["labels"]["fgpu.node_id"] == NODE_ID
    assert kwargs["command"] == ["python3", "/fgpu/agent.py"]
    assert kwargs["restart_policy"]["Condition"] == "on-failure"
    assert kwargs["endpoint_spec"]["Mode"] == "dnsrr"  # no IPVS here: no VIP


def test_the_code_is_a_config_the_token_and_the_nodes_key_secrets_and_the_socket_a_bind():
    kwargs = build()
    (config,) = kwargs["configs"]
    assert (config["ConfigID"], config["ConfigName"]) == (
        "cfg-id",
        "fgpu-node-agent-code-0123456789ab",
    )
    assert config["File"]["Name"] == "/fgpu/agent.py"
    secret, key = kwargs["secrets"]
    assert secret["SecretName"] == "fgpu-node-agent-token-ba9876543210"
    assert secret["File"] == {
        "Name": "fgpu-node-agent-token",
        "UID": "0",
        "GID": "0",
        "Mode": 0o400,
    }
    assert key["SecretName"] == "fgpu-node-agent-key-x3q8k2m5n7p9-0123456789ab"
    assert key["File"] == {"Name": "fgpu-node-agent-key", "UID": "0", "GID": "0", "Mode": 0o400}
    (mount,) = kwargs["mounts"]
    assert (mount["Type"], mount["Source"], mount["Target"]) == (
        "bind",
        "/var/run/docker.sock",
        "/var/run/docker.sock",
    )
    # In the lab each node's engine has a socket of its own: Swarm fills the template per node.
    lab_socket = "/var/lib/fgpu-swarm-lab/lab/nodes/{{.Node.Hostname}}/docker.sock"
    (mount,) = build(docker_socket=lab_socket)["mounts"]
    assert (mount["Source"], mount["Target"]) == (lab_socket, "/var/run/docker.sock")
    env = dict(item.split("=", 1) for item in kwargs["env"])
    assert env["FGPU_AGENT_URL"] == "http://10.213.0.1:8000/services/queue/"
    assert env["FGPU_AGENT_INTERVAL"] == "5"
    assert env["FGPU_AGENT_TOKEN_FILE"] == "/run/secrets/fgpu-node-agent-token"
    assert env["FGPU_AGENT_KEY_FILE"] == "/run/secrets/fgpu-node-agent-key"
    assert (env["FGPU_NODE_ID"], env["FGPU_NODE_NAME"]) == (NODE_ID, "worker-2")
    assert env["FGPU_DEPLOYMENT"] == "d1"
    # Neither the token nor the key travels in the environment or on a command line.
    secret_words = ("token", "key")
    assert not [
        item
        for item in kwargs["env"]
        if any(word in item.lower() for word in secret_words) and "FILE" not in item
    ]


def test_the_agent_holds_no_capability_and_little_of_the_node():
    kwargs = build()
    assert kwargs["cap_drop"] == ["ALL"] and kwargs["read_only"] is True
    assert kwargs["resources"]["Limits"]["NanoCPUs"] <= 0.5e9
    assert kwargs["resources"]["Limits"]["MemoryBytes"] <= 256 << 20


def test_the_spec_digest_changes_with_what_the_agent_runs_and_only_then():
    digest = build()["labels"]["fgpu.agent_spec"]
    assert build()["labels"]["fgpu.agent_spec"] == digest
    for change in (
        {"config": ("cfg-2", "fgpu-node-agent-code-ffffffffffff")},
        {"secret": ("sec-2", "fgpu-node-agent-token-ffffffffffff")},
        {"key_secret": ("key-2", "fgpu-node-agent-key-x3q8k2m5n7p9-ffffffffffff")},
        {"interval": 2.0},
        {"image": "other:1"},
    ):
        assert build(**change)["labels"]["fgpu.agent_spec"] != digest, change


def test_config_and_secret_names_carry_their_contents_hash():
    code = AGENT_SOURCE.read_bytes()
    assert content_name("fgpu-node-agent-code", code) == content_name("fgpu-node-agent-code", code)
    assert content_name("x", b"a") != content_name("x", b"b")
    assert len(content_name("fgpu-node-agent-code", code)) <= 64  # Swarm's limit on names


def test_the_token_is_made_once_private_and_kept(tmp_path):
    path = tmp_path / "fgpu_node_agent_token"
    token = node_agent_token(path)
    assert len(token) == 64 and node_agent_token(path) == token
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    os.chmod(path, 0o644)
    with pytest.raises(SystemExit, match="readable by others"):
        node_agent_token(path)
    os.chmod(path, 0o600)
    path.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        node_agent_token(path)


def test_the_agent_runs_from_the_digest_the_hub_pinned_not_from_a_tag():
    digest = "sha256:" + "a" * 64
    pins = {"fgpu/jupyter-base:py3.11": digest}
    registry = "10.213.0.1:5000"
    assert (
        pinned_image(f"{registry}/fgpu/jupyter-base:py3.11", registry, pins)
        == f"{registry}/fgpu/jupyter-base@{digest}"
    )
    assert pinned_image("fgpu/jupyter-base:py3.11", registry, pins) == f"fgpu/jupyter-base@{digest}"
    # Nothing pinned yet (a registry not asked yet, or another image): the reference as given.
    assert pinned_image(f"{registry}/other:1", registry, pins) == f"{registry}/other:1"
    assert pinned_image("fgpu/jupyter-base:py3.11", "", {}) == "fgpu/jupyter-base:py3.11"


def test_the_registry_credentials_are_a_secret_of_their_own_named_in_the_environment():
    kwargs = build(registry_secret=("reg-id", "fgpu-node-agent-registry-0123456789ab"))
    token, key, registry = kwargs["secrets"]
    assert registry["SecretName"] == "fgpu-node-agent-registry-0123456789ab"
    assert registry["File"] == {"Name": "fgpu-registry-auth", "UID": "0", "GID": "0", "Mode": 0o400}
    env = dict(item.split("=", 1) for item in kwargs["env"])
    assert env["FGPU_AGENT_REGISTRY_AUTH_FILE"] == "/run/secrets/fgpu-registry-auth"
    assert kwargs["labels"]["fgpu.agent_spec"] != build()["labels"]["fgpu.agent_spec"]
    # Without a registry that asks for them, the agent has none and is told of none.
    assert len(build()["secrets"]) == 2
    assert "FGPU_AGENT_REGISTRY_AUTH_FILE" not in "".join(build()["env"])
