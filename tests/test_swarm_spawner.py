"""`fgpu_spawner.swarm_spawner`: the pure parts of the Swarm spawner. The spawner itself runs
against the lab in tests/test_swarm_hub.py."""

from types import SimpleNamespace

import pytest
from jupyterhub.spawner import SpawnException

from fgpu_spawner.swarm_spawner import FGPUSwarmSpawner, published_port, task_address

TASK = {
    "ID": "task123456789",
    "NetworksAttachments": [
        {"Network": {"ID": "other"}, "Addresses": ["10.0.9.7/24"]},
        {"Network": {"ID": "net-1"}, "Addresses": ["10.214.0.5/24"]},
    ],
    "Status": {
        "PortStatus": {
            "Ports": [
                {"TargetPort": 9999, "PublishedPort": 30001, "PublishMode": "host"},
                {"TargetPort": 8888, "PublishedPort": 30002, "PublishMode": "host"},
            ]
        }
    },
}


def test_the_tasks_address_on_the_session_network():
    assert task_address(TASK, "net-1") == "10.214.0.5"
    with pytest.raises(RuntimeError, match="no address on network net-2"):
        task_address(TASK, "net-2")


def test_the_node_port_published_for_the_server():
    assert published_port(TASK, 8888) == 30002
    with pytest.raises(RuntimeError, match="publishes no port for 7777"):
        published_port(TASK, 7777)
    with pytest.raises(RuntimeError):
        published_port({"ID": "t", "Status": {}}, 8888)


@pytest.mark.parametrize(
    ("registry", "reference", "pulled"),
    [
        ("10.213.0.1:5000", "fgpu/jupyter-base:py3.11", "10.213.0.1:5000/fgpu/jupyter-base:py3.11"),
        ("10.213.0.1:5000/", "ubuntu:24.04", "10.213.0.1:5000/ubuntu:24.04"),
        ("10.213.0.1:5000", "registry.site:443/fgpu/x:1", "registry.site:443/fgpu/x:1"),
        ("10.213.0.1:5000", "ghcr.io/org/x:1", "ghcr.io/org/x:1"),
        ("10.213.0.1:5000", "localhost/x:1", "localhost/x:1"),
        ("", "fgpu/jupyter-base:py3.11", "fgpu/jupyter-base:py3.11"),
    ],
)
def test_images_come_from_the_sites_registry_unless_they_name_their_own(
    registry, reference, pulled
):
    assert FGPUSwarmSpawner(registry=registry).session_image(reference) == pulled


def test_the_command_is_the_catalogs_not_read_from_an_image_the_manager_lacks():
    assert FGPUSwarmSpawner().cmd == ["jupyterhub-singleuser"]


def test_sessions_reach_the_hub_at_its_containers_name_on_their_overlay():
    hub = SimpleNamespace(url="http://127.0.0.1:8081/hub/")
    on_overlay = FGPUSwarmSpawner(endpoint="overlay", hub_container="fgpu-hub", hub=hub)
    assert on_overlay.hub_connect_url == "http://fgpu-hub:8081"
    # Without the hub's container, or beside the Swarm: the hub's own connect URL.
    assert FGPUSwarmSpawner(endpoint="overlay", hub=hub).hub_connect_url is None
    beside = FGPUSwarmSpawner(endpoint="host_port", hub_container="fgpu-hub", hub=hub)
    assert beside.hub_connect_url is None


def test_a_session_of_its_own_overlay_names_it_as_its_service():
    shared = FGPUSwarmSpawner(endpoint="overlay", network_per_session=False)
    shared.object_name = "jupyter-ann-s1"  # otherwise made from the user, whom this test lacks
    assert shared.overlay_name == "fgpu-sessions-overlay"
    own = FGPUSwarmSpawner(hub_container="hub")  # the defaults: an overlay per session
    own.object_name = "jupyter-ann-s1"
    assert own.overlay_name == "jupyter-ann-s1"


async def test_an_overlay_per_session_without_the_hubs_container_is_refused_before_any_engine_call():
    spawner = FGPUSwarmSpawner(endpoint="overlay", network_per_session=True)
    with pytest.raises(SpawnException, match="network_per_session needs hub_container"):
        await spawner.session_network()


async def test_a_bad_registry_credentials_file_fails_the_spawn_saying_why(tmp_path):
    path = tmp_path / "registry-auth.json"
    spawner = FGPUSwarmSpawner(registry_auth_file=str(path))
    with pytest.raises(SpawnException, match=f"registry_auth_file: .*{path}: No such file"):
        await spawner.log_in_to_registry()
    path.write_text('{"username": "u", "password": "p", "serveraddress": "r:5000"}')
    path.chmod(0o604)
    with pytest.raises(SpawnException, match="readable by every user .mode 0604.: chmod 0600"):
        await spawner.log_in_to_registry()
    # Without a file there is no login to make (and no engine is asked).
    await FGPUSwarmSpawner().log_in_to_registry()
