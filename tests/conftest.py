"""Fixtures shared by the hub-level tests: one real hub and one real Docker engine per test run."""

from __future__ import annotations

import secrets

import pytest
import yaml

from image_catalog.catalog import DEFAULT_CATALOG_PATH

from .harness import docker_client, running_hub

MISSING_IMAGE = "fgpu-test/never-built:1"


@pytest.fixture(scope="session")
def docker_engine():
    return docker_client()


@pytest.fixture(scope="session")
def broken_image(docker_engine):
    """An image whose server exits at once with code 3, to test the early-exit error."""
    base = "fgpu/jupyter-base:py3.11"
    # A tag of this run's own, so that test runs sharing the engine never remove each other's.
    tag = secrets.token_hex(4)
    container = docker_engine.containers.create(base, command=["true"])
    try:
        container.commit(
            repository="fgpu-test/exits-early",
            tag=tag,
            changes=['CMD ["sh", "-c", "echo boom: no server here; exit 3"]'],
        )
    finally:
        container.remove()
    yield f"fgpu-test/exits-early:{tag}"
    docker_engine.images.remove(f"fgpu-test/exits-early:{tag}", force=True)


@pytest.fixture(scope="session")
def test_catalog(tmp_path_factory, broken_image):
    """The shipped catalog plus an image that exits early and one that was never built."""
    path = tmp_path_factory.mktemp("catalog") / "catalog.yaml"
    catalog = yaml.safe_load(DEFAULT_CATALOG_PATH.read_text())
    catalog["images"] += [
        {"name": "exits-early", "image": broken_image},
        {"name": "never-built", "image": MISSING_IMAGE},
    ]
    path.write_text(yaml.safe_dump(catalog))
    return path


@pytest.fixture(scope="session")
def hub(tmp_path_factory, docker_engine, test_catalog):
    extra = f"c.FGPUSpawner.catalog_path = {str(test_catalog)!r}\n"
    with running_hub(tmp_path_factory.mktemp("hub"), extra_config=extra) as running:
        yield running


@pytest.fixture
def username():
    return f"student-{secrets.token_hex(4)}"
