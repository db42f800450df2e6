"""`ResourceRequest` + `Grant` → Docker create arguments. Pure: no I/O, so every limit is unit-tested.

Like kubespawner's `objects.py`, this module builds the whole object; the spawner gathers the inputs
(environment, command) and hands the result to the engine. Settings that keep a session inside its
slice are applied last, so that no admin `extra_host_config` can loosen them by accident: the
cgroup limits, the GPU settings of the grant, and the hardening (every capability dropped, none
added back, `no-new-privileges`, not privileged, the writable layer's size). An admin's binds and
mounts are added to the session's (HAMi-core's library, preload file and cache stay mounted), an
admin's `security_opt` entries are kept unless they loosen confinement, and GPUs come only from the
grant, so an admin's `device_requests` is dropped.

The session needs no capability: jupyterhub-singleuser, its terminals and TensorBoard run as the
unprivileged `run_as` user, which holds none anyway; dropping them all also empties the bounding
set, so nothing started in the container (`docker exec -u root` included) gets any back.

`writable_layer_support` decides, from what the engine reports, whether the storage driver can
bound the container's writable layer (`storage_opt` size); the spawner asks only when it can.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from docker.utils import convert_volume_binds

from image_catalog.container_hardening import hardening

from .gpu_sharing import GpuPaths, GpuSettings, build_gpu_settings, session_command
from .grant import Grant
from .request import ResourceRequest

CPU_PERIOD_US = 100_000
LABEL_PREFIX = "fgpu."
DOCKER_SOCKET = "docker.sock"
# An admin's extra_host_config may not set these: GPUs come from the grant, capabilities from nobody.
_NOT_FROM_ADMINS = ("device_requests", "cap_add")


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
    writable_layer_size: int = 0
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
        # Batch jobs end by themselves: the queue service watches these containers' exits.
        **({f"{LABEL_PREFIX}kind": "batch"} if request.batch else {}),
        # Which hub made it: hubs sharing an engine adopt or stop only their own sessions.
        **({f"{LABEL_PREFIX}deployment": ctx.deployment_id} if ctx.deployment_id else {}),
    }


def session_env(request: ResourceRequest, grant: Grant) -> dict[str, str]:
    """Tell the session what it holds, so notebooks can size their work to it.

    `CPU_LIMIT` (cores) and `MEM_LIMIT` (bytes) are the names KubeSpawner sets and
    jupyter-resource-usage reads: JupyterLab's status bar then shows usage against the slice."""
    return {
        "FGPU_SESSION_ID": grant.session_id,
        "FGPU_CPU": f"{request.cpu:g}",
        "FGPU_MEM": str(request.mem),
        "FGPU_FGPU": f"{request.fgpu:g}",
        "CPU_LIMIT": f"{request.cpu:g}",
        "MEM_LIMIT": str(request.mem),
        # What a batch job runs (job_runner.py reads it).
        **({"FGPU_JOB": request.job} if request.batch else {}),
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


def session_gpu_settings(grant: Grant, ctx: ContainerContext) -> GpuSettings:
    """The grant's GPUs in the context's `gpu_sharing` mode."""
    return build_gpu_settings(
        grant, ctx.gpu_memory, ctx.gpu_sharing, ctx.gpu_paths, ctx.gpu_order or None
    )


def container_labels(
    request: ResourceRequest, grant: Grant, ctx: ContainerContext, gpu: GpuSettings
) -> dict[str, str]:
    """Every label of a session's container, in single-host and Swarm mode alike; the session's
    own labels come last so that no admin label can fake them."""
    return {
        **ctx.extra_create_kwargs.get("labels", {}),
        **gpu.labels,
        **session_labels(request, grant, ctx),
    }


def container_env(
    request: ResourceRequest, grant: Grant, ctx: ContainerContext, gpu: GpuSettings
) -> dict[str, str]:
    """Every environment variable of a session, in single-host and Swarm mode alike. The user's
    own (`env`, checked when the request was parsed) come first, so that even one the check
    missed cannot replace the hub's; the GPU settings come last, so that no configured variable
    widens the GPUs a session sees."""
    return {**dict(request.env), **ctx.env, **session_env(request, grant), **gpu.env}


def build_container_spec(
    request: ResourceRequest, grant: Grant, ctx: ContainerContext
) -> ContainerSpec:
    """The full create/host_config for a session container."""
    _refuse_docker_socket(ctx)
    gpu = session_gpu_settings(grant, ctx)
    create_kwargs = {
        **ctx.extra_create_kwargs,
        "image": request.image,
        "name": ctx.name,
        "command": session_command(ctx.command, gpu),
        "environment": container_env(request, grant, ctx, gpu),
        "volumes": ctx.volumes,
        "ports": {f"{ctx.port}/tcp": None},
        "labels": container_labels(request, grant, ctx, gpu),
        "user": ctx.run_as,
    }
    extra = ctx.extra_host_config
    host_config = {
        "network_mode": ctx.network,
        "auto_remove": ctx.auto_remove,
        **({"port_bindings": {ctx.port: (ctx.publish_to,)}} if ctx.publish_to else {}),
        **{key: value for key, value in extra.items() if key not in _NOT_FROM_ADMINS},
        "binds": [
            *convert_volume_binds(ctx.binds),
            *convert_volume_binds(extra.get("binds", [])),
            *convert_volume_binds(gpu.binds),
        ],
        "mounts": [*ctx.mounts, *extra.get("mounts", []), *gpu.mounts],
        **({"device_requests": gpu.device_requests} if gpu.device_requests else {}),
        **resource_limits(request, ctx.pids_limit),
        **hardening(extra, ctx.writable_layer_size),
    }
    return ContainerSpec(create_kwargs, host_config)


@dataclass(frozen=True)
class LayerLimitSupport:
    """Whether the engine can bound a container's writable layer, and if not, why."""

    supported: bool
    reason: str


# Drivers whose `storage_opt` size works on any backing filesystem (Docker's `--storage-opt` docs).
_SIZED_DRIVERS = ("btrfs", "zfs", "devicemapper", "windowsfilter")
_PROJECT_QUOTA_OPTIONS = {"pquota", "prjquota"}


def writable_layer_support(
    driver: str, driver_status: list, mount_options: set[str] | None
) -> LayerLimitSupport:
    """Can `storage_opt={"size": ...}` be used? From `docker info`'s `Driver` and `DriverStatus`
    and the mount options of the filesystem under the engine's root dir (None: unknown).

    overlay2 sizes a layer only on xfs mounted with project quotas (pquota); the engine refuses
    to create a container with a size on anything else, so the limit is asked for only when this
    says yes."""
    if driver in _SIZED_DRIVERS:
        return LayerLimitSupport(True, f"the {driver} storage driver limits the layer's size")
    if driver not in ("overlay2", "overlay"):
        return LayerLimitSupport(False, f"the {driver} storage driver has no size limit")
    backing = dict((pair[0], pair[1]) for pair in driver_status if len(pair) == 2).get(
        "Backing Filesystem", "unknown"
    )
    if backing != "xfs":
        return LayerLimitSupport(
            False, f"{driver} on {backing} has no size limit (it needs xfs mounted with pquota)"
        )
    if mount_options is None:
        return LayerLimitSupport(False, f"{driver} on xfs, but its mount options are unknown")
    if not mount_options & _PROJECT_QUOTA_OPTIONS:
        return LayerLimitSupport(False, f"{driver} on xfs mounted without pquota")
    return LayerLimitSupport(True, f"{driver} on xfs with project quotas limits the layer's size")


def mount_options_of(path: str, proc_mounts: str) -> set[str] | None:
    """The options of the mount that holds `path`, from the text of /proc/mounts (the longest
    mount point that contains it); None when no line matches."""
    best, options = "", None
    for line in proc_mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, options = point, set(fields[3].split(","))
    return options


def _refuse_docker_socket(ctx: ContainerContext) -> None:
    """A session with the engine's socket could start any container, so no config may add it."""
    sources = [str(key) for key in ctx.binds]
    sources += [str(bind) for bind in ctx.extra_host_config.get("binds", [])]
    sources += [str(mount) for mount in [*ctx.mounts, *ctx.extra_host_config.get("mounts", [])]]
    if any(DOCKER_SOCKET in source for source in sources):
        raise ValueError("Refusing to mount the Docker socket into a session container.")
