import json
import os
from datetime import UTC, datetime, timedelta

import docker
import pytest

from fgpu_shared.homes import volume_safe
from fgpu_spawner.container_spec import ContainerContext, build_container_spec
from fgpu_spawner.gpu_sharing import HAMI_LIBRARY_IN_CONTAINER, GpuPaths, hami_region_first_prefix
from fgpu_spawner.grant import Grant
from fgpu_spawner.request import ResourceRequest
from fgpu_spawner.service_spec import SwarmContext, build_service_spec, pick_home_account

GIB = 1024**3
REQUEST = ResourceRequest("sk", "10.213.0.1:5000/fgpu/sk:1.5", cpu=1.5, mem=GIB, fgpu=0.0)
GPU_REQUEST = ResourceRequest("sk", "10.213.0.1:5000/fgpu/sk:1.5", cpu=2, mem=4 * GIB, fgpu=3.0)
GRANT = Grant("sess-1", "fgpu-lab-2")
GPU_GRANT = Grant("sess-2", "gpu-node-7", {"GPU-a": 1.0, "GPU-b": 0.5})
SWARM = SwarmContext(home_root="/srv/homes")


def context(**overrides):
    values = dict(
        name="jupyter-alice",
        user="alice",
        server_name="",
        command=["jupyterhub-singleuser"],
        env={"JUPYTERHUB_API_TOKEN": "t"},
        port=8888,
        network="fgpu-sessions",
        deployment_id="hub-1",
    )
    return ContainerContext(**{**values, **overrides})


def gpu_context(mode, **overrides):
    memory = {"GPU-a": 16 * GIB, "GPU-b": 16 * GIB}
    return context(gpu_sharing=mode, gpu_memory=memory, gpu_order=("GPU-a", "GPU-b"), **overrides)


def spec_parts(request=REQUEST, grant=GRANT, ctx=None, swarm=SWARM):
    spec = build_service_spec(request, grant, ctx or context(), swarm)
    task = spec["task_template"]
    return spec, task, task["ContainerSpec"]


def env_of(container):
    return dict(item.split("=", 1) for item in container["Env"])


def test_the_service_is_one_task_pinned_to_the_granted_node_and_never_restarted():
    spec, task, _ = spec_parts()
    assert spec["name"] == "jupyter-alice"
    assert spec["mode"] == {"replicated": {"Replicas": 1}}
    assert task["Placement"] == {"Constraints": ["node.hostname==fgpu-lab-2"]}
    assert task["RestartPolicy"]["Condition"] == "none"


def test_the_grant_is_both_limit_and_reservation_with_the_pids_cap():
    _, task, _ = spec_parts(ctx=context(pids_limit=512))
    assert task["Resources"] == {
        "Limits": {"NanoCPUs": 1_500_000_000, "MemoryBytes": GIB, "Pids": 512},
        "Reservations": {"NanoCPUs": 1_500_000_000, "MemoryBytes": GIB},
    }


def test_the_session_runs_as_its_user_with_every_capability_dropped():
    loose = {"cap_add": ["SYS_ADMIN"], "privileged": True, "security_opt": ["seccomp=unconfined"]}
    _, _, container = spec_parts(ctx=context(run_as="1000:100", extra_host_config=loose))
    assert container["Image"] == "10.213.0.1:5000/fgpu/sk:1.5"
    assert container["User"] == "1000:100"
    assert container["CapabilityDrop"] == ["ALL"]
    # Nothing an admin config says can add capabilities, privileges or security options.
    assert {"CapabilityAdd", "Privileges", "Sysctls"}.isdisjoint(container)


def test_the_command_replaces_the_images_cmd_and_keeps_its_entrypoint():
    _, _, container = spec_parts(ctx=context(command=["jupyterhub-singleuser", "--debug"]))
    assert container["Args"] == ["jupyterhub-singleuser", "--debug"]
    assert container["Command"] is None


