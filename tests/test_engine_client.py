"""`fgpu_shared.engine_client`: a TLS engine is verified against its own CA."""

import docker
import pytest

from fgpu_shared.engine_client import EngineAPIClient, api_client_from_env


@pytest.fixture
def tls_env(tmp_path, monkeypatch):
    """DOCKER_* naming a TLS engine with its CA, and REQUESTS_CA_BUNDLE naming another bundle,
    as on these machines."""
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("not read before a request\n")
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.213.0.10:2376")
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    monkeypatch.setenv("DOCKER_CERT_PATH", str(tmp_path))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    return tmp_path


def settings_of(client) -> dict:
    return client.merge_environment_settings(client.base_url, {}, None, None, None)


def test_the_engines_ca_wins_over_requests_ca_bundle(tls_env):
    client = api_client_from_env(version="1.41")
    assert isinstance(client, EngineAPIClient)
    assert client.base_url == "https://10.213.0.10:2376"
    assert settings_of(client)["verify"] == str(tls_env / "ca.pem")


def test_docker_pys_own_client_would_verify_against_the_bundle(tls_env):
    """The trap the module exists for: plain docker-py takes REQUESTS_CA_BUNDLE."""
    kwargs = docker.utils.kwargs_from_env()
    plain = docker.APIClient(**kwargs, version="1.41")
    assert settings_of(plain)["verify"] == "/etc/ssl/certs/ca-certificates.crt"


def test_without_tls_nothing_changes(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///var/run/docker.sock")
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    monkeypatch.delenv("DOCKER_CERT_PATH", raising=False)
    client = api_client_from_env(version="1.41")
    assert (
        settings_of(client)["verify"]
        == docker.APIClient(version="1.41").merge_environment_settings(
            client.base_url, {}, None, None, None
        )["verify"]
    )
