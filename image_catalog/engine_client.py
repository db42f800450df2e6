"""Docker clients made from the environment (DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH)
that verify a TLS engine against its own CA.

docker-py hands TLS to `requests`, whose sessions trust the environment by default: where
`REQUESTS_CA_BUNDLE` is set (it is on these machines, to the system bundle), requests verifies every
engine against that bundle instead of the CA in DOCKER_CERT_PATH, and a Swarm manager reached over
TLS (a site's, or `scripts/swarm-lab`'s) fails with CERTIFICATE_VERIFY_FAILED. `EngineAPIClient`
keeps the engine's own CA. The version is still negotiated ("auto"): never forced higher than the
engine speaks (docs/source/explanation/architecture.md, "The machines it is built on").

One module serves the spawner, the queue service and the image builder, each of which only reads
the environment it is given.
"""

from __future__ import annotations

import docker


class EngineAPIClient(docker.APIClient):
    """A `docker.APIClient` whose TLS verification is the engine's CA, whatever the environment."""

    def merge_environment_settings(self, url, proxies, stream, verify, cert):
        settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
        # A path: the CA docker-py's TLSConfig set from DOCKER_CERT_PATH (True: no CA given).
        if isinstance(self.verify, str):
            settings["verify"] = self.verify
        return settings


def api_client_from_env(timeout: int = 60, **kwargs) -> EngineAPIClient:
    """The low-level client of the engine the environment names (the local socket by default)."""
    return EngineAPIClient(
        **{"version": "auto", "timeout": timeout, **docker.utils.kwargs_from_env(), **kwargs}
    )


def docker_client_from_env(timeout: int = 60) -> docker.DockerClient:
    """`docker.from_env()`, with `EngineAPIClient` underneath."""
    client = docker.DockerClient.__new__(docker.DockerClient)
    client.api = api_client_from_env(timeout=timeout)
    return client
