"""The Docker engine, reached on first use rather than at start.

`docker.from_env()` asks the engine for its API version at once, so a service that made its client
at start could not start while the engine is down. `Engine` stands in for a `DockerClient`: it
connects when first used, and tries again on the next use while the engine does not answer. Once
connected, docker-py opens a connection per request, so an engine that restarts is found again.
"""

from __future__ import annotations

import threading

import docker

from fgpu_shared.engine_client import docker_client_from_env


class Engine:
    """A `docker.DockerClient` made from the environment (DOCKER_HOST...) when first needed."""

    def __init__(self, timeout: int = 30):
        self.timeout = timeout
        self._client: docker.DockerClient | None = None
        self._lock = threading.Lock()

    def connect(self) -> docker.DockerClient:
        """The client; raises docker.errors.DockerException while the engine does not answer."""
        with self._lock:
            if self._client is None:
                self._client = docker_client_from_env(timeout=self.timeout)
            return self._client

    def __getattr__(self, name: str):
        # Only reached for what Engine itself lacks: `containers`, `images`, `api`, `info`...
        return getattr(self.connect(), name)
