import dataclasses
import json

import docker
import pytest

from fgpu_spawner.container_spec import (
    ContainerContext,
    build_container_spec,
    mount_options_of,
    writable_layer_support,
)
from fgpu_spawner.gpu_sharing import hami_region_first_prefix
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


def test_resource_usage_limits_are_the_slice_under_kubespawners_names():
    """jupyter-resource-usage (JupyterLab's status bar) reads CPU_LIMIT in cores, MEM_LIMIT in bytes."""
    request = ResourceRequest("sk", "fgpu/sk:1.5", cpu=0.5, mem=768 * 1024**2, fgpu=0.0)
    env = build_container_spec(request, GRANT, context()).create_kwargs["environment"]
    assert (env["CPU_LIMIT"], env["MEM_LIMIT"]) == ("0.5", str(768 * 1024**2))


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


def test_a_hami_session_creates_its_usage_region_before_its_command_runs():
    # HAMi-core keeps the limits of whichever process creates the region: the spawner's tool first.
    grant = Grant("sess-2", "node-a", {"GPU-a": 0.5})
    request = ResourceRequest("sk", "fgpu/sk:1.5", cpu=1, mem=GIB, fgpu=1.0)
    ctx = context(gpu_sharing="hami", gpu_memory={"GPU-a": 16 * GIB})
    spec = build_container_spec(request, grant, ctx)
    tool = "/usr/local/vgpu/shrreg-tool"
    assert spec.create_kwargs["command"] == [*hami_region_first_prefix(), "jupyterhub-singleuser"]
    mounts = {m["Target"]: m for m in spec.host_config["mounts"]}
    assert mounts[tool]["Source"] == "/usr/local/lib/hami-shrreg-tool"
    assert mounts[tool]["ReadOnly"] is True


def test_simulated_grants_get_no_device():
    grant = Grant("sess-3", "node-a", {"GPU-a": 0.5})
    request = ResourceRequest("sk", "fgpu/sk:1.5", cpu=1, mem=GIB, fgpu=1.0)
    ctx = context(gpu_sharing="simulated", gpu_memory={"GPU-a": 16 * GIB})
    spec = build_container_spec(request, grant, ctx)
    assert "device_requests" not in spec.host_config
    assert spec.create_kwargs["environment"]["FGPU_SIMULATED"] == "1"


# --- hardening ------------------------------------------------------------------------------------


def test_sessions_hold_no_capability_and_cannot_gain_privileges():
    host = build_container_spec(REQUEST, GRANT, context()).host_config
    assert host["cap_drop"] == ["ALL"]
    assert "cap_add" not in host
    assert host["security_opt"] == ["no-new-privileges"]
    assert host["privileged"] is False


def test_admin_extras_cannot_add_capabilities_or_lift_confinement():
    extra = {
        "cap_add": ["SYS_ADMIN"],
        "cap_drop": [],
        "security_opt": [
            "seccomp=unconfined",
            "apparmor=unconfined",
            "no-new-privileges=false",
            "label=disable",
            "label=level:s0:c100",
        ],
    }
    host = build_container_spec(REQUEST, GRANT, context(extra_host_config=extra)).host_config
    assert "cap_add" not in host
    assert host["cap_drop"] == ["ALL"]
    assert host["security_opt"] == ["label=level:s0:c100", "no-new-privileges"]


def test_the_writable_layer_is_bounded_when_a_size_is_given():
    unbounded = build_container_spec(REQUEST, GRANT, context()).host_config
    assert "storage_opt" not in unbounded
    extra = {"storage_opt": {"size": "500G", "dm.fs": "xfs"}}
    ctx = context(writable_layer_size=10 * GIB, extra_host_config=extra)
    bounded = build_container_spec(REQUEST, GRANT, ctx).host_config
    assert bounded["storage_opt"] == {"size": str(10 * GIB), "dm.fs": "xfs"}


def test_the_host_config_is_one_the_engine_api_takes():
    """docker-py checks names and types of every setting against the engine's API version."""
    grant = Grant("sess-5", "node-a", {"GPU-a": 0.5})
    request = ResourceRequest("sk", "fgpu/sk:1.5", cpu=1, mem=GIB, fgpu=1.0)
    ctx = context(gpu_sharing="hami", gpu_memory={"GPU-a": 16 * GIB}, writable_layer_size=GIB)
    spec = build_container_spec(request, grant, ctx)
    host = docker.APIClient(version="1.41").create_host_config(**spec.host_config)
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["StorageOpt"] == {"size": str(GIB)}
    preload = next(m for m in host["Mounts"] if m["Target"] == "/etc/ld.so.preload")
    assert (preload["Type"], preload["ReadOnly"]) == ("bind", True)


