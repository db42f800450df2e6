"""Fixtures shared by the hub-level tests: one real hub and one real Docker engine per test run."""

from __future__ import annotations

import json
import os
import secrets

import pytest
import yaml
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from image_catalog.catalog import DEFAULT_CATALOG_PATH

# The browser fixtures serve every module that drives Chromium.
from .browser import browser, pages  # noqa: F401
from .harness import ROOT, docker_client, running_hub

# A hub's two databases on SQLite and PostgreSQL, for the backup and restore tests.
from .hub_state import hub_dbs, private_image  # noqa: F401

# One Swarm lab serves every module that needs it.
from .swarm_lab import lab  # noqa: F401

MISSING_IMAGE = "fgpu-test/never-built:1"

#: The PostgreSQL server the queue tests also run against; scripts/up --setup-only starts it.
POSTGRES_URL_ENV = "FGPU_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://fgpu:fgpu@127.0.0.1:5432/fgpu_test"


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
    # The queue service seeds its image catalog from this file, and the spawner asks the service.
    env = {"FGPU_CATALOG_PATH": str(test_catalog)}
    group_data = tmp_path_factory.mktemp("group-data")
    extra = f"c.FGPUSpawner.group_data_dir = {str(group_data)!r}\n"
    with running_hub(tmp_path_factory.mktemp("hub"), env=env, extra_config=extra) as running:
        yield running


#: The grouped hub's resource groups besides the engine's own `default` (1 simulated 8 GiB GPU):
#: {group: {node: simulated GPUs}}. Its users may use `default` and `gpu-a100`, not `restricted`.
SIBLING_GROUPS = {"gpu-a100": {"a100-1": "2x40GiB"}, "restricted": {"vip-1": "1x8GiB"}}
GROUPED_USER_QUOTA = {"resource_groups": ["default", "gpu-a100"]}


@pytest.fixture(scope="session")
def grouped_hub(tmp_path_factory, docker_engine):
    """A hub whose queue service has three resource groups on this one host (tests/grouped_service.py):
    the engine's node, and sibling nodes that, as in the Swarm lab, see the whole machine."""
    env = {
        "FGPU_SIMULATED_GPUS": "1x8GiB",
        "FGPU_UNITS_PER_GPU": "2",
        "FGPU_USER_QUOTA": json.dumps(GROUPED_USER_QUOTA),
    }
    script = str(ROOT / "tests" / "grouped_service.py")
    siblings = f"--GroupedQueueService.siblings={json.dumps(SIBLING_GROUPS)}"
    extra = f"""
for service in c.JupyterHub.services:
    if service["name"] == "queue":
        service["command"][1:3] = [{script!r}, {siblings!r}]
"""
    with running_hub(tmp_path_factory.mktemp("grouped-hub"), env=env, extra_config=extra) as hub:
        yield hub


@pytest.fixture(autouse=True)
def servers_end_with_their_test(request):
    """Whatever a test started on the shared hub is stopped when it ends, even when it failed
    half-way: a server left behind holds CPU, and every later test would wait in the queue behind
    it. Servers of wider-scoped fixtures were there before, and are left to them."""
    if "hub" not in request.fixturenames:
        yield
        return
    hub = request.getfixturevalue("hub")
    before = hub.active_servers()
    yield
    hub.stop_servers(hub.active_servers() - before)


@pytest.fixture
def username():
    return f"student-{secrets.token_hex(4)}"


@pytest.fixture(scope="session")
def postgres_admin():
    """An AUTOCOMMIT engine on the test server's maintenance database, or a failure (never a skip)
    that says how to start the server. Its role needs CREATEDB: each test gets its own database."""
    url = make_url(os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL))
    engine = create_engine(url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    problem = None
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except OperationalError as e:
        problem = str(e.orig).strip()
    if problem is not None:
        engine.dispose()
        pytest.fail(
            f"No PostgreSQL answers at {url} ({problem}). Run scripts/up --setup-only, which "
            f"starts it and creates the test role and database, or point {POSTGRES_URL_ENV} at "
            "a server where the role may CREATE DATABASE.",
            pytrace=False,
        )
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A SQLAlchemy URL of an empty database: a SQLite file in tmp_path, or a PostgreSQL database
    created for this test alone (dropped afterwards, even with connections left open)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'queue.sqlite'}"
        return
    admin = request.getfixturevalue("postgres_admin")
    name = f"fgpu_t_{secrets.token_hex(6)}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin.url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
