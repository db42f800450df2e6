"""The image check (queue_service/image_check.py; its container: engine/image_check.py) runs an
instructor's image before anyone has looked at it: its entrypoint must meet the sessions'
confinement, on the real engine. The image here reports its own capability bounding set and
`no_new_privs` flag, then starts the server."""

from __future__ import annotations

import json
import secrets

import pytest

from queue_service.image_check import check_singleuser

pytestmark = pytest.mark.docker

BASE = "fgpu/jupyter-base:py3.11"
REPORT_THEN_RUN = (
    'grep -E "^(CapBnd|CapEff|NoNewPrivs):" /proc/self/status; exec "$@"'  # the check's command
)


@pytest.fixture(scope="module")
def self_reporting_image(docker_engine):
    tag = secrets.token_hex(4)
    container = docker_engine.containers.create(BASE, command=["true"])
    try:
        container.commit(
            "fgpu-test/reports-privileges",
            tag,
            changes=["ENTRYPOINT " + json.dumps(["sh", "-c", REPORT_THEN_RUN, "--"])],
        )
    finally:
        container.remove()
    yield f"fgpu-test/reports-privileges:{tag}"
    docker_engine.images.remove(f"fgpu-test/reports-privileges:{tag}", force=True)


def test_the_image_check_runs_without_capabilities_and_with_no_new_privileges(
    docker_engine, self_reporting_image
):
    result = check_singleuser(docker_engine, self_reporting_image)
    assert result.ok, result.message
    assert "CapBnd:\t0000000000000000" in result.message, result.message
    assert "CapEff:\t0000000000000000" in result.message, result.message
    assert "NoNewPrivs:\t1" in result.message, result.message
