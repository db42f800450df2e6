"""HAMi-core's limits come from the process environment.

Threat model: a student in a `hami` session wants more of the GPU than the grant: by launching
with HAMi-core's variables, by making their first CUDA process create the session's usage region
with limits of their own (HAMi-core keeps whatever the region's creator had in its environment),
or by starting a process with an empty environment (`env -i`), which HAMi-core would give a fresh
region without limits. What stays open (a process naming a fresh cache file, writing the region
file, or bypassing the dynamic loader) is in docs/source/howto/gpu-slice.md, "How strict is a GPU slice".

The spec is checked as a unit; the region-first prefix is run in a real container with a
stand-in for HAMi-core's tool (no GPU here), so the shell quoting is what the engine runs.
"""

from __future__ import annotations

import secrets

import pytest

from fgpu_spawner.container_spec import ContainerContext, build_container_spec
from fgpu_spawner.gpu_sharing import (
    HAMI_SHRREG_TOOL_IN_CONTAINER,
    build_gpu_settings,
    hami_region_first_prefix,
)
from fgpu_spawner.grant import Grant
from fgpu_spawner.request import ResourceRequest
from image_catalog.launch_options import OptionError, check_env

GIB = 1024**3
GRANT = Grant("sess-9", "node-a", {"GPU-a": 0.5})
MEMORY = {"GPU-a": 16 * GIB}
BASE_IMAGE = "fgpu/jupyter-base:py3.11"

# Every variable HAMi-core (or HAMi's device plugin) reads that widens, hides or switches off a
# limit, or moves the library or the region elsewhere.
HAMI_SWITCHES = [
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_SM_LIMIT_0",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_DISABLE_CONTROL",
    "CUDA_REDIRECT",
    "CUDA_OVERSUBSCRIBE",
    "CUDA_TASK_PRIORITY",
    "GPU_CORE_UTILIZATION_POLICY",
    "ACTIVE_OOM_KILLER",
    "LIBCUDA_LOG_LEVEL",
    "RECORD_KERNEL_INTERVAL",
    "LD_PRELOAD",
]


@pytest.mark.parametrize("name", HAMI_SWITCHES)
def test_a_launch_cannot_set_any_of_hami_cores_switches(name):
    with pytest.raises(OptionError, match="set by the hub"):
        check_env({name: "80g"})


def hami_spec(env: tuple = ()):
    request = ResourceRequest("sk", "fgpu/sk:1.5", cpu=1, mem=GIB, fgpu=1.0, env=env)
    ctx = ContainerContext(
        name="jupyter-eve",
        user="eve",
        server_name="",
        command=["jupyterhub-singleuser"],
        env={},
        port=8888,
        network="bridge",
        gpu_sharing="hami",
        gpu_memory=MEMORY,
    )
    return build_container_spec(request, GRANT, ctx)


def test_the_region_is_created_by_the_spawners_tool_before_the_students_command():
    command = hami_spec().create_kwargs["command"]
    assert command[: len(hami_region_first_prefix())] == hami_region_first_prefix()
    script = command[2]
    # The tool creates the region; only then does the session's command get to run.
    assert script.index("--create_new") < script.index('exec "$@"')
    assert command[3] == HAMI_SHRREG_TOOL_IN_CONTAINER
    assert command[-1] == "jupyterhub-singleuser"


def test_the_tool_is_a_read_only_mount_the_engine_refuses_when_missing():
    (tool,) = [
        m for m in hami_spec().host_config["mounts"] if m["Target"] == HAMI_SHRREG_TOOL_IN_CONTAINER
    ]
    assert (tool["Type"], tool["ReadOnly"]) == ("bind", True)


def test_even_an_unchecked_launch_variable_cannot_replace_the_limits_the_region_is_made_from():
    # check_env refuses these; container_env must still put the grant's values last.
    env = (("CUDA_DEVICE_MEMORY_LIMIT_0", "80g"), ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/x"))
    environment = hami_spec(env).create_kwargs["environment"]
    assert environment["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8192m"
    assert environment["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/usr/local/vgpu/cache/cudevshr.cache"


def test_cuda_disable_control_does_not_take_the_preload_file_away():
    # HAMi's device plugin leaves /etc/ld.so.preload out for a pod that says so; the spawner must
    # not, even for a variable that got past check_env.
    spec = hami_spec((("CUDA_DISABLE_CONTROL", "true"),))
    targets = {m["Target"]: m["ReadOnly"] for m in spec.host_config["mounts"]}
    assert targets["/etc/ld.so.preload"] is True
    assert targets["/usr/local/vgpu/libvgpu.so"] is True


# --- the prefix, run ------------------------------------------------------------------------------

STAND_IN_TOOL = """#!/bin/sh
# Stands in for HAMi-core's shrreg-tool: shows what it was given and what it found.
echo "tool: $* limit=$CUDA_DEVICE_MEMORY_LIMIT_0 default-region=$(readlink /tmp/cudevshr.cache)"
exit "${FAIL:-0}"
"""


def run_prefixed(docker_engine, tmp_path, fail: bool) -> tuple[int, str]:
    tool = tmp_path / "shrreg-tool"
    tool.write_text(STAND_IN_TOOL)
    tool.chmod(0o755)
    env = build_gpu_settings(GRANT, MEMORY, "hami").env
    command = [*hami_region_first_prefix(), "printf", "command: [%s]\n", "two words", "x"]
    container = docker_engine.containers.create(
        BASE_IMAGE,
        command=command,
        entrypoint=[],
        environment={**env, "FAIL": "1" if fail else "0"},
        user="1000:100",
        network_disabled=True,
        name=f"fgpu-test-hami-prefix-{secrets.token_hex(4)}",
        volumes={str(tool): {"bind": HAMI_SHRREG_TOOL_IN_CONTAINER, "mode": "ro"}},
        cap_drop=["ALL"],
    )
    try:
        container.start()
        status = container.wait(timeout=60)["StatusCode"]
        return status, container.logs().decode()
    finally:
        container.remove(force=True)


@pytest.mark.docker
def test_the_prefix_makes_the_region_then_hands_over_the_command_intact(docker_engine, tmp_path):
    status, output = run_prefixed(docker_engine, tmp_path, fail=False)
    assert status == 0, output
    assert output.splitlines() == [
        "tool: --create_new limit=8192m default-region=/usr/local/vgpu/cache/cudevshr.cache",
        "command: [two words]",
        "command: [x]",
    ]


@pytest.mark.docker
def test_when_the_tool_fails_the_session_never_starts(docker_engine, tmp_path):
    status, output = run_prefixed(docker_engine, tmp_path, fail=True)
    assert status != 0
    assert "command:" not in output
