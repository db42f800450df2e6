"""An image's trial run on the engine, before it enters the catalog (the domain's side, with the
catalog's messages, is queue_service/image_check.py).

A short container runs `jupyterhub-singleuser --version` through the image's own entrypoint, as a
session would (without network, in a small slice), and confined as a session is (the spawner's
`hardening`: no capabilities, `no-new-privileges`): the image is an instructor's, and its
entrypoint runs before anyone has looked at it. Blocking docker-py calls; the API runs them in
a thread. The check container carries `fgpu.image-check` and is always removed.
"""

from __future__ import annotations

from dataclasses import dataclass

import docker
import docker.errors
import requests

from image_catalog.container_hardening import hardening

CHECK_LABEL = "fgpu.image-check"
CHECK_COMMAND = ["jupyterhub-singleuser", "--version"]
_OUTPUT_TAIL = 400


@dataclass(frozen=True)
class SingleuserRun:
    """How the trial went: `problem` says why the server cannot start (None when it exited 0),
    `output` the end of what it printed."""

    problem: str | None
    output: str = ""


def run_singleuser(
    client: docker.DockerClient, reference: str, timeout: float = 60, run_as: str = "1000:100"
) -> SingleuserRun:
    """Run the image's single-user server with --version; fine when it exits 0."""
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
        return SingleuserRun(f"jupyterhub-singleuser did not finish within {timeout:g} s")
    except docker.errors.APIError as e:
        return SingleuserRun(f"the container could not start: {e.explanation or e}")
    finally:
        if container is not None:
            container.remove(force=True)
    if exit_code != 0:
        return SingleuserRun(
            f"`{' '.join(CHECK_COMMAND)}` exited with code {exit_code}"
            + (f": {output}" if output else ""),
            output,
        )
    return SingleuserRun(None, output)
