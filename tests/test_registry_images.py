"""queue_service/engine/registry_images.py against a real registry (Debian's docker-registry, as the Swarm
lab runs it) into which the real engine pushes: what Swarm mode offers is what the registry holds."""

from __future__ import annotations

import io
import subprocess
import tarfile
import time
import urllib.request

import pytest
from tornado.testing import bind_unused_port

from queue_service.engine.registry_images import (
    RegistryUnreachable,
    bearer_challenge,
    manifest_path,
    pinned_reference,
    registry_digests,
    schemes_for,
    split_reference,
    token_url,
)


def test_the_manifest_path_of_a_reference():
    assert manifest_path("fgpu/jupyter-base:py3.11") == "/v2/fgpu/jupyter-base/manifests/py3.11"
    assert manifest_path("fgpu/tool") == "/v2/fgpu/tool/manifests/latest"
    assert manifest_path("fgpu/x@sha256:ab") == "/v2/fgpu/x/manifests/sha256:ab"


@pytest.fixture
def registry(tmp_path):
    sock, port = bind_unused_port()
    sock.close()
    address = f"127.0.0.1:{port}"
    config = tmp_path / "registry.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {tmp_path / 'data'}\nhttp:\n  addr: {address}\n"
    )
    process = subprocess.Popen(["docker-registry", "serve", str(config)])
    try:
        wait_until_answering(address)
        yield address
    finally:
        process.terminate()
        process.wait(10)


def wait_until_answering(address: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"http://{address}/v2/", timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.docker
def test_only_the_images_the_registry_holds_are_found(registry, docker_engine):
    pushed = f"{registry}/fgpu/tiny-check:1"
    image = tiny_image(docker_engine, pushed)
    try:
        for line in docker_engine.api.push(pushed, stream=True, decode=True):
            assert "error" not in line, line
        found = registry_digests(
            registry, {"fgpu/tiny-check:1", "fgpu/tiny-check:2", "fgpu/absent:1", pushed}
        )
        # The catalog's name, and a private image's name that starts with the registry's address,
        # each with the digest the engine recorded for its push.
        (digest,) = {d.split("@")[1] for d in docker_engine.images.get(pushed).attrs["RepoDigests"]}
        assert found == {"fgpu/tiny-check:1": digest, pushed: digest}
    finally:
        docker_engine.images.remove(image, force=True)


def test_a_registry_that_does_not_answer_is_named(registry):
    _, port = registry.rsplit(":", 1)
    away = f"127.0.0.1:{int(port) + 1 if int(port) < 65535 else 1}"
    with pytest.raises(RegistryUnreachable, match=f"registry {away} did not answer"):
        registry_digests(away, {"fgpu/jupyter-base:py3.11"})


def tiny_image(engine, reference: str) -> str:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    repository, tag = reference.rsplit(":", 1)
    engine.api.import_image_from_data(data.getvalue(), repository=repository, tag=tag)
    return engine.images.get(reference).id


def test_a_reference_splits_into_name_and_tag_or_digest():
    assert split_reference("10.0.0.1:5000/fgpu-private/jo:v1") == (
        "10.0.0.1:5000/fgpu-private/jo",
        "v1",
    )
    assert split_reference("localhost:5000/x") == ("localhost:5000/x", "latest")
    assert split_reference("fgpu/x@sha256:ab") == ("fgpu/x", "sha256:ab")


def test_a_pinned_image_starts_from_its_digest():
    assert (
        pinned_reference("fgpu/jupyter-base:py3.11", "sha256:ab") == "fgpu/jupyter-base@sha256:ab"
    )
    assert pinned_reference("10.0.0.1:5000/p/jo:v1", "sha256:cd") == "10.0.0.1:5000/p/jo@sha256:cd"
    assert pinned_reference("fgpu/jupyter-base:py3.11", None) == "fgpu/jupyter-base:py3.11"


def test_credentials_go_over_https_only_and_a_token_registrys_challenge_is_read():
    assert schemes_for(None) == ("https", "http")
    assert schemes_for({"username": "u", "password": "p", "serveraddress": "r"}) == ("https",)
    header = (
        'Bearer realm="https://harbor.example/service/token",service="harbor-registry",'
        'scope="repository:fgpu/jupyter-base:pull"'
    )
    challenge = bearer_challenge(header)
    assert challenge == {
        "realm": "https://harbor.example/service/token",
        "service": "harbor-registry",
        "scope": "repository:fgpu/jupyter-base:pull",
    }
    assert token_url(challenge) == (
        "https://harbor.example/service/token?service=harbor-registry"
        "&scope=repository%3Afgpu%2Fjupyter-base%3Apull"
    )
    assert bearer_challenge('Basic realm="fgpu-lab-registry"') is None
    assert token_url({"realm": "https://t.example/token"}) == "https://t.example/token"
