"""`ResourceRequest` + `Grant` + context → a Docker Swarm service for one session. Pure: no I/O.

The Swarm-mode twin of `container_spec.build_container_spec`, kubespawner style: it builds the
whole object, and the spawner hands it to the manager as
`APIClient.create_service(**build_service_spec(request, grant, ctx, swarm))`. Labels, environment,
the cgroup figures and the hardening come from `container_spec`'s own functions, so that a session
carries the same `fgpu.` labels and variables in either mode.

What a service spec can and cannot say, on dockerd 20.10 (API 1.41) and docker-py 7.2:

- **Placement.** The grant names the node: `node.hostname==<node>`. Restart condition "none": a
  session that ends stays ended (the spawner reports the exit), and Swarm never moves it to
  another node behind the queue's back.
- **Limits.** The grant's CPU and memory are both limits and reservations (Swarm then never puts
  more on a node than it has, even if the queue and Swarm disagree). The pids limit is
  `Resources.Limits.Pids`, new in API 1.41, which docker-py's `Resources` does not take: it is
  set on the dict. Swarm has no memory-swap setting, so the engine's default applies (swap up to
  the memory limit again, where swap accounting is on): GPU nodes run without swap, as this
  machine does, or the node agent sets `--memory-swap` on the task's container.
- **Hardening.** `CapabilityDrop: ["ALL"]` needs API 1.41: the engine's router silently clears
  it, and `Limits.Pids`, for a client speaking an older version, so Swarm mode must check the
  negotiated API version (and the manager's) before it creates a session. A service
  cannot be privileged at all. `no-new-privileges` cannot be expressed: API 1.41's `Privileges`
  holds only SELinux and credential specs (later APIs add `Privileges.NoNewPrivileges`). On 20.10
  every node sets it engine-wide (`"no-new-privileges": true` in daemon.json, i.e. `dockerd
  --no-new-privileges`), and with every capability dropped, the bounding set included, a setuid
  program gains no capability anyway. The writable layer's size (`storage_opt`) has no field
  either.
- **GPUs.** Swarm has no device requests, and a service cannot pick its runtime. GPU nodes set
  `"default-runtime": "nvidia"` in daemon.json, and the NVIDIA runtime gives the container
  exactly the GPUs in `NVIDIA_VISIBLE_DEVICES`: the granted UUIDs, from the same `gpu_sharing`
  settings as on one host. A session without GPUs, or with simulated ones, gets "void", so an
  image that says `NVIDIA_VISIBLE_DEVICES=all` (every CUDA base image does) sees no GPU on a node
  whose default runtime is NVIDIA's. GPUs are not Swarm generic resources (see
  `queue_service.engine.inventory.swarm_nodes`).
- **Mounts.** Swarm binds are `Mount`s whose host path must exist on the node (the engine creates
  a missing one for a plain container, not for a task): HAMi-core's library, the preload file
  and its lock folder, and the MPS pipe folder, are installed on every GPU node (docs/source/howto/swarm.md, "GPU
  nodes in a Swarm"). HAMi-core's per-session cache is a tmpfs of the task's own instead of a
  host folder.
- **Home.** A local volume stays on its node, so with `SwarmContext.home_root` set the home folder
  is a bind of a folder of `<home_root>`: shared storage (NFS, CephFS) mounted at that path on
  every node. As a home volume (storage.py), a folder belongs to one hub account, whose creation
  time its name carries, `<home_root>/<user>_u<account>`, so a user deleted and created again
  under the same name never gets the old folder; `<home_root>/<user>`, as earlier releases named
  it, stays its account's (`pick_home_account`). Without a root, the context's own mounts are
  used as they are (a volume with a driver that follows the user is the other choice).
- **Network.** The task joins the session's attachable overlay network through the task template
  (the service-level `Networks` field is deprecated). Endpoints are DNS round-robin, because a
  kernel without IPVS (as here) cannot serve service VIPs or the ingress mesh; the proxy reaches
  the task at its own address, or, with `publish_host_port`, at the node's address and the port
  the task publishes in host mode; such a task may also stay on its node's bridge (no network).
  With `vip`, where the site's kernel has IPVS, the endpoint is a VIP and the proxy reaches the
  service by its name on the overlay. Only an overlay of the session's own keeps sessions apart
  (`reachable_sessions` says why the others do not; measured in the lab: a session on another
  node reaches a `host_port` session's server at its node's address).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from docker.types import (
    ContainerSpec,
    EndpointSpec,
    Mount,
    Placement,
    Resources,
    RestartPolicy,
    ServiceMode,
    TaskTemplate,
)

from fgpu_shared.homes import (  # noqa: F401 (pick_home_account: the spawner's name for it)
    home_folder_name,
    pick_home_account,
)
from image_catalog.container_hardening import hardening

from .container_spec import (
    ContainerContext,
    _refuse_docker_socket,
    container_env,
    container_labels,
    resource_limits,
    session_gpu_settings,
)
from .gpu_sharing import HAMI_CACHE_DIR_IN_CONTAINER as HAMI_CACHE_DIR
from .gpu_sharing import session_command
from .grant import Grant
from .request import ResourceRequest

NANO = 10**9
# swarmkit's rule for service names: a DNS name component of at most 63 characters.
_SERVICE_NAME_RE = re.compile(r"^[a-zA-Z0-9](?:[-_]*[A-Za-z0-9]+)*$")
# Engine-local networks: a service on "host" would escape isolation; "bridge" and "none" cannot
# reach the proxy across nodes.
_LOCAL_NETWORKS = {"", "host", "bridge", "none"}


@dataclass(frozen=True)
class SwarmContext:
    """What Swarm mode needs besides the single-host `ContainerContext`."""

    #: The shared storage's root on every node; a user's home is a folder of it. Empty:
    #: no home bind (the `ContainerContext` mounts decide).
    home_root: str = ""
    home_path: str = "/home/jovyan"
    #: Publish the server's port in host mode on the node, for a proxy outside the overlay.
    publish_host_port: bool = False
    #: A VIP endpoint (the service's name resolves to one virtual address), where IPVS exists.
    vip: bool = False
    #: The account part of the home folder's name (`pick_home_account`); empty: the plain one.
    home_account: str = ""


def build_service_spec(
    request: ResourceRequest, grant: Grant, ctx: ContainerContext, swarm: SwarmContext
) -> dict:
    """Keyword arguments for docker-py's `APIClient.create_service` for one session."""
    _refuse_docker_socket(ctx)
    _check_service_name(ctx.name)
    _check_network(ctx.network, swarm.publish_host_port)
    gpu = session_gpu_settings(grant, ctx)
    labels = container_labels(request, grant, ctx, gpu)
    container = ContainerSpec(
        image=request.image,
        # A service's Command replaces the image's ENTRYPOINT; Args replaces its CMD, which is
        # what `command` does for a plain container.
        args=session_command(ctx.command, gpu),
        env=container_env(request, grant, ctx, gpu),
        user=ctx.run_as,
        labels=labels,
        mounts=session_mounts(ctx, swarm, gpu.binds, gpu.mounts),
        cap_drop=hardening(ctx.extra_host_config)["cap_drop"],
    )
    task = TaskTemplate(
        container_spec=container,
        resources=service_resources(request, ctx.pids_limit),
        restart_policy=RestartPolicy(condition="none"),
        placement=Placement(constraints=[f"node.hostname=={grant.node}"]),
        networks=[ctx.network] if ctx.network else [],
    )
    return {
        "task_template": task,
        "name": ctx.name,
        "labels": labels,
        "mode": ServiceMode("replicated", replicas=1),
        "endpoint_spec": _endpoint(ctx.port, swarm),
    }