# --- what the storage driver can bound ------------------------------------------------------------

OVERLAY_ON_EXT4 = [["Backing Filesystem", "extfs"], ["Supports d_type", "true"]]
OVERLAY_ON_XFS = [["Backing Filesystem", "xfs"], ["Supports d_type", "true"]]


def test_overlay2_on_ext4_cannot_bound_the_layer_and_says_why():
    support = writable_layer_support("overlay2", OVERLAY_ON_EXT4, {"rw", "relatime"})
    assert support.supported is False
    assert "overlay2 on extfs" in support.reason and "pquota" in support.reason


@pytest.mark.parametrize(
    "options, supported",
    [
        ({"rw", "pquota"}, True),
        ({"rw", "prjquota"}, True),
        ({"rw", "uquota"}, False),
        (None, False),
    ],
)
def test_overlay2_on_xfs_needs_project_quotas(options, supported):
    assert writable_layer_support("overlay2", OVERLAY_ON_XFS, options).supported is supported


@pytest.mark.parametrize("driver, supported", [("btrfs", True), ("zfs", True), ("vfs", False)])
def test_other_drivers(driver, supported):
    assert writable_layer_support(driver, [], None).supported is supported


PROC_MOUNTS = """\
/dev/vda1 / ext4 rw,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
/dev/vdb /var/lib/docker xfs rw,relatime,attr2,inode64,prjquota 0 0
/dev/vdc /var/lib/docker-old xfs rw,relatime 0 0
/dev/vdd /srv/my\\040disk ext4 rw 0 0
"""


def test_mount_options_come_from_the_mount_that_holds_the_path():
    assert "prjquota" in mount_options_of("/var/lib/docker", PROC_MOUNTS)
    assert "prjquota" not in mount_options_of("/var/lib/docker-old/x", PROC_MOUNTS)
    assert mount_options_of("/home/user", PROC_MOUNTS) == {"rw", "relatime"}
    assert mount_options_of("/srv/my disk/docker", PROC_MOUNTS) == {"rw"}
    assert mount_options_of("/anything", "") is None


# --- a session's own environment variables ----------------------------------------


def test_a_sessions_own_env_is_set_but_never_replaces_the_hubs():
    request = dataclasses.replace(
        REQUEST, env=(("SEED", "7"), ("JUPYTERHUB_API_TOKEN", "forged"), ("FGPU_CPU", "64"))
    )
    env = build_container_spec(request, GRANT, context()).create_kwargs["environment"]
    assert env["SEED"] == "7"
    assert (env["JUPYTERHUB_API_TOKEN"], env["FGPU_CPU"]) == ("t", "1.5")


@pytest.mark.parametrize("mode", ["hami", "mps", "none", "simulated"])
def test_every_variable_the_builder_sets_is_one_a_session_may_not_set(mode):
    """launch_options' reserved names cover all that the spawner and the GPU sharing set, so
    none can be given in `env` (the hub's own JUPYTERHUB_* and JPY_* are reserved by prefix)."""
    from image_catalog.launch_options import reserved

    grant = Grant("sess-4", "node-a", {"GPU-a": 0.5})
    request = ResourceRequest("sk", "fgpu/sk:1.5", cpu=1, mem=GIB, fgpu=1.0)
    ctx = context(gpu_sharing=mode, gpu_memory={"GPU-a": 16 * GIB}, env={})
    env = build_container_spec(request, grant, ctx).create_kwargs["environment"]
    assert len(env) >= 8
    assert sorted(name for name in env if not reserved(name)) == []


# --- batch jobs -------------------------------------------------------------------------


def test_a_batch_job_is_labelled_batch_and_gets_its_job_in_env():
    job = '{"command":"python train.py","time_limit":null}'
    request = dataclasses.replace(REQUEST, job=job)
    create = build_container_spec(request, GRANT, context()).create_kwargs
    assert create["labels"]["fgpu.kind"] == "batch"
    assert create["environment"]["FGPU_JOB"] == job
    # A session has neither.
    session = build_container_spec(REQUEST, GRANT, context()).create_kwargs
    assert "fgpu.kind" not in session["labels"]
    assert "FGPU_JOB" not in session["environment"]


def test_a_jobs_own_env_cannot_replace_its_job():
    request = dataclasses.replace(REQUEST, job='{"command":"x"}', env=(("FGPU_JOB", "forged"),))
    env = build_container_spec(request, GRANT, context()).create_kwargs["environment"]
    assert env["FGPU_JOB"] == '{"command":"x"}'
