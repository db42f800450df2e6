"""`FGPUSwarmSpawner`: the fGPU spawner on Docker Swarm, one service per session.

Everything the single-host spawner does (the request, the grant from the queue, the progress while
PENDING, the hardening, the release once the session is gone) is inherited. What differs is the
object: a Swarm service built by `service_spec.build_service_spec`, pinned to the node the grant
names, created on the Swarm manager the environment points at (DOCKER_HOST, DOCKER_TLS_VERIFY,
DOCKER_CERT_PATH; `eval "$(scripts/swarm-lab up ...)"` sets them for the local lab). The shipped
config picks this class when `FGPU_ENGINE=swarm`.

How the proxy reaches a session (`endpoint`), and whether sessions reach one another:
- `overlay` (default): the task joins an attachable overlay network, and the proxy reaches the
  task's own address on it: for a hub that runs on the overlay itself (a container attached to
  it). Endpoints are DNS round-robin, because a kernel without IPVS cannot serve VIPs. The hub,
  not only its proxy, must be on the overlay: it checks a new server's own address before it
  routes to it. With `hub_container` the spawner joins that container (the hub's, on the
  manager's engine) to the session's overlay, and the session reaches the hub's API at the
  container's name there. An overlay has no `icc` switch, so on one shared overlay every session
  reaches every other: `network_per_session` (default on) gives each session an overlay of its
  own, which only it and the hub's container join.
- `vip`: the same overlay, with a VIP endpoint, and the proxy reaches the service by its name:
  for sites whose kernels have IPVS. Not testable here (no IPVS); the spec is unit-tested.
- `host_port`: the task publishes its server's port in host mode on its node, and the proxy
  reaches the node's address and that port: no IPVS and no hub inside the Swarm, as the lab's
  hub beside it. Swarm publishes on every address of the node, where every other session (on
  any node: they reach the nodes' network, as they reach the hub) reaches it too.
A shared overlay or `host_port` is refused unless `allow_reachable_sessions` says the site
accepts it (`service_spec.reachable_sessions` says why), so that isolation never rests on a
default.

The manager cannot see a task's container (it runs on another engine): the task's state, exit code
and error come from the manager's task list, and the logs from the service's log stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

import docker.errors
from traitlets import Bool, CaselessStrEnum, Float, Unicode, default

from fgpu_shared.registry_auth import RegistryAuthError, read_registry_auth

from .network import SessionNetwork, pick_network
from .service_spec import (
    SwarmContext,
    build_service_spec,
    home_folder,
    pick_home_account,
    reachable_sessions,
)
from .spawn_errors import spawn_error
from .spawner import FGPUSpawner
from .storage import account_tag, home_volume_name

#: Task states on the way to running (docker's `TaskState`): the session is starting.
STARTING_STATES = {"new", "pending", "assigned", "accepted", "preparing", "ready", "starting"}
#: Task states that hold a container, or are about to.
LIVE_STATES = STARTING_STATES | {"running"}
#: Seconds between two looks at a task while it starts or goes away.
_TASK_POLL_SECONDS = 0.25
#: A shared home folder: its owner (the session user) only.
HOME_FOLDER_MODE = 0o700


class FGPUSwarmSpawner(FGPUSpawner):
    """Spawn single-user servers as Docker Swarm services pinned to the granted node."""

    object_type = "service"
    object_id_key = "ID"

    #: The account part of this account's home folder's name, once picked (prepare_home_folder).
    _home_account = ""

    registry = Unicode(
        "",
        config=True,
        help="""
        Registry (host[:port]) that every node pulls session images from, e.g. `10.213.0.1:5000`
        (the lab's). A catalog reference without a registry of its own (`fgpu/jupyter-base:py3.11`)
        is pulled from here; the site pushes its built images to it (`scripts/swarm-lab` does it
        for the lab). Empty: nodes pull references as the catalog writes them.

        Example::

            c.FGPUSwarmSpawner.registry = "registry.example.org:5000"
        """,
    )
    registry_auth_file = Unicode(
        "",
        config=True,
        help="""
        File with the credentials of `registry` (JSON: `username`, `password`,
        `serveraddress`; not readable by every user), for a registry that wants a login for
        pulls, as a site's should. The spawner logs the manager's client in with them once, and
        docker-py sends them with every service it creates, so Swarm hands them to the node that
        pulls the image; the session itself never sees them. `scripts/swarm-lab up` exports the
        lab's as FGPU_SWARM_REGISTRY_AUTH_FILE. Empty: the registry is asked without a login.

        Example::

            c.FGPUSwarmSpawner.registry_auth_file = "/etc/fgpu-hub/registry-auth.json"
        """,
    )
    home_root = Unicode(
        "",
        config=True,
        help="""
        Shared storage (NFS, CephFS...) mounted at this same path on every node and on the hub's
        host. Each account's home folder is `<home_root>/<user>_u<account creation time>` (or
        `<home_root>/<user>`, as earlier releases named it), bound into the session, so it
        follows the user from node to node; the hub makes a missing folder (owned by `run_as`). A
        user deleted and created again under the same name gets a new one; the old folder stays
        as it was. Empty: the home is the `home_volume` on whichever node the session runs (a local volume
        stays on its node; a volume driver that follows the user is the other way).

        Example::

            c.FGPUSwarmSpawner.home_root = "/mnt/nfs/fgpu-homes"
        """,
    )
    endpoint = CaselessStrEnum(
        ["host_port", "overlay", "vip"],
        default_value="overlay",
        config=True,
        help="""
        How the proxy reaches a session: `overlay` (the default) reaches the task's address on
        its overlay network (a hub on that overlay: `hub_container`), through a DNS round-robin
        endpoint; `vip` reaches the service by its name on that overlay through a virtual IP,
        for sites whose kernels have IPVS (these machines' do not); `host_port` publishes the
        server's port in host mode on the session's node (a hub beside the Swarm), where every
        other session reaches it too, so it needs `allow_reachable_sessions`.

        Example::

            c.FGPUSwarmSpawner.endpoint = "host_port"
            c.FGPUSwarmSpawner.allow_reachable_sessions = True
        """,
    )
    allow_reachable_sessions = Bool(
        False,
        config=True,
        help="""
        Accept an endpoint where sessions can reach one another's servers: `host_port`, or an
        overlay shared by all sessions (`network_per_session` off). Off: such a spawn is refused
        with a config error, so that isolation never rests on a setting left at its default.
        A site that turns it on firewalls the nodes itself (docs/source/howto/adding-nodes.md, "Adding
        nodes").

        Example::

            c.FGPUSwarmSpawner.allow_reachable_sessions = True
        """,
    )
    hub_container = Unicode(
        "",
        config=True,
        help="""
        With `endpoint = "overlay"`: the container, on the engine `DOCKER_HOST` names (the
        manager), in whose network the hub and its proxy run: the hub's own container at a site;
        in the lab, the container whose network namespace the hub's process entered. Before a
        session starts, the spawner joins this container to the session's overlay, and the
        session reaches the hub's API at the container's name there (Docker's DNS on the overlay)
        and the hub's port; the hub should then listen on all its addresses. The manager must be
        `active`: Swarm gives a drained or paused node's containers no place on an overlay.
        Empty: the hub is on the overlay by other means, and sessions use the hub's connect URL.

        Example::

            c.FGPUSwarmSpawner.hub_container = "fgpu-hub"
        """,
    )
    network_per_session = Bool(
        True,
        config=True,
        help="""
        With `endpoint = "overlay"` and `hub_container`: each session gets an attachable overlay of
        its own (named as its service), which only the session and the hub's container join, so
        sessions cannot reach one another (an overlay has no `icc` switch: on one shared overlay,
        `network_name`, every session reaches every other; turning this off needs
        `allow_reachable_sessions`). The hub's container leaves the network, and the
        network is removed, once the session's task has left it. Each such network takes one
        subnet of the Swarm's address pool (a /24 unless `docker swarm init
        --default-addr-pool-mask-length` says otherwise: 256 sessions in a /16), and one attachment
        of the hub's container.

        Example::

            c.FGPUSwarmSpawner.network_per_session = False
            c.FGPUSwarmSpawner.allow_reachable_sessions = True
        """,
    )
    task_start_timeout = Float(
        300.0,
        config=True,
        help="""
        Seconds a session's task may take to start on its node (image pull included) before the
        spawn fails with the task's own state and error.

        Example::

            c.FGPUSwarmSpawner.task_start_timeout = 900
        """,
    )
    task_exit_timeout = Float(
        30.0,
        config=True,
        help="""
        Seconds to wait, after its service is removed, for a session's task to be shut down on
        its node. Its grant is given back only then: until the node has stopped the container,
        the slice is still in use.

        Example::

            c.FGPUSwarmSpawner.task_exit_timeout = 60
        """,
    )

    @default("cmd")
    def _default_cmd(self):
        # DockerSpawner reads the image's CMD from the engine, and the manager has no images; the
        # catalog admits only images that start `jupyterhub-singleuser` (its image check).
        return ["jupyterhub-singleuser"]

    @default("network_name")
    def _default_network_name(self):
        return "fgpu-sessions-overlay"

    @default("hub_connect_url")
    def _default_hub_connect_url(self):
        # The hub's container is on every session's overlay, where Docker's DNS knows its name.
        if self.endpoint == "overlay" and self.hub_container:
            return f"http://{self.hub_container}:{urlparse(self.hub.url).port}"
        return None

    @property
    def overlay_name(self) -> str:
        """The session's overlay: its own (named as its service) or the shared one."""
        return self.object_name if self.network_per_session else self.network_name

    @property
    def swarm_context(self) -> SwarmContext:
        return SwarmContext(
            home_root=self.home_root,
            home_path=self.home_mount_path,
            publish_host_port=self.endpoint == "host_port",
            vip=self.endpoint == "vip",
            home_account=self._home_account,
        )

    def session_image(self, reference: str) -> str:
        """Where the nodes pull `reference` from: the site's registry unless it names its own."""
        first = reference.split("/", 1)[0]
        names_registry = "/" in reference and ("." in first or ":" in first or first == "localhost")
        if not self.registry or names_registry or reference.startswith("sha256:"):
            return reference
        return f"{self.registry.rstrip('/')}/{reference}"

    async def pull_image(self, image):
        """Nodes pull from the registry themselves; a missing image fails the task, whose error
        ("No such image: ...") `start_object` reports."""

    async def session_network(self):
        """The attachable overlay of `overlay` endpoints (created when missing); none otherwise."""
        self._refuse_reachable_sessions()
        if self.endpoint == "host_port":
            return SessionNetwork("", "", "")  # the node's bridge
        if self.network_per_session and not self.hub_container:
            raise spawn_error(
                "FGPUSwarmSpawner.network_per_session needs hub_container: no proxy could join "
                "each session's own overlay",
                reason="config",
                status_code=500,
            )
        try:
            return await asyncio.to_thread(self._ensure_overlay)
        except docker.errors.APIError as e:
            message = f"No overlay network {self.overlay_name!r}: {e.explanation or e}"
            raise spawn_error(message, reason="config", status_code=500) from None

    def _refuse_reachable_sessions(self) -> None:
        reason = reachable_sessions(self.endpoint, self.network_per_session)
        if reason and not self.allow_reachable_sessions:
            raise spawn_error(
                f"Sessions could reach one another: {reason}. Run the hub in a container on the "
                "manager (FGPUSwarmSpawner.hub_container) with endpoint 'overlay' and "
                "network_per_session, or accept it with "
                "FGPUSwarmSpawner.allow_reachable_sessions = True (docs/source/howto/swarm.md, 'Swarm mode')",
                reason="config",
                status_code=500,
            )

    def _ensure_overlay(self):
        network = self._overlay()
        if self.hub_container:
            self._attach_hub(network)
        return network

    def _overlay(self) -> SessionNetwork:
        network = self._find_overlay()
        if network is None:
            try:
                created = self.client.create_network(
                    self.overlay_name,
                    driver="overlay",
                    attachable=True,
                    labels={"fgpu.role": "session" if self.network_per_session else "sessions"},
                )
                return SessionNetwork(created["Id"], self.overlay_name, "")
            except docker.errors.APIError:
                # The first spawns of a hub (or of two hubs) all find no network and all make
                # it; the manager keeps names unique and refuses every one but the first, whose
                # network the others then use. It refuses with 409, or, when its store sees the
                # clash first, with 500 "name conflicts with an existing object" (seen here).
                network = self._find_overlay()
                if network is None:
                    raise
        if not _attachable_overlay(network):
            # The list can show a network another spawn is making before all its settings: ask
            # for the whole network before calling it another kind (seen once in a race of six).
            network = self.client.inspect_network(network["Id"])
        if not _attachable_overlay(network):
            raise docker.errors.APIError(
                f"{self.overlay_name!r} exists but is not an attachable overlay network"
            )
        return SessionNetwork(network["Id"], self.overlay_name, "")

    def _find_overlay(self) -> dict | None:
        """The network called exactly `overlay_name` (the engine's filter matches parts)."""
        return pick_network(self.overlay_name, self.client.networks(names=[self.overlay_name]))

    def _attach_hub(self, network: SessionNetwork) -> None:
        """Join the hub's container to the session's overlay, unless it is there already (the
        shared overlay, after the first spawn; two spawns racing to join it)."""
        if self._hub_attached(network.id):
            return
        try:
            self.client.connect_container_to_network(self.hub_container, network.id)
        except docker.errors.APIError:
            if not self._hub_attached(network.id):
                raise

    def _hub_attached(self, network_id: str) -> bool:
        attached = self.client.inspect_container(self.hub_container)["NetworkSettings"]["Networks"]
        return any(n.get("NetworkID") == network_id for n in attached.values())

    def _remove_session_network(self) -> None:
        """The hub's container leaves the session's own overlay, and the overlay goes once the
        session's task has left it (the manager refuses to remove a network in use)."""
        network = self._find_overlay()
        if network is None:
            return
        if self.hub_container:
            with contextlib.suppress(docker.errors.APIError):
                self.client.disconnect_container_from_network(self.hub_container, network["Id"])
        deadline = time.monotonic() + self.task_exit_timeout
        while True:
            try:
                self.client.remove_network(network["Id"])
                return
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as e:
                if time.monotonic() > deadline:
                    self.log.warning("Overlay %s not removed: %s", network["Name"], e)
                    return
            time.sleep(_TASK_POLL_SECONDS)

    async def drop_session_network(self) -> None:
        if self.endpoint == "host_port" or not self.network_per_session or not self.object_name:
            return
        try:
            await asyncio.to_thread(self._remove_session_network)
        except docker.errors.APIError as e:
            self.log.warning("Overlay %s not removed: %s", self.overlay_name, e)

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            await self.drop_session_network()

    async def _abandon_start(self, end_reason: str | None = None) -> None:
        await super()._abandon_start(end_reason)
        await self.drop_session_network()

    @property
    def storage_settings(self):
        settings = super().storage_settings
        # The shared home root's bind (service_spec.home_mount) takes the home volume's place.
        return dataclasses.replace(settings, home_volume="") if self.home_root else settings

    async def home_volume_of_account(self) -> str:
        # A shared home root replaces the volume; the manager cannot inspect nodes' volumes.
        if self.home_root or not self.home_volume:
            return ""
        return home_volume_name(self.home_volume, self.user.name, account_tag(self.user.created))

    async def writable_layer_limit(self) -> int:
        return 0  # a service spec has no storage_opt (service_spec.py)

    async def create_object(self):
        request = dataclasses.replace(
            self.resource_request, image=self.session_image(self.resource_request.image)
        )
        try:
            if self.home_root:
                await asyncio.to_thread(self.prepare_home_folder)
            spec = build_service_spec(
                request, self.grant, await self.container_context(), self.swarm_context
            )
        except (OSError, ValueError) as e:
            raise spawn_error(str(e), reason="config", status_code=500) from None
        await self.log_in_to_registry()
        try:
            return await self.docker("create_service", **spec)
        except docker.errors.APIError as e:
            raise self._engine_refused("create", e) from None

    async def log_in_to_registry(self) -> None:
        """Log the client in with `registry_auth_file`'s credentials, so that the service
        carries them to its node (once per client: docker-py keeps them and skips the engine's
        check afterwards)."""
        if not self.registry_auth_file:
            return
        try:
            auth = await asyncio.to_thread(read_registry_auth, self.registry_auth_file)
        except RegistryAuthError as e:
            message = f"FGPUSwarmSpawner.registry_auth_file: {e}"
            raise spawn_error(message, reason="config", status_code=500) from None
        try:
            await self.docker(
                "login", auth["username"], auth["password"], registry=auth["serveraddress"]
            )
        except docker.errors.APIError as e:
            message = (
                f"the registry {auth['serveraddress']} refused the hub's login: {e.explanation}"
            )
            raise spawn_error(message, reason="config", status_code=500) from None

    def prepare_home_folder(self) -> None:
        """Make the user's shared home folder, owned by the session user and closed to everyone
        else: Swarm refuses a bind whose source is missing on the node, and the shared storage
        shows the hub's mkdir on every node."""
        if not Path(self.home_root).is_dir():
            raise OSError(
                f"The shared home root {self.home_root} is not mounted on the hub's host; mount "
                "the same shared storage there as on every node"
            )
        self._home_account = self.home_account_now()
        folder = Path(home_folder(self.swarm_context, self.user.name, self._home_account))
        if not folder.is_dir():
            folder.mkdir(mode=HOME_FOLDER_MODE)
            uid, _, gid = self.run_as.partition(":")
            os.chown(folder, int(uid), int(gid or uid))
        # Every session runs as the same uid:gid, so a group bit would let any account of that
        # gid on a node or storage client read every home; homes an older hub made 0750 close.
        folder.chmod(HOME_FOLDER_MODE)

    def home_account_now(self) -> str:
        """Which of the user's folders is this account's (service_spec.pick_home_account): a
        folder a deleted user of the same name left stays as it is, out of reach."""
        account = account_tag(self.user.created)
        own = Path(home_folder(self.swarm_context, self.user.name, account))
        plain = Path(home_folder(self.swarm_context, self.user.name))
        modified = datetime.fromtimestamp(plain.stat().st_mtime, UTC) if plain.is_dir() else None
        return pick_home_account(account, self.user.created, own.is_dir(), modified)

    async def start_object(self):
        """Wait until the session's task runs on its node; a task the node rejects or that
        fails ends the spawn with Swarm's own words."""
        deadline = asyncio.get_running_loop().time() + self.task_start_timeout
        while True:
            task = await self.session_task()
            state = task["Status"]["State"] if task else await self._state_without_task()
            if state == "running":
                return
            if state not in STARTING_STATES:
                raise self._task_failed(task, state)
            if asyncio.get_running_loop().time() > deadline:
                raise self._task_failed(task, f"still {state} after {self.task_start_timeout:g} s")
            await asyncio.sleep(_TASK_POLL_SECONDS)

    async def _state_without_task(self) -> str:
        """The manager stores a service first and makes its task a moment later (longer on a
        loaded manager): a service without a task yet is starting; a removed one is not."""
        try:
            await self.docker("inspect_service", self.object_id)
        except docker.errors.NotFound:
            return "missing: the service was removed"
        return "new"

    def _task_failed(self, task: dict | None, state: str):
        status = (task or {}).get("Status") or {}
        detail = status.get("Err") or status.get("Message") or "no detail from Swarm"
        node = self.grant.node if self.grant else "its node"
        message = f"The session's Swarm task on {node} did not start ({state}): {detail}"
        self.log.error("%s: %s", self.object_name, message)
        return spawn_error(message, reason="engine", status_code=500)

    async def session_task(self) -> dict | None:
        """The session's newest task (a service with restart condition "none" has one)."""
        tasks = await self._tasks()
        return max(tasks, key=lambda t: t.get("CreatedAt", ""), default=None)

    async def _tasks(self, service_id: str = "") -> list[dict]:
        # By name, not by service: the tasks of a removed service are still listed (desired state
        # "remove") until its node has shut them down, and stop() waits for exactly that.
        tasks = await self.docker("tasks", filters={"name": self.object_name})
        service_id = service_id or self.object_id
        return [t for t in tasks if not service_id or t.get("ServiceID") == service_id]

    async def get_ip_and_port(self):
        task = await self.session_task()
        if task is None:
            raise spawn_error(
                f"The session's task vanished from the Swarm ({self.object_name})",
                reason="engine",
                status_code=500,
            )
        if self.endpoint == "vip":
            return self.object_name, self.port  # Docker's DNS on the overlay names the VIP
        if self.endpoint == "overlay":
            return task_address(task, (await self.session_network()).id), self.port
        node = await self.docker("inspect_node", task["NodeID"])
        return node["Status"]["Addr"], published_port(task, self.port)

    async def exit_code(self) -> int | None:
        task = await self.session_task()
        if task is not None and task["Status"]["State"] in LIVE_STATES:
            return None
        status = (task or {}).get("Status") or {}
        return (status.get("ContainerStatus") or {}).get("ExitCode", -1)

    async def log_tail(self, lines: int) -> str:
        def read() -> bytes:
            chunks = self.client.service_logs(self.object_id, stdout=True, stderr=True, tail=lines)
            return b"".join(chunks)

        try:
            text = (await asyncio.to_thread(read)).decode(errors="replace")
        except docker.errors.APIError as e:
            return f"(no logs from the Swarm: {e.explanation or e})"
        return text.strip()

    async def poll(self):
        """None while the session's task is starting or running; its exit code (0 when the
        service is gone) once it is not."""
        if not self.object_id:
            return 0
        try:
            # A removed service's task stays listed while its node is down: the service decides.
            await self.docker("inspect_service", self.object_id)
            return await self.exit_code()
        except docker.errors.NotFound:
            return 0

    async def stop_object(self):
        """Removing the service (remove_object) is what stops its task."""

    async def remove_object(self):
        with contextlib.suppress(docker.errors.NotFound):
            await self.docker("remove_service", self.object_id)

    async def remove_now(self) -> None:
        await self.docker("remove_service", self.object_id)

    async def _still_there(self, service_id: str) -> bool:
        """Whether the node still runs the removed service's task after `task_exit_timeout`."""
        deadline = asyncio.get_running_loop().time() + self.task_exit_timeout
        while asyncio.get_running_loop().time() < deadline:
            tasks = await self._tasks(service_id)
            live = [t for t in tasks if t["Status"]["State"] in LIVE_STATES]
            # A node that is down stops nothing until it is back, and then it stops the tasks
            # of removed services first; the queue service does not place on it meanwhile.
            if not live or await self._all_on_down_nodes(live):
                return False
            await asyncio.sleep(_TASK_POLL_SECONDS)
        return True

    async def _all_on_down_nodes(self, tasks: list[dict]) -> bool:
        nodes = await self.docker("nodes")
        down = {n["ID"] for n in nodes if (n.get("Status") or {}).get("State") == "down"}
        return all(t.get("NodeID") in down for t in tasks)


def task_address(task: dict, network_id: str) -> str:
    """The task's address on `network_id`, from the manager's task (`NetworksAttachments`)."""
    for attachment in task.get("NetworksAttachments") or []:
        if (attachment.get("Network") or {}).get("ID") == network_id:
            for address in attachment.get("Addresses") or []:
                return address.split("/", 1)[0]
    raise RuntimeError(f"Task {task.get('ID', '?')[:12]} has no address on network {network_id}")


def published_port(task: dict, target_port: int) -> int:
    """The node port that a host-mode task publishes for `target_port`."""
    for port in (task.get("Status") or {}).get("PortStatus", {}).get("Ports") or []:
        if port.get("TargetPort") == target_port and port.get("PublishedPort"):
            return int(port["PublishedPort"])
    raise RuntimeError(f"Task {task.get('ID', '?')[:12]} publishes no port for {target_port}")


def _attachable_overlay(network: dict) -> bool:
    return network.get("Driver") == "overlay" and bool(network.get("Attachable"))