def service_resources(request: ResourceRequest, pids_limit: int) -> Resources:
    """The slice as limits and reservations, from the single-host figures, plus the pids cap."""
    limits = resource_limits(request, pids_limit)
    cpu = round(limits["cpu_quota"] / limits["cpu_period"] * NANO)
    resources = Resources(
        cpu_limit=cpu,
        mem_limit=limits["mem_limit"],
        cpu_reservation=cpu,
        mem_reservation=limits["mem_limit"],
    )
    resources["Limits"]["Pids"] = limits["pids_limit"]
    return resources


def session_mounts(
    ctx: ContainerContext, swarm: SwarmContext, gpu_binds: dict, gpu_mounts: list
) -> list[Mount]:
    """The home bind, the context's and the admin's mounts and binds, and the GPU mode's, all as
    `Mount`s (an admin's other `extra_host_config` settings have no Swarm form and are not used)."""
    extra = ctx.extra_host_config
    mounts = [
        *ctx.mounts,
        *_binds_as_mounts(ctx.binds),
        *extra.get("mounts", []),
        *_binds_as_mounts(extra.get("binds", {})),
        *_gpu_binds_as_mounts(gpu_binds),
        *gpu_mounts,
    ]
    if not swarm.home_root:
        return mounts
    home = home_mount(swarm, ctx.user)
    if any(mount["Target"].rstrip("/") == home["Target"].rstrip("/") for mount in mounts):
        raise ValueError(
            f"Another mount targets the home folder {swarm.home_path}; in Swarm mode the home "
            "is the shared bind (leave the single-host home volume out)"
        )
    return [home, *mounts]


