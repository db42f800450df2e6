"""`ResourceRequest` + `Grant` → Docker create arguments. Pure: no I/O, so every limit is unit-tested.

Like kubespawner's `objects.py`, this module builds the whole object; the spawner gathers the inputs
(environment, command) and hands the result to the engine. Settings that keep a session inside its
slice are applied last, so that no admin `extra_host_config` can loosen them by accident: the
cgroup limits, and the GPU settings of the grant. An admin's binds and mounts are added to the
session's (HAMi-core's library and cache stay mounted), and GPUs come only from the grant, so an
admin's `device_requests` is dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from docker.utils import convert_volume_binds

from .gpu_sharing import GpuPaths, build_gpu_settings
from .grant import Grant
from .request import ResourceRequest

CPU_PERIOD_US = 100_000
LABEL_PREFIX = "fgpu."
DOCKER_SOCKET = "docker.sock"


@dataclass(frozen=True)
class ContainerContext:
    """What the spawner knows about the container besides the request and the grant."""

    name: str
    user: str
    server_name: str
    command: list[str]
    env: dict[str, str]
    port: int
    network: str
    run_as: str = "1000:100"
    pids_limit: int = 1024
    auto_remove: bool = False
    publish_to: str | None = None
    binds: dict = field(default_factory=dict)
    volumes: list = field(default_factory=list)
    mounts: list = field(default_factory=list)
    extra_create_kwargs: dict = field(default_factory=dict)
    extra_host_config: dict = field(default_factory=dict)
    gpu_sharing: str = "simulated"
    gpu_memory: dict = field(default_factory=dict)
    gpu_order: tuple = ()
    gpu_paths: GpuPaths = field(default_factory=GpuPaths)
    deployment_id: str = ""


@dataclass(frozen=True)
class ContainerSpec:
    """Keyword arguments for docker-py: `create_container(**create_kwargs, host_config=...)`."""

    create_kwargs: dict
    host_config: dict


def session_labels(request: ResourceRequest, grant: Grant, ctx: ContainerContext) -> dict[str, str]:
    """Labels that let the reconciler find and account for the container without the DB."""
    return {
        f"{LABEL_PREFIX}session_id": grant.session_id,
        f"{LABEL_PREFIX}user": ctx.user,
        f"{LABEL_PREFIX}server_name": ctx.server_name,
        f"{LABEL_PREFIX}node": grant.node,
        f"{LABEL_PREFIX}image": request.image_name,
        f"{LABEL_PREFIX}request": json.dumps(
            {"cpu": request.cpu, "mem": request.mem, "fgpu": request.fgpu}
        ),
        f"{LABEL_PREFIX}grant": grant.to_json(),
        # Which hub made it: hubs sharing an engine adopt or stop only their own sessions.
        **({f"{LABEL_PREFIX}deployment": ctx.deployment_id} if ctx.deployment_id else {}),
    }


def session_env(request: ResourceRequest, grant: Grant) -> dict[str, str]:
    """Tell the session what it holds, so notebooks can size their work to it."""
    return {
        "FGPU_SESSION_ID": grant.session_id,
        "FGPU_CPU": f"{request.cpu:g}",
        "FGPU_MEM": str(request.mem),
        "FGPU_FGPU": f"{request.fgpu:g}",
    }


def resource_limits(request: ResourceRequest, pids_limit: int) -> dict:
    """cgroup limits for the slice: CPU quota, memory with no extra swap, and a pids cap."""
    return {
        "cpu_period": CPU_PERIOD_US,
        "cpu_quota": round(request.cpu * CPU_PERIOD_US),
        "mem_limit": request.mem,
        "memswap_limit": request.mem,
        "pids_limit": pids_limit,
    }


def build_container_spec(
    request: ResourceRequest, grant: Grant, ctx: ContainerContext
) -> ContainerSpec:
    """The full create/host_config for a session container."""
    _refuse_docker_socket(ctx)
    gpu = build_gpu_settings(
        grant, ctx.gpu_memory, ctx.gpu_sharing, ctx.gpu_paths, ctx.gpu_order or None
    )
    labels = {
        **ctx.extra_create_kwargs.get("labels", {}),
        **gpu.labels,
        **session_labels(request, grant, ctx),
    }
    create_kwargs = {
        **ctx.extra_create_kwargs,
        "image": request.image,
        "name": ctx.name,
        "command": ctx.command,
        "environment": {**ctx.env, **session_env(request, grant), **gpu.env},
        "volumes": ctx.volumes,
        "ports": {f"{ctx.port}/tcp": None},
        "labels": labels,
        "user": ctx.run_as,
    }
    extra = ctx.extra_host_config
    host_config = {
        "network_mode": ctx.network,
        "auto_remove": ctx.auto_remove,
        **({"port_bindings": {ctx.port: (ctx.publish_to,)}} if ctx.publish_to else {}),
        **{key: value for key, value in extra.items() if key != "device_requests"},
        "binds": [
            *convert_volume_binds(ctx.binds),
            *convert_volume_binds(extra.get("binds", [])),
            *convert_volume_binds(gpu.binds),
        ],
        "mounts": [*ctx.mounts, *extra.get("mounts", [])],
        **({"device_requests": gpu.device_requests} if gpu.device_requests else {}),
        **resource_limits(request, ctx.pids_limit),
        "privileged": False,
    }
    return ContainerSpec(create_kwargs, host_config)


def _refuse_docker_socket(ctx: ContainerContext) -> None:
    """A session with the engine's socket could start any container, so no config may add it."""
    sources = [str(key) for key in ctx.binds]
    sources += [str(bind) for bind in ctx.extra_host_config.get("binds", [])]
    sources += [str(mount) for mount in [*ctx.mounts, *ctx.extra_host_config.get("mounts", [])]]
    if any(DOCKER_SOCKET in source for source in sources):
        raise ValueError("Refusing to mount the Docker socket into a session container.")
