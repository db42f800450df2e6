import json

import pytest

from fgpu_spawner.container_spec import ContainerContext, build_container_spec
from fgpu_spawner.grant import Grant
from fgpu_spawner.request import ResourceRequest

GIB = 1024**3
REQUEST = ResourceRequest("sk", "fgpu/sk:1.5", cpu=1.5, mem=GIB, fgpu=0.0)
GRANT = Grant("sess-1", "local")


def context(**overrides):
    values = dict(
        name="jupyter-alice",
        user="alice",
        server_name="",
        command=["jupyterhub-singleuser"],
        env={"JUPYTERHUB_API_TOKEN": "t"},
        port=8888,
        network="bridge",
    )
    return ContainerContext(**{**values, **overrides})


def test_cpu_and_memory_become_cgroup_limits():
    host = build_container_spec(REQUEST, GRANT, context()).host_config
    assert (host["cpu_quota"], host["cpu_period"]) == (150_000, 100_000)
    assert host["mem_limit"] == GIB
    assert host["memswap_limit"] == GIB
    assert host["pids_limit"] == 1024
    assert host["privileged"] is False


def test_labels_carry_session_user_and_grant():
    labels = build_container_spec(REQUEST, GRANT, context()).create_kwargs["labels"]
    assert labels["fgpu.session_id"] == "sess-1"
    assert labels["fgpu.user"] == "alice"
    assert labels["fgpu.image"] == "sk"
    assert Grant.from_json(labels["fgpu.grant"]) == GRANT
    assert json.loads(labels["fgpu.request"]) == {"cpu": 1.5, "mem": GIB, "fgpu": 0.0}


def test_session_runs_as_the_configured_non_root_user_with_its_slice_in_env():
    create = build_container_spec(REQUEST, GRANT, context(run_as="1000:100")).create_kwargs
    assert create["user"] == "1000:100"
    assert create["image"] == "fgpu/sk:1.5"
    assert create["environment"]["JUPYTERHUB_API_TOKEN"] == "t"
    assert create["environment"]["FGPU_CPU"] == "1.5"
    assert create["environment"]["FGPU_MEM"] == str(GIB)
    assert create["ports"] == {"8888/tcp": None}


def test_admin_extras_cannot_loosen_the_slice():
    loose = {"mem_limit": 64 * GIB, "cpu_quota": -1, "privileged": True, "pids_limit": -1}
    host = build_container_spec(REQUEST, GRANT, context(extra_host_config=loose)).host_config
    assert (host["mem_limit"], host["cpu_quota"], host["pids_limit"]) == (GIB, 150_000, 1024)
    assert host["privileged"] is False


def test_admin_binds_add_to_the_gpu_binds_and_gpus_come_only_from_the_grant():
    grant = Grant("sess-4", "node-a", {"GPU-a": 0.25})
    request = ResourceRequest("sk", "fgpu/sk:1.5", cpu=1, mem=GIB, fgpu=1.0)
    extra = {
        "binds": ["/srv/datasets:/data:ro"],
        "device_requests": [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}],
        "shm_size": "1g",
    }
    ctx = context(
        gpu_sharing="hami",
        gpu_memory={"GPU-a": 16 * GIB},
        gpu_order=("GPU-a",),
        binds={"home-alice": {"bind": "/home/jovyan", "mode": "rw"}},
        extra_host_config=extra,
    )
    host = build_container_spec(request, grant, ctx).host_config
    assert "home-alice:/home/jovyan:rw" in host["binds"]
    assert "/srv/datasets:/data:ro" in host["binds"]
    # HAMi-core's library and preload file stay mounted next to the admin's: the limits hold.
    targets = {mount["Target"] for mount in host["mounts"]}
    assert {"/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload"} <= targets
    (device,) = host["device_requests"]
    assert device["device_ids"] == ["GPU-a"]
    assert host["shm_size"] == "1g"


def test_admin_labels_are_kept_but_cannot_forge_session_labels():
    extra = {"labels": {"course": "ml101", "fgpu.user": "mallory"}}
    labels = build_container_spec(REQUEST, GRANT, context(extra_create_kwargs=extra)).create_kwargs[
        "labels"
    ]
    assert labels["course"] == "ml101"
    assert labels["fgpu.user"] == "alice"


@pytest.mark.parametrize(
    "overrides",
    [
        {"binds": {"/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"}}},
        {"extra_host_config": {"binds": ["/run/docker.sock:/run/docker.sock"]}},
        {"mounts": ["/var/run/docker.sock"]},
    ],
)
def test_docker_socket_is_never_mounted(overrides):
    with pytest.raises(ValueError, match="Docker socket"):
        build_container_spec(REQUEST, GRANT, context(**overrides))


def test_ports_are_published_only_when_asked():
    assert "port_bindings" not in build_container_spec(REQUEST, GRANT, context()).host_config
    host = build_container_spec(REQUEST, GRANT, context(publish_to="127.0.0.1")).host_config
    assert host["port_bindings"] == {8888: ("127.0.0.1",)}


def test_a_gpu_grant_becomes_devices_env_and_labels_for_its_mode():
    grant = Grant("sess-2", "node-a", {"GPU-a": 0.5})
    request = ResourceRequest("sk", "fgpu/sk:1.5", cpu=1, mem=GIB, fgpu=1.0)
    ctx = context(gpu_sharing="hami", gpu_memory={"GPU-a": 16 * GIB}, gpu_order=("GPU-a",))
    spec = build_container_spec(request, grant, ctx)
    (device,) = spec.host_config["device_requests"]
    assert device["device_ids"] == ["GPU-a"]
    assert spec.create_kwargs["environment"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8192m"
    assert spec.create_kwargs["labels"]["fgpu.gpu_sharing"] == "hami"


def test_simulated_grants_get_no_device():
    grant = Grant("sess-3", "node-a", {"GPU-a": 0.5})
    request = ResourceRequest("sk", "fgpu/sk:1.5", cpu=1, mem=GIB, fgpu=1.0)
    ctx = context(gpu_sharing="simulated", gpu_memory={"GPU-a": 16 * GIB})
    spec = build_container_spec(request, grant, ctx)
    assert "device_requests" not in spec.host_config
    assert spec.create_kwargs["environment"]["FGPU_SIMULATED"] == "1"