def home_mount(swarm: SwarmContext, user: str) -> Mount:
    """`<home_root>/<user>` (or its account's own folder) bound at the home folder."""
    folder = home_folder(swarm, user, swarm.home_account)
    return Mount(target=swarm.home_path, source=folder, type="bind")


def home_folder(swarm: SwarmContext, user: str, account: str = "") -> str:
    """`<home_root>/<user>` (with an `account`, `<home_root>/<user>_u<account>`), the name escaped
    as for home volumes, so that no user name can climb out of the root, and no name is another
    name's account folder."""
    if not swarm.home_root.startswith("/"):
        raise ValueError(f"The shared home root must be an absolute path, not {swarm.home_root!r}")
    return f"{swarm.home_root.rstrip('/')}/{home_folder_name(user, account)}"


def _gpu_binds_as_mounts(binds: dict) -> list[Mount]:
    """The GPU mode's binds; HAMi-core's per-session folders (its cache folder and the lock
    folder in it) become tmpfs mounts of the task's own, since Swarm refuses a bind whose folder
    the node lacks and no one could make it there first. They are only shared by the session's
    own processes, and end with them."""
    caches = [source for source, v in binds.items() if v["bind"] == HAMI_CACHE_DIR]
    own = {s for s in binds if any(s == c or s.startswith(f"{c}/") for c in caches)}
    mounts = _binds_as_mounts({k: v for k, v in binds.items() if k not in own})
    mounts += [Mount(target=binds[s]["bind"], source=None, type="tmpfs") for s in sorted(own)]
    return mounts


def _binds_as_mounts(binds: dict | list) -> list[Mount]:
    """docker-py's binds: a dict (`{host: target}` or `{host: {"bind": target, "mode": "ro"}}`)
    or a list of "host:target[:mode]" strings."""
    if isinstance(binds, list):
        return [Mount.parse_mount_string(bind) for bind in binds]
    mounts = []
    for source, spec in binds.items():
        target, mode = (
            (spec["bind"], spec.get("mode", "rw")) if isinstance(spec, dict) else (spec, "rw")
        )
        mounts.append(Mount(target=target, source=source, type="bind", read_only="ro" in mode))
    return mounts


def _endpoint(port: int, swarm: SwarmContext) -> EndpointSpec:
    if swarm.vip:
        return EndpointSpec(mode="vip")
    if not swarm.publish_host_port:
        return EndpointSpec(mode="dnsrr")
    # Host mode, no published port: the engine picks a free one, read back from the task's status.
    return EndpointSpec(
        mode="dnsrr", ports=[{"Protocol": "tcp", "TargetPort": port, "PublishMode": "host"}]
    )


def reachable_sessions(endpoint: str, network_per_session: bool) -> str:
    """Why sessions could reach one another's servers with this endpoint; "" when they cannot.

    Only an overlay of each session's own, which the hub's container joins, keeps them apart:
    a host-mode port is published on every address of the node, where any session on any node
    reaches it (Swarm cannot bind it to one address, and a session must reach the nodes' network
    for the hub), and an overlay has no `icc` switch."""
    if endpoint == "host_port":
        return (
            "endpoint 'host_port' publishes every session's server on its node's address, where "
            "any other session reaches it"
        )
    if not network_per_session:
        return (
            f"endpoint {endpoint!r} without network_per_session puts every session on one "
            "overlay, where each reaches every other (an overlay has no icc switch)"
        )
    return ""


def _check_service_name(name: str) -> None:
    if len(name) > 63 or not _SERVICE_NAME_RE.match(name):
        raise ValueError(
            f"{name!r} cannot name a Swarm service: at most 63 letters, digits, '-' and '_', "
            "starting and ending with a letter or digit"
        )


def _check_network(network: str, publish_host_port: bool) -> None:
    # A task that publishes its port on the node may stay on the node's bridge (no network).
    if network == "" and publish_host_port:
        return
    if network in _LOCAL_NETWORKS:
        raise ValueError(
            f"A Swarm session needs an attachable overlay network, not {network or 'none'!r}"
        )