@pytest.mark.parametrize(
    ("request_", "grant", "ctx"),
    [
        (REQUEST, GRANT, context()),
        (GPU_REQUEST, GPU_GRANT, gpu_context("simulated")),
        (GPU_REQUEST, GPU_GRANT, gpu_context("hami")),
        (GPU_REQUEST, GPU_GRANT, gpu_context("mps")),
        (GPU_REQUEST, GPU_GRANT, gpu_context("none")),
        (REQUEST, GRANT, context(extra_create_kwargs={"labels": {"site": "x", "fgpu.user": "m"}})),
    ],
)
def test_service_and_single_host_container_carry_the_same_labels_and_env(request_, grant, ctx):
    single = build_container_spec(request_, grant, ctx).create_kwargs
    spec, _, container = spec_parts(request_, grant, ctx)
    assert spec["labels"] == container["Labels"] == single["labels"]
    assert env_of(container) == single["environment"]
    assert spec["labels"]["fgpu.user"] == "alice"
    assert Grant.from_json(spec["labels"]["fgpu.grant"]) == grant


def test_gpu_node_sessions_name_their_granted_gpus_for_the_nvidia_runtime():
    for mode in ("hami", "mps", "none"):
        _, task, container = spec_parts(GPU_REQUEST, GPU_GRANT, gpu_context(mode))
        assert env_of(container)["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
        assert container["Labels"]["fgpu.gpu_sharing"] == mode
        # Swarm has no device requests, and GPUs are never Swarm generic resources.
        assert "GenericResources" not in task["Resources"]["Reservations"]
        assert "DeviceRequests" not in json.dumps(task)


def test_hami_pieces_become_mounts_on_the_gpu_node():
    paths = GpuPaths(hami_cache_base="/var/lib/fgpu-hub/vgpu")
    _, _, container = spec_parts(GPU_REQUEST, GPU_GRANT, gpu_context("hami", gpu_paths=paths))
    mounts = {m["Target"]: (m["Source"], m["Type"], m["ReadOnly"]) for m in container["Mounts"]}
    assert mounts[HAMI_LIBRARY_IN_CONTAINER] == (paths.hami_library_path, "bind", True)
    assert mounts["/etc/ld.so.preload"] == (paths.hami_preload_path, "bind", True)
    # The per-session cache is the task's own tmpfs: no folder to make on the node beforehand.
    assert mounts["/usr/local/vgpu/cache"][1] == "tmpfs"
    assert "/var/lib/fgpu-hub/vgpu/sess-2" not in json.dumps(container["Mounts"])
    # So is its lock folder: no session can hold another's lock.
    assert mounts[paths.hami_lock_dir][1] == "tmpfs"
    assert env_of(container)["CUDA_DEVICE_MEMORY_LIMIT_1"] == "8192m"


def test_a_hami_task_creates_its_usage_region_before_the_command_runs():
    tool = "/usr/local/vgpu/shrreg-tool"
    ctx = gpu_context("hami", command=["jupyterhub-singleuser"])
    _, _, container = spec_parts(GPU_REQUEST, GPU_GRANT, ctx)
    assert container["Args"] == [*hami_region_first_prefix(), "jupyterhub-singleuser"]
    mounts = {m["Target"]: (m["Source"], m["ReadOnly"]) for m in container["Mounts"]}
    assert mounts[tool] == (GpuPaths().hami_shrreg_tool_path, True)


@pytest.mark.parametrize(
    ("request_", "grant", "ctx"),
    [(REQUEST, GRANT, context()), (GPU_REQUEST, GPU_GRANT, gpu_context("simulated"))],
)
def test_simulated_and_gpu_less_sessions_select_no_nvidia_device(request_, grant, ctx):
    """ "void", not absent: CUDA images say NVIDIA_VISIBLE_DEVICES=all, and a GPU node's default
    runtime is NVIDIA's, so a missing variable would hand the session every GPU of the node."""
    _, _, container = spec_parts(request_, grant, ctx)
    env = env_of(container)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert not [m for m in container["Mounts"] if "vgpu" in m["Target"]]


def test_the_home_folder_is_a_bind_of_the_shared_root():
    _, _, container = spec_parts()
    assert container["Mounts"][0] == {
        "Target": "/home/jovyan",
        "Source": "/srv/homes/alice",
        "Type": "bind",
        "ReadOnly": False,
    }
    assert [m for m in container["Mounts"] if m["Type"] == "volume"] == []


@pytest.mark.parametrize("user", ["../../etc", "a/b", "x/..", "/root"])
def test_a_user_name_cannot_climb_out_of_the_shared_root(user):
    _, _, container = spec_parts(ctx=context(user=user))
    source = container["Mounts"][0]["Source"]
    assert os.path.dirname(os.path.normpath(source)) == "/srv/homes"


@pytest.mark.parametrize(
    ("user", "folder"),
    [("..", "_2E."), (".", "_2E"), (".x", "_2Ex"), (".ipython", "_2Eipython"), ("_2Ex", "_5F2Ex")],
)
def test_a_leading_dot_user_name_is_never_a_hidden_or_parent_folder(user, folder):
    _, _, container = spec_parts(ctx=context(user=user))
    source = container["Mounts"][0]["Source"]
    assert source == f"/srv/homes/{folder}"
    assert os.path.dirname(os.path.normpath(source)) == "/srv/homes"


@pytest.mark.parametrize("user", ["alice", "student-1.a", "a.", "a_b"])
def test_other_user_names_keep_the_home_folder_they_had(user):
    _, _, container = spec_parts(ctx=context(user=user))
    assert container["Mounts"][0]["Source"] == "/srv/homes/" + volume_safe(user)


def test_without_a_shared_root_the_context_mounts_stand():
    volume = docker.types.Mount(
        "/home/jovyan", "homes", driver_config=docker.types.DriverConfig("nfs")
    )
    _, _, container = spec_parts(ctx=context(mounts=[volume]), swarm=SwarmContext())
    assert container["Mounts"] == [volume]


def test_admin_binds_and_data_mounts_follow_the_home():
    data = docker.types.Mount("/home/jovyan/data/ml", "/srv/data/ml", type="bind", read_only=True)
    binds = {"/srv/datasets": {"bind": "/data", "mode": "ro"}, "/srv/scratch": "/scratch"}
    extra = {"binds": ["/srv/models:/models:ro"], "shm_size": "1g"}
    _, _, container = spec_parts(ctx=context(mounts=[data], binds=binds, extra_host_config=extra))
    assert [(m["Target"], m["Source"], m["ReadOnly"]) for m in container["Mounts"]] == [
        ("/home/jovyan", "/srv/homes/alice", False),
        ("/home/jovyan/data/ml", "/srv/data/ml", True),
        ("/data", "/srv/datasets", True),
        ("/scratch", "/srv/scratch", False),
        ("/models", "/srv/models", True),
    ]


@pytest.mark.parametrize(
    ("ctx", "swarm", "message"),
    [
        (context(mounts=[docker.types.Mount("/home/jovyan/", "home-alice")]), SWARM, "home folder"),
        (context(), SwarmContext(home_root="srv/homes"), "absolute path"),
        (context(network="host"), SWARM, "overlay network, not 'host'"),
        (context(network="bridge"), SWARM, "overlay network, not 'bridge'"),
        (context(network=""), SWARM, "overlay network, not 'none'"),
        (context(name="jupyter-alice.lab"), SWARM, "cannot name a Swarm service"),
        (context(name="j" * 64), SWARM, "cannot name a Swarm service"),
        (context(name="jupyter-alice-"), SWARM, "cannot name a Swarm service"),
        (context(binds={"/var/run/docker.sock": "/s"}), SWARM, "Docker socket"),
        (context(extra_host_config={"binds": ["/run/docker.sock:/s"]}), SWARM, "Docker socket"),
    ],
)
def test_what_a_swarm_session_cannot_be_is_refused(ctx, swarm, message):
    with pytest.raises(ValueError, match=message):
        build_service_spec(REQUEST, GRANT, ctx, swarm)


def test_the_overlay_network_is_in_the_task_and_endpoints_are_dns_round_robin():
    spec, task, _ = spec_parts()
    assert task["Networks"] == [{"Target": "fgpu-sessions"}]
    assert spec["endpoint_spec"] == {"Mode": "dnsrr"}


def test_the_port_can_be_published_in_host_mode_on_the_node():
    spec, _, _ = spec_parts(swarm=SwarmContext(home_root="/srv/homes", publish_host_port=True))
    assert spec["endpoint_spec"] == {
        "Mode": "dnsrr",
        "Ports": [{"Protocol": "tcp", "TargetPort": 8888, "PublishMode": "host"}],
    }


def test_a_task_that_publishes_its_port_may_stay_on_its_nodes_bridge():
    host_port = SwarmContext(home_root="/srv/homes", publish_host_port=True)
    _, task, _ = spec_parts(ctx=context(network=""), swarm=host_port)
    assert "Networks" not in task or task["Networks"] == []
    # A node-local network is still refused: "host" would escape the session's isolation.
    with pytest.raises(ValueError, match="overlay network, not 'host'"):
        build_service_spec(REQUEST, GRANT, context(network="host"), host_port)


def test_a_vip_endpoint_where_the_site_has_ipvs():
    spec, _, _ = spec_parts(swarm=SwarmContext(home_root="/srv/homes", vip=True))
    assert spec["endpoint_spec"] == {"Mode": "vip"}


class RecordingClient(docker.APIClient):
    """docker-py's own create_service, stopped where it would send the request."""

    def __init__(self):
        super().__init__(base_url="tcp://127.0.0.1:9", version="1.41")
        self.sent = []

    def _post_json(self, url, data, **kwargs):
        self.sent.append((url, json.loads(json.dumps(data))))

    def _result(self, response, json=False, binary=False):
        return {"ID": "svc"}


def test_docker_py_takes_the_spec_as_is_at_api_1_41():
    client = RecordingClient()
    spec = build_service_spec(GPU_REQUEST, GPU_GRANT, gpu_context("hami"), SWARM)
    assert client.create_service(**spec) == {"ID": "svc"}
    [(url, body)] = client.sent
    assert url.endswith("/v1.41/services/create")
    assert body["Name"] == "jupyter-alice"
    assert body["Networks"] is None  # deprecated at the service level; the task carries it
    assert body["TaskTemplate"]["Networks"] == [{"Target": "fgpu-sessions"}]
    assert body["TaskTemplate"]["Resources"]["Limits"]["Pids"] == 1024
    assert body["Labels"] == body["TaskTemplate"]["ContainerSpec"]["Labels"]


CREATED = datetime(2026, 11, 26, 12, 0, 0, 123456, tzinfo=UTC)


def test_an_accounts_home_folder_is_named_with_the_account():
    swarm = SwarmContext(home_root="/srv/homes", home_account="20261126T120000123456Z")
    _, _, container = spec_parts(swarm=swarm)
    assert container["Mounts"][0]["Source"] == "/srv/homes/alice_u20261126T120000123456Z"


@pytest.mark.parametrize(
    ("own_exists", "plain_modified", "picked"),
    [
        (True, None, "own"),  # its own folder, once made, is always its own
        (False, CREATED.replace(microsecond=0), "plain"),  # the plain folder, written since
        (False, CREATED + timedelta(days=3), "plain"),
        (False, CREATED - timedelta(seconds=1), "own"),  # an earlier account's: left alone
        (False, None, "own"),  # nothing yet: a folder of its own
    ],
)
def test_a_plain_home_folder_is_an_accounts_only_if_written_since_it_was_made(
    own_exists, plain_modified, picked
):
    account = "20261126T120000123456Z"
    chosen = pick_home_account(account, CREATED, own_exists, plain_modified)
    assert chosen == (account if picked == "own" else "")


def test_a_batch_jobs_service_runs_the_job_runner_with_the_jobs_label_and_variable():
    """A job's service is built as its single-host container is: the same `fgpu.kind=batch`
    label the service's exit watch reads, the job in FGPU_JOB, job_runner.py as its command, and
    never restarted, so that its task ends `complete` or `failed` with the job's exit code."""
    from fgpu_spawner.job_runner_source import job_command

    job = json.dumps({"command": "echo hi"})
    batch = ResourceRequest("sk", REQUEST.image, cpu=1, mem=GIB, fgpu=0.0, job=job)
    ctx = context(command=job_command())
    spec, task, container = spec_parts(request=batch, ctx=ctx)
    assert spec["labels"]["fgpu.kind"] == "batch"
    assert container["Labels"]["fgpu.kind"] == "batch"
    assert env_of(container)["FGPU_JOB"] == job
    assert container["Args"] == ["python3", "-c", job_command()[2]]
    assert task["RestartPolicy"]["Condition"] == "none"
    single = build_container_spec(batch, GRANT, ctx).create_kwargs
    assert single["labels"] == container["Labels"]
    assert single["environment"] == env_of(container)
    assert single["command"] == container["Args"]
    # An interactive session carries neither.
    _, _, session = spec_parts()
    assert "fgpu.kind" not in session["Labels"] and "FGPU_JOB" not in env_of(session)
