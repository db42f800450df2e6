"""Sessions cannot reach one another in the shipped Swarm configuration, whatever is left at its
default. A host-mode port is published on every address of its node, and
an overlay has no `icc` switch: only an overlay per session, joined by the hub's container, keeps
sessions apart; anything else starts only when the site says it accepts it. The lab test that
one session cannot reach another's server in that default is
tests/test_swarm_hub.py::test_the_hubs_proxy_reaches_sessions_on_other_nodes_over_their_own_overlays_and_they_not_each_other.
"""

import logging

import pytest
from jupyterhub.spawner import SpawnException

from fgpu_spawner.service_spec import reachable_sessions
from fgpu_spawner.swarm_spawner import FGPUSwarmSpawner

from .harness import engine_backend
from .test_jupyterhub_config import load_shipped_config, state_dir  # noqa: F401

SWARM = {"FGPU_ENGINE": "swarm", "FGPU_HUB_CONNECT_IP": "10.213.0.1"}
SWARM_VARIABLES = (
    "FGPU_SWARM_ENDPOINT",
    "FGPU_SWARM_HUB_CONTAINER",
    "FGPU_SWARM_NETWORK_PER_SESSION",
    "FGPU_SWARM_REACHABLE_SESSIONS",
)


@pytest.fixture
def swarm_env(monkeypatch):
    for name in SWARM_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in SWARM.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_only_an_overlay_per_session_keeps_sessions_apart():
    assert "node's address" in reachable_sessions("host_port", True)
    assert "one overlay" in reachable_sessions("overlay", False)
    assert "one overlay" in reachable_sessions("vip", False)
    assert reachable_sessions("overlay", True) == ""
    assert reachable_sessions("vip", True) == ""


def test_a_swarm_hub_beside_the_swarm_does_not_start_unless_the_site_accepts_reachable_sessions(
    swarm_env,
):
    with pytest.raises(SystemExit, match="sessions could reach one another.*host_port"):
        load_shipped_config()
    swarm_env.setenv("FGPU_SWARM_REACHABLE_SESSIONS", "1")
    config = load_shipped_config()
    assert config.FGPUSwarmSpawner.endpoint == "host_port"
    assert config.FGPUSwarmSpawner.allow_reachable_sessions is True


def test_a_hub_in_a_container_gets_an_overlay_per_session_without_asking(swarm_env):
    swarm_env.setenv("FGPU_SWARM_HUB_CONTAINER", "fgpu-hub")
    config = load_shipped_config()
    assert config.FGPUSwarmSpawner.endpoint == "overlay"
    assert config.FGPUSwarmSpawner.network_per_session is True
    assert config.FGPUSwarmSpawner.allow_reachable_sessions is False


@pytest.mark.parametrize(
    "settings",
    [
        {"FGPU_SWARM_HUB_CONTAINER": "fgpu-hub", "FGPU_SWARM_NETWORK_PER_SESSION": "0"},
        {"FGPU_SWARM_HUB_CONTAINER": "fgpu-hub", "FGPU_SWARM_ENDPOINT": "host_port"},
        {"FGPU_SWARM_ENDPOINT": "overlay"},  # no hub container: one overlay for all
    ],
)
def test_a_shared_network_needs_the_sites_word(swarm_env, settings):
    for name, value in settings.items():
        swarm_env.setenv(name, value)
    with pytest.raises(SystemExit, match="FGPU_SWARM_REACHABLE_SESSIONS=1"):
        load_shipped_config()


def test_an_unknown_endpoint_is_refused_by_name(swarm_env):
    swarm_env.setenv("FGPU_SWARM_ENDPOINT", "ingress")
    with pytest.raises(SystemExit, match="FGPU_SWARM_ENDPOINT must be host_port, overlay or vip"):
        load_shipped_config()


@pytest.mark.parametrize(
    "traits",
    [
        {},  # the defaults: an overlay per session, but no hub container given
        {"endpoint": "host_port"},
        {"endpoint": "overlay", "network_per_session": False},
    ],
)
async def test_the_spawner_refuses_reachable_sessions_before_any_engine_call(traits):
    spawner = FGPUSwarmSpawner(**traits)
    with pytest.raises(SpawnException, match="hub_container|reach one another"):
        await spawner.session_network()


async def test_a_site_that_accepts_it_gets_host_port():
    spawner = FGPUSwarmSpawner(endpoint="host_port", allow_reachable_sessions=True)
    assert (await spawner.session_network()).id == ""


def _report(node: str, daemon: dict | None) -> dict:
    body = {"version": 2, "node": node, "sampled_at": "t", "sessions": {}, "gpus": None}
    return body if daemon is None else {**body, "daemon": daemon}


def test_the_queue_places_nothing_on_a_node_whose_engine_lets_sessions_reach_one_another(caplog):
    from queue_service.engine.node_reports import NodeReports, parse_report
    from queue_service.engine.swarm_engine import SwarmEngine

    backend = engine_backend(SwarmEngine, None, node_reports=NodeReports())
    # The app's own log does not propagate: the test reads this one.
    backend.log = logging.getLogger("fgpu-test-isolation")
    reports = {
        "good": {"icc": False, "no_new_privileges": True},
        "icc-on": {"icc": True, "no_new_privileges": True},
        "nnp-off": {"icc": False, "no_new_privileges": False},
        "old-agent": None,  # unknown: flagged (health, doctor), not refused
    }
    for node, daemon in reports.items():
        backend.node_reports.put(parse_report(node, _report(node, daemon)))
    refused = {node for node in [*reports, "silent"] if backend.isolation_refused(node)}
    assert refused == {"icc-on", "nnp-off"}
    assert "Node icc-on takes no sessions: its engine has icc wrong" in caplog.text
    # Said once, not at every reconciler round.
    backend.isolation_refused("icc-on")
    assert caplog.text.count("Node icc-on takes no sessions") == 1
    # Fixed: the next report puts it back.
    backend.node_reports.put(parse_report("icc-on", _report("icc-on", reports["good"])))
    assert not backend.isolation_refused("icc-on")
