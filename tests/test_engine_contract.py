"""The engine backend contract (queue_service/engine/backend.py; docs/source/reference/engines.md),
held by each backend against its real engine: the one Docker engine of this machine, the run's
Swarm lab, and the docs' skeleton backend (docs/source/reference/skeleton_engine.py).

What the queue service asks of any backend: its nodes and a line naming them; the sessions that
run, as the reconciler lists them; the usage, exit, log and removal of a session or job it does
not know (None and nothing, never an error); the images sessions can run; its settings, by its
own section of the hub's config; and the parts it has or has not (a freeze watch, an in-session
notifier, the node agents' reports) in the kinds the service takes."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
from pathlib import Path

import pytest
from traitlets.config import Config

from fgpu_shared.registry_auth import read_registry_auth
from queue_service.app import QueueService
from queue_service.engine.backend import EngineBackend, NodeReading
from queue_service.engine.frozen_containers import FreezeWatch

from .harness import docker_client, engine_backend
from .swarm_lab import engine_client

pytestmark = [pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[1]
UNKNOWN = "no-such-session"
IMAGE = "fgpu/jupyter-base:py3.11"


def skeleton_class() -> type:
    path = ROOT / "docs" / "source" / "reference" / "skeleton_engine.py"
    spec = importlib.util.spec_from_file_location("skeleton_engine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SkeletonEngine


@pytest.fixture(params=["docker", "swarm", "skeleton"])
def made(request, tmp_path, monkeypatch):
    """(the service, its backend), made as the service makes it, from `engine_class`."""
    monkeypatch.chdir(tmp_path)
    name = request.param
    engine_class = skeleton_class() if name == "skeleton" else name
    config, client, auth = Config(), None, None
    if name == "docker":
        client = docker_client()
    elif name == "swarm":  # the lab's registry, as the shipped config sets it from the lab's
        env = request.getfixturevalue("lab").env
        config.SwarmEngine.node_agent_registry = env["FGPU_SWARM_REGISTRY"]
        config.SwarmEngine.registry_ca = env.get("FGPU_SWARM_REGISTRY_CA", "")
        client = engine_client(env)
        auth = read_registry_auth(env["FGPU_SWARM_REGISTRY_AUTH_FILE"])
    service = QueueService(engine_class=engine_class, config=config)
    service.init_engine()
    backend = engine_backend(service.engine_class, client, registry_auth=auth, parent=service)
    return service, backend


def test_the_nodes_are_read_and_named(made):
    _, backend = made
    reading = asyncio.run(backend.read_nodes())
    assert isinstance(reading, NodeReading) and reading.nodes
    for node in reading.nodes:
        assert node.name and node.cpu > 0 and node.mem > 0, node
        assert node.name in backend.describe(reading.nodes)
    assert isinstance(backend.nodes_change, bool)


def test_what_runs_is_listed_and_a_session_it_does_not_know_is_none_everywhere(made):
    _, backend = made
    lister = backend.session_lister()
    running = lister()
    assert isinstance(running, dict) and UNKNOWN not in running
    why = lister.why_gone(UNKNOWN)
    assert why is None or isinstance(why, str)
    lister.remove_gone([])
    assert backend.usage_of(UNKNOWN) is None
    assert backend.job_exit(UNKNOWN) is None
    assert backend.job_log(UNKNOWN, 10) is None
    assert backend.follow_job_log(UNKNOWN, 10) is None
    backend.remove_job(UNKNOWN)  # nothing to remove: no error
    assert backend.exited_jobs("contract-test") == []


def test_the_images_sessions_can_run_are_listed_where_they_can_be(made):
    _, backend = made
    if not backend.images_listable:  # then the service offers the whole catalog, asking nothing
        return
    # The image, as sessions here name it: the setup built it on this engine, and the lab pushed
    # it to its registry.
    registry = backend.commit_registry
    image = f"{registry}/{IMAGE}" if registry else IMAGE
    found = backend.runnable_images([image])
    assert image in found, found
    assert all(v is None or v.startswith("sha256:") for v in found.values()), found


def test_its_parts_are_of_the_kinds_the_service_takes(made):
    service, backend = made
    freeze = backend.freeze_watch()
    assert freeze is None or isinstance(freeze, FreezeWatch)
    reported = backend.reported_nodes()
    assert reported is None or isinstance(reported(), list)
    assert isinstance(backend.commit_registry, str)
    assert isinstance(backend.gpus_simulated, bool) and isinstance(backend.builds_images, bool)
    # The catalog's images on the nodes: a report of a node it does not know orders nothing.
    assert backend.note_report("node-unknown") is None
    assert isinstance(backend.image_holders(), dict)
    on_nodes = backend.images_on_nodes()
    assert on_nodes is None or all(isinstance(view, dict) for view in on_nodes)

    class Ends:
        async def watch(self):
            pass

        async def look(self):
            pass

    watching = backend.watch_job_exits(Ends())
    assert inspect.isawaitable(watching)
    asyncio.run(watching)
    if backend.reported_nodes() is None:  # no agents here: rotating a node's key is refused
        with pytest.raises(Exception, match="No node agents"):
            asyncio.run(backend.rotate_node_key("node-1"))


def test_its_settings_come_from_its_own_section_and_are_shown(made):
    service, backend = made
    name = type(backend).__name__
    settings = service.engine_settings_in_effect()
    assert settings["class"] == name
    assert "reserve_cpu" in settings["settings"]
    configured = QueueService(
        engine_class=type(backend), config=Config({name: {"reserve_cpu": 1.5}})
    )
    configured.init_engine()
    assert configured.engine_backend.reserve_cpu == 1.5
    assert configured.engine_settings_in_effect()["settings"]["reserve_cpu"] == 1.5


def test_a_class_that_is_no_backend_is_refused_by_name():
    with pytest.raises(Exception, match="EngineBackend"):
        QueueService(engine_class="queue_service.app.QueueService")
    assert issubclass(skeleton_class(), EngineBackend)
