"""fgpu_spawner.network: the session network, pure helpers and against the real engine."""

from __future__ import annotations

import secrets

import pytest

from fgpu_spawner.network import (
    ICC_OPTION,
    NetworkError,
    ensure_session_network,
    gateway_of,
    isolates_containers,
    network_create_kwargs,
    pick_network,
)


def test_the_network_is_a_bridge_with_inter_container_traffic_off():
    kwargs = network_create_kwargs("fgpu-sessions")
    assert kwargs["name"] == "fgpu-sessions"
    assert kwargs["driver"] == "bridge"
    assert kwargs["options"] == {ICC_OPTION: "false"}
    # Without it the engine (API 1.41) makes a second network of the same name.
    assert kwargs["check_duplicate"] is True


@pytest.mark.parametrize(
    "attrs, isolated",
    [
        ({"Driver": "bridge", "Options": {ICC_OPTION: "false"}}, True),
        ({"Driver": "bridge", "Options": {ICC_OPTION: "true"}}, False),
        ({"Driver": "bridge", "Options": {}}, False),
        ({"Driver": "bridge", "Options": None}, False),
        ({"Driver": "macvlan", "Options": {ICC_OPTION: "false"}}, False),
    ],
)
def test_only_a_bridge_with_icc_off_isolates(attrs, isolated):
    assert isolates_containers(attrs) is isolated


def test_the_exact_name_wins_and_a_race_resolves_to_the_oldest():
    networks = [
        {"Name": "fgpu-sessions-old", "Id": "a", "Created": "2026-01-01"},
        {"Name": "fgpu-sessions", "Id": "c", "Created": "2026-03-01"},
        {"Name": "fgpu-sessions", "Id": "b", "Created": "2026-02-01"},
    ]
    assert pick_network("fgpu-sessions", networks)["Id"] == "b"
    assert pick_network("fgpu", networks) is None


def test_the_gateway_is_the_first_ipam_gateway():
    attrs = {"Name": "n", "IPAM": {"Config": [{"Subnet": "fd00::/64"}, {"Gateway": "10.9.0.1"}]}}
    assert gateway_of(attrs) == "10.9.0.1"
    with pytest.raises(NetworkError, match="no IPv4 gateway"):
        gateway_of({"Name": "n", "IPAM": {"Config": []}})


# --- the real engine ------------------------------------------------------------------------------


@pytest.fixture
def network_name(docker_engine):
    name = f"fgpu-test-net-{secrets.token_hex(4)}"
    yield name
    for network in docker_engine.api.networks(names=[name]):
        docker_engine.api.remove_network(network["Id"])


@pytest.mark.docker
def test_ensuring_twice_makes_one_isolated_network(docker_engine, network_name):
    first = ensure_session_network(docker_engine.api, network_name)
    second = ensure_session_network(docker_engine.api, network_name)
    assert first == second
    (attrs,) = [n for n in docker_engine.api.networks(names=[network_name])]
    assert attrs["Options"][ICC_OPTION] == "false"
    assert first.gateway == attrs["IPAM"]["Config"][0]["Gateway"]


@pytest.mark.docker
def test_a_network_that_lets_containers_talk_is_refused(docker_engine, network_name):
    docker_engine.api.create_network(network_name, driver="bridge")
    with pytest.raises(NetworkError, match="lets sessions reach one another"):
        ensure_session_network(docker_engine.api, network_name)
