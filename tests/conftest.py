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

from .browser import browser, page, pages  # noqa: F401

# The browser fixtures serve every module that drives Chromium.
from .databases import drop_database
from .harness import ROOT, QueueUser, docker_client, queue_option, running_hub

# A hub's two databases on SQLite and PostgreSQL, for the backup and restore tests.
from .hub_state import hub_dbs, private_image  # noqa: F401
from .service_clock import ServiceClock
from .shared_hub import SharedHub

# One Swarm lab serves every module that needs it.
from .swarm_lab import lab  # noqa: F401

MISSING_IMAGE = "fgpu-test/never-built:1"

#: The PostgreSQL server the queue tests also run against; scripts/test --setup-only starts it
#: and makes its role (a test machine's alone: scripts/up does not).
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


def shared_hub(name: str, tmp_path_factory, **options):
    """A session-wide hub under `name`, replaced by a fresh one (in a new folder) when a test's
    servers will not stop (tests/shared_hub.py); closed at the end of the run."""
    hub = SharedHub(name, lambda: running_hub(tmp_path_factory.mktemp(name), **options))
    try:
        yield hub
    finally:
        hub.close()


@pytest.fixture(scope="session")
def hub(tmp_path_factory, docker_engine, test_catalog):
    # The queue service seeds its image catalog from this file, and the spawner asks the service.
    env = {"FGPU_CATALOG_PATH": str(test_catalog)}
    group_data = tmp_path_factory.mktemp("group-data")
    extra = f"c.FGPUSpawner.group_data_dir = {str(group_data)!r}\n" + FAST_THAW
    # Instructors' visits end within seconds of their session (test_course_page.py).
    extra += "c.QueueService.visit_check_interval = 3\n"
    yield from shared_hub("hub", tmp_path_factory, env=env, extra_config=extra)


#: A Prometheus scraper on the shared GPU hub, set up exactly as queue_service/core/metrics.py documents.
PROMETHEUS_TOKEN = secrets.token_hex(16)
PROMETHEUS_CONFIG = f"""
c.JupyterHub.services.append({{"name": "prometheus", "api_token": {PROMETHEUS_TOKEN!r}}})
c.JupyterHub.load_roles.append({{"name": "metrics", "services": ["prometheus"],
    "scopes": ["read:metrics", "access:services!service=queue"]}})
"""
# A spawn lost with a hub restart is issued again 15 s after none is seen waiting (the default's
# 120 s leaves room for a release delayed by a storm of stops, which no test makes there).
FAST_RESPAWN = queue_option("respawn_grace", 15)


# A frozen session container is thawed after 30 s, not a minute (test_frozen_containers: long
# enough for another spawn to start meanwhile).
FAST_THAW = queue_option("thaw_frozen_after", 30, "DockerEngine")


@pytest.fixture(scope="session")
def service_clock(tmp_path_factory):
    """The queue service's clock on `gpu_hub`, which a test may move (tests/service_clock.py)."""
    return ServiceClock(tmp_path_factory.mktemp("service-clock"))


@pytest.fixture(scope="session")
def gpu_hub(tmp_path_factory, docker_engine, service_clock):
    """One simulated 8 GiB GPU holding 2 fGPU, as in the seed's walk-through, with a Prometheus
    scraper and a queue service whose clock a test may move (`service_clock`): the hub of the
    modules whose tests need GPU slices (queue service, pages, usage, metrics). Each module finds
    it empty: what a module leaves running is stopped at its end
    (`shared_hubs_start_each_module_empty`)."""
    env = {"FGPU_SIMULATED_GPUS": "1x8GiB", "FGPU_UNITS_PER_GPU": "2"}
    extra = PROMETHEUS_CONFIG + FAST_RESPAWN + service_clock.config()
    for hub in shared_hub("gpu-hub", tmp_path_factory, env=env, extra_config=extra):
        hub.scraper_token = PROMETHEUS_TOKEN
        yield hub


@pytest.fixture(scope="session")
def one_gpu_hub(tmp_path_factory, docker_engine):
    """One simulated GPU holding 1 fGPU: a second request of 1 fGPU (or a third of 0.4) waits.
    Each module finds it empty, as `gpu_hub` does."""
    env = {"FGPU_SIMULATED_GPUS": "1x8GiB", "FGPU_UNITS_PER_GPU": "1"}
    yield from shared_hub("one-gpu-hub", tmp_path_factory, env=env)


#: The presets of `preset_hub`: one plain, one of a GPU slice, one above one session's 4 fGPU
#: (listed, unavailable, with the reason).
SITE_PRESETS = [
    {"name": "CPU small", "cpu": 0.5, "mem": "256M"},
    {"name": "half GPU", "cpu": 0.5, "mem": "512M", "fgpu": 1},
    {"name": "all GPUs", "cpu": 1, "mem": "1G", "fgpu": 8},
]


@pytest.fixture(scope="session")
def preset_hub(tmp_path_factory, docker_engine):
    """One simulated 8 GiB GPU of 2 fGPU and the site's presets (`SITE_PRESETS`): the hub of the
    presets and spawn-form modules. Their tests stop what they started."""
    env = {
        "FGPU_SIMULATED_GPUS": "1x8GiB",
        "FGPU_UNITS_PER_GPU": "2",
        "FGPU_PRESETS": json.dumps(SITE_PRESETS),
    }
    yield from shared_hub("preset-hub", tmp_path_factory, env=env)


@pytest.fixture
def jobs_student(gpu_hub):
    """A new user of `gpu_hub` for the batch-job modules; whatever they left is ended after."""
    person = QueueUser(gpu_hub, f"jobs-{secrets.token_hex(3)}")
    yield person
    for session in person.sessions():
        person.call("DELETE", f"sessions/{session['id']}")


@pytest.fixture
def preset_student(preset_hub):
    """A new user of `preset_hub`; whatever they started is stopped after the test."""
    person = QueueUser(preset_hub, f"stud-{secrets.token_hex(3)}")
    yield person
    preset_hub.stop_servers(
        {(person.name, s["server_name"]) for s in person.sessions()}, timeout=120
    )


#: Session hubs that modules share, each module's tests in turn (the `hub` fixture's servers are
#: stopped after each test instead, by `servers_end_with_their_test`).
MODULE_SHARED_HUBS = ("gpu_hub", "one_gpu_hub")


@pytest.fixture(scope="module", autouse=True)
def shared_hubs_start_each_module_empty(request):
    """A module's tests may hand servers on to one another (a walk-through in steps), as on a hub
    of the module's own; what is left when the module ends is stopped, so that the next module on
    the shared hub starts from an empty hub, as it would on its own."""
    items = [i for i in request.session.items if i.getparent(pytest.Module) is request.node]
    names = [n for n in MODULE_SHARED_HUBS if any(n in i.fixturenames for i in items)]
    hubs = [request.getfixturevalue(name) for name in names]
    before = [hub.active_servers() for hub in hubs]
    yield
    for hub, servers in zip(hubs, before, strict=True):
        hub.end_servers(hub.active_servers() - servers, f"the module {request.node.name}")


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
    hub.end_servers(hub.active_servers() - before, f"the test {request.node.name}")


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
            f"No PostgreSQL answers at {url} ({problem}). Run scripts/test --setup-only, which "
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
        drop_database(admin, name)
