"""Checks an image before it enters the catalog: is it on the engine, and does it start a server?

A short container runs `jupyterhub-singleuser --version` through the image's own entrypoint, as a
session would (without network, in a small slice), and confined as a session is (the spawner's
`hardening`: no capabilities, `no-new-privileges`): the image is an instructor's, and its
entrypoint runs before anyone has looked at it. Blocking docker-py calls; the API runs them in
a thread. The check container carries `fgpu.image-check` and is always removed.
"""

from __future__ import annotations

import docker
import docker.errors
import requests

from image_catalog.container_hardening import hardening
from queue_service.store.images import CheckResult, ImageError
from queue_service.store.models import utcnow

CHECK_LABEL = "fgpu.image-check"
CHECK_COMMAND = ["jupyterhub-singleuser", "--version"]
_OUTPUT_TAIL = 400


def image_labels(client: docker.DockerClient, reference: str) -> dict[str, str]:
    """The image's labels; a clear 400 when the engine does not have it (there is no registry)."""
    try:
        image = client.images.get(reference)
    except docker.errors.ImageNotFound:
        raise ImageError(
            f"Image {reference} is not on this host's Docker engine. Build it first "
            "(python -m image_catalog build NAME), or load it with docker load.",
            "invalid",
        ) from None
    except docker.errors.APIError as e:
        raise ImageError(
            f"The Docker engine could not inspect {reference}: {e}", "engine"
        ) from None
    return image.labels or {}


def check_singleuser(
    client: docker.DockerClient, reference: str, timeout: float = 60, run_as: str = "1000:100"
) -> CheckResult:
    """Run the image's single-user server with --version; ok when it exits 0."""
    container = None
    try:
        container = client.containers.create(
            reference,
            command=CHECK_COMMAND,
            labels={CHECK_LABEL: reference},
            user=run_as,
            network_disabled=True,
            mem_limit="512m",
            pids_limit=256,
            **hardening({}),
        )
        container.start()
        exit_code = container.wait(timeout=timeout)["StatusCode"]
        output = container.logs().decode(errors="replace").strip()[-_OUTPUT_TAIL:]
    except requests.exceptions.RequestException:
        return _failed(f"jupyterhub-singleuser did not finish within {timeout:g} s")
    except docker.errors.APIError as e:
        return _failed(f"the container could not start: {e.explanation or e}")
    finally:
        if container is not None:
            container.remove(force=True)
    if exit_code != 0:
        return _failed(
            f"`{' '.join(CHECK_COMMAND)}` exited with code {exit_code}"
            + (f": {output}" if output else "")
        )
    return CheckResult(True, f"jupyterhub-singleuser {output}".strip(), utcnow())


def _failed(why: str) -> CheckResult:
    return CheckResult(False, f"It cannot start a single-user server: {why}.", utcnow())
