"""`FGPUSpawner`: a DockerSpawner whose containers are limited to the slice a user asked for.

The flow of one spawn:
1. `apply_user_options` turns the form or REST body into a `ResourceRequest` (refusals are 400s);
2. `start()` obtains a `Grant` (no grant, no container: docs/source/explanation/architecture.md, "fail closed");
3. `create_object()` hands request + grant to the pure builder in `container_spec` and creates it;
4. `start()` waits until the server answers, or reports the container's exit code and image.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import docker.errors
import docker.tls
from dockerspawner import DockerSpawner
from jupyterhub.spawner import SpawnException
from jupyterhub.traitlets import ByteSpecification
from sqlalchemy.orm import object_session
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from traitlets import CaselessStrEnum, Float, Integer, List, Unicode, default, validate

from fgpu_shared.engine_client import api_client_from_env
from image_catalog import Catalog, parse_image
from image_catalog.catalog import API_KEYS
from image_catalog.launch_options import SESSION_LIMITS

from . import form, idle, stop_requests
from .container_spec import (
    ContainerContext,
    LayerLimitSupport,
    build_container_spec,
    mount_options_of,
    writable_layer_support,
)
from .gpu_sharing import GpuPaths, hami_preload_text, session_cache_dir, session_lock_dir
from .grant import Grant
from .hami_lock import make_lock_file
from .job_runner_source import job_command
from .network import SESSION_NETWORK, NetworkError, SessionNetwork, ensure_session_network
from .queue_client import QueueClient, QueueError, QueueRecord
from .request import Range, RequestLimits, ResourceRequest
from .resource_groups import offered_groups
from .spawn_errors import spawn_error, unavailable
from .storage import (
    StorageSettings,
    account_tag,
    data_groups,
    folder_mounts,
    home_volume_name,
    pick_home_volume,
    session_mounts,
)
from .user_options import apply_resource_options

#: What the spawn form reads from the queue service, in render_form's order, as its note names
#: them; and how long it waits for each before rendering without it (a stopped service would
#: otherwise hold the page for every retry of every read).
FORM_READS = ("the images", "what is free for you", "the presets", "your storage folders")
FORM_READ_SECONDS = 10
_UNANSWERED = (SpawnException, asyncio.TimeoutError)


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


_LOG_TAIL_LINES = 5
#: How long past `http_timeout` a batch job's release waits for the hub's spawn to be over.
JOB_RELEASE_GRACE = 30


def catalog_from_entries(entries: list[dict]) -> Catalog:
    """The service's catalog entries (api/images) as a Catalog the form and parser read."""
    return Catalog(
        tuple(parse_image({k: v for k, v in e.items() if k in API_KEYS}) for e in entries)
    )


class FGPUSpawner(DockerSpawner):
    """Spawn single-user servers in Docker containers limited to a CPU, memory and fGPU slice."""

    default_image_name = Unicode(
        SESSION_LIMITS["default_image_name"],
        config=True,
        help="""
        Catalog name of the image preselected on the spawn form, and the image of a launch that
        names none (the admin panel's Start button, or `POST /hub/api/users/NAME/server` with
        no body) where the user may start it. Empty, or an image the user may not start: the
        first image the catalog offers them (docs/source/explanation/sessions-and-queue.md,
        "Launch options"). The shipped config sets it, and the queue service's
        `session_limits["default_image_name"]` for the Sessions dialog's launches, from
        FGPU_DEFAULT_IMAGE.

        Example::

            c.FGPUSpawner.default_image_name = "python-3.11"
        """,
    )
    # Their defaults are the Sessions dialog's too (image_catalog/launch_options.py).
    cpu_min = Float(
        SESSION_LIMITS["cpu_min"],
        config=True,
        help="""
        Fewest CPU cores a session may ask for.

        Example::

            c.FGPUSpawner.cpu_min = 0.25
        """,
    )
    cpu_max = Float(
        SESSION_LIMITS["cpu_max"],
        config=True,
        help="""
        Most CPU cores one session may ask for.

        Example::

            c.FGPUSpawner.cpu_max = 8
        """,
    )
    cpu_default = Float(
        SESSION_LIMITS["cpu_default"],
        config=True,
        help="""
        CPU cores the form starts at and a session gets when it names none.

        Example::

            c.FGPUSpawner.cpu_default = 2
        """,
    )
    cpu_step = Float(
        0.5,
        config=True,
        help="""
        Step of the CPU slider on the spawn form.

        Example::

            c.FGPUSpawner.cpu_step = 0.25
        """,
    )
    mem_min = ByteSpecification(
        SESSION_LIMITS["mem_min"],
        config=True,
        help="""
        Least memory a session may ask for (bytes, or 512M, 2G...).

        Example::

            c.FGPUSpawner.mem_min = "512M"
        """,
    )
    mem_max = ByteSpecification(
        SESSION_LIMITS["mem_max"],
        config=True,
        help="""
        Most memory one session may ask for (bytes, or 512M, 2G...).

        Example::

            c.FGPUSpawner.mem_max = "32G"
        """,
    )
    mem_default = ByteSpecification(
        SESSION_LIMITS["mem_default"],
        config=True,
        help="""
        Memory the form starts at and a session gets when it names none (bytes, 2G...).

        Example::

            c.FGPUSpawner.mem_default = "4G"
        """,
    )
    fgpu_max = Float(
        SESSION_LIMITS["fgpu_max"],
        config=True,
        help="""
        Most fGPU units one session may ask for. 0 offers no GPU on the form and refuses fgpu > 0.

        Example::

            c.FGPUSpawner.fgpu_max = 2
        """,
    )
    fgpu_default = Float(
        SESSION_LIMITS["fgpu_default"],
        config=True,
        help="""
        fGPU units a session gets when it names none.

        Example::

            c.FGPUSpawner.fgpu_max = 2
            c.FGPUSpawner.fgpu_default = 0.5
        """,
    )
    units_per_gpu = Integer(
        1,
        config=True,
        help="""
        How many fGPU units one physical GPU holds: with 2, 1 fGPU is half a GPU (Backend.AI's
        setting of the same meaning).

        Example::

            c.FGPUSpawner.units_per_gpu = 4
        """,
    )
    gpu_sharing = CaselessStrEnum(
        ["hami", "mig", "mps", "none", "simulated"],
        default_value="simulated",
        config=True,
        help="""
        How a GPU grant reaches the container: `hami` (HAMi-core limits, which a determined
        student can get around), `mig` (whole MIG instances, isolated by the driver: the strict
        mode), `mps` (CUDA MPS), `none` (whole devices, accounting only) or `simulated` (no
        device; for hosts without GPUs). docs/source/howto/gpu-slice.md, "How strict is a GPU slice".

        Example::

            c.FGPUSpawner.gpu_sharing = "mig"
        """,
    )
    hami_library_path = Unicode(
        GpuPaths.hami_library_path,
        config=True,
        help="""
        Host path of HAMi-core's `libvgpu.so`, which the admin installs on every GPU host. It is
        mounted read-only into `hami` sessions and preloaded, so that CUDA sees only the granted
        memory and SM share.

        Example::

            c.FGPUSpawner.hami_library_path = "/opt/hami/lib/libvgpu.so"
        """,
    )
    hami_cache_base = Unicode(
        GpuPaths.hami_cache_base,
        config=True,
        help="""
        Host folder under which every `hami` session gets a cache folder of its own, named by its
        session id, for HAMi-core's shared usage file.

        Example::

            c.FGPUSpawner.hami_cache_base = "/srv/fgpu-hub/vgpu"
        """,
    )
    hami_lock_dir = Unicode(
        GpuPaths.hami_lock_dir,
        config=True,
        help="""
        HAMi-core's lock folder inside a `hami` session (HAMi-core's own is `/tmp/vgpulock`).
        Each session's is a host folder of its own, `vgpulock` in its cache folder (see
        `hami_cache_base`), made by the hub: one shared by every session let one session hold
        the lock and stall every other session's GPU start-up. A symbolic link, or a folder or
        `lock` file someone else made, is refused (fgpu_spawner/hami_lock.py). `scripts/gpu-node`
        makes a host folder at this path for other HAMi users on the node.

        Example::

            c.FGPUSpawner.hami_lock_dir = "/var/lib/fgpu-hub/vgpulock"
        """,
    )
    hami_preload_path = Unicode(
        GpuPaths.hami_preload_path,
        config=True,
        help="""
        Host file that the spawner writes (the path of HAMi-core's library inside the container)
        and mounts read-only at `/etc/ld.so.preload` in `hami` sessions, as HAMi's device plugin
        does: the dynamic loader then loads HAMi-core into every process, whatever its
        environment, so unsetting `LD_PRELOAD` does not lift the GPU limits.

        Example::

            c.FGPUSpawner.hami_preload_path = "/srv/fgpu-hub/ld.so.preload"
        """,
    )
    hami_shrreg_tool_path = Unicode(
        GpuPaths.hami_shrreg_tool_path,
        config=True,
        help="""
        Host path of HAMi-core's `shrreg-tool`, built with the library (`scripts/gpu-node`
        installs both). It is mounted read-only into `hami` sessions, and the session's command
        starts with `shrreg-tool --create_new`, which creates the session's usage region from
        the spawner's limits before any process of the student runs: HAMi-core keeps the limits
        of whoever creates the region. A missing file makes the spawn fail, never a session
        without limits.

        Example::

            c.FGPUSpawner.hami_shrreg_tool_path = "/opt/hami/bin/shrreg-tool"
        """,
    )
    mps_pipe_dir = Unicode(
        GpuPaths.mps_pipe_dir,
        config=True,
        help="""
        Host folder of the CUDA MPS control daemon's pipes (its CUDA_MPS_PIPE_DIRECTORY), mounted
        into `mps` sessions.

        Example::

            c.FGPUSpawner.mps_pipe_dir = "/var/run/nvidia-mps"
        """,
    )
    idle_timeout = Float(
        0.0,
        config=True,
        help="""
        Timeout in seconds of the hub's idle culler (the shipped config runs
        jupyterhub-idle-culler with FGPU_IDLE_TIMEOUT and sets this to the same). A stop of a
        server idle that long is the culler's, and its record ends with reason `idle`
        (fgpu_spawner/idle.py says why). 0: no culler; no stop is taken for one.

        Example::

            c.FGPUSpawner.idle_timeout = 7200
        """,
    )
    job_start_timeout = Float(
        24 * 3600.0 + 120,
        config=True,
        help="""
        How long, in seconds, the hub waits for a batch job's start: its wait in the queue
        included. A job waits for its turn as long as the queue service keeps it
        (QueueService.job_pending_timeout, a day by default), far longer than an interactive
        start (`start_timeout`), which the hub would otherwise give up after. A job deferred to
        its `start_after` is waited for that much longer (its pending timeout counts from then).

        Example::

            c.FGPUSpawner.job_start_timeout = 2 * 24 * 3600 + 120
        """,
    )
    pids_limit = Integer(
        1024,
        config=True,
        help="""
        Most processes and threads a session may run, so a fork bomb stays in its slice.

        Example::

            c.FGPUSpawner.pids_limit = 4096
        """,
    )
    network_name = Unicode(
        SESSION_NETWORK,
        config=True,
        help="""
        Docker network of the sessions: a bridge with inter-container traffic off
        (`com.docker.network.bridge.enable_icc=false`), so that sessions cannot reach one another
        while the proxy and the hub still reach them. Created by the hub when missing (the
        shipped config does it at start-up and makes the hub's API listen on its gateway); an
        existing network of this name that lets containers talk is refused. A site that changes
        it sets `JupyterHub.hub_ip` to the new network's gateway.

        Example::

            c.FGPUSpawner.network_name = "course-sessions"
            c.JupyterHub.hub_ip = "172.30.0.1"  # the gateway of course-sessions
        """,
    )
    writable_layer_size = ByteSpecification(
        "10G",
        config=True,
        help="""
        Most a session may write outside its home folder and mounts (its container's writable
        layer: /tmp, /var/tmp...), e.g. 10G; 0 for no limit. Applied where the storage
        driver supports a size (overlay2 on xfs mounted with pquota, btrfs, zfs); elsewhere the
        hub logs a warning at the first spawn and sessions write without limit.

        Example::

            c.FGPUSpawner.writable_layer_size = "20G"
        """,
    )
    run_as = Unicode(
        "1000:100",
        config=True,
        help="""
        User (uid:gid) the session runs as, whatever the image says: never root.

        Example::

            c.FGPUSpawner.run_as = "1001:100"
        """,
    )
    home_volume = Unicode(
        "fgpu-home-{username}",
        config=True,
        help="""
        Name of the Docker volume that holds each user's home folder, so that notebooks and
        `pip install --user` packages outlive a session. `{username}` is the user name, escaped
        for Docker. Empty turns persistent homes off (the home folder then dies with the session).

        Example::

            c.FGPUSpawner.home_volume = "cs101-home-{username}"
        """,
    )
    home_mount_path = Unicode(
        "/home/jovyan",
        config=True,
        help="""
        Where the home volume is mounted: the images' home folder (the user `jovyan`).

        Example::

            c.FGPUSpawner.home_mount_path = "/home/jovyan/work"
        """,
    )
    group_data_dir = Unicode(
        "",
        config=True,
        help="""
        Host folder with one folder per hub group (created when missing, owned by `run_as`).
        Each session gets the folders of its user's groups at `group_data_mount_path/<group>`:
        read-only for students, read-write for members of `group_data_writers`. Empty turns
        group data folders off.

        Example::

            c.FGPUSpawner.group_data_dir = "/srv/fgpu-hub/group-data"
        """,
    )
    group_data_mount_path = Unicode(
        "/home/jovyan/data",
        config=True,
        help="""
        Folder in the container under which the group data folders appear.

        Example::

            c.FGPUSpawner.group_data_mount_path = "/home/jovyan/shared"
        """,
    )
    group_data_writers = List(
        Unicode(),
        default_value=["instructors"],
        config=True,
        help="""
        Hub groups whose members may write to their groups' data folders.

        Example::

            c.FGPUSpawner.group_data_writers = ["instructors", "teaching-assistants"]
        """,
    )

    @validate("home_volume")
    def _check_home_volume(self, proposal):
        try:
            proposal["value"].format(username="x")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(
                f"home_volume {proposal['value']!r} may only use {{username}}: {e}"
            ) from None
        return proposal["value"]

    ready_poll_interval = Float(
        0.25,
        config=True,
        help="""
        Seconds between readiness checks while a container starts.

        Example::

            c.FGPUSpawner.ready_poll_interval = 0.5
        """,
    )

    queue_url = Unicode(
        "",
        config=True,
        help="""
        URL of the queue service (e.g. http://127.0.0.1:10101/services/queue/). Every grant comes
        from it. Empty runs without a queue: GPU-less sessions only, granted at once.

        Example::

            c.FGPUSpawner.queue_url = "http://127.0.0.1:10101/services/queue/"
        """,
    )
    queue_token = Unicode(
        "",
        config=True,
        help="""
        API token the spawner presents to the queue service (a hub token of its own).

        Example::

            c.FGPUSpawner.queue_token = open("/srv/fgpu-hub/spawner_token").read().strip()
        """,
    )

    deployment_id = Unicode(
        "",
        config=True,
        help="""
        Id of this hub's deployment, put on every session container as the `fgpu.deployment`
        label, so that the queue service adopts or stops only this hub's containers when other
        hubs share the engine. The shipped config reads it from `fgpu_deployment_id` in the
        state directory (made on first start), where the service reads it too.

        Example::

            c.FGPUSpawner.deployment_id = "cs101-hub"
        """,
    )

    queue_reconnect_timeout = Float(
        120.0,
        config=True,
        help="""
        Seconds a waiting spawn keeps reconnecting to a restarting queue service.

        Example::

            c.FGPUSpawner.queue_reconnect_timeout = 300
        """,
    )

    # What the engine's storage driver can bound: checked once per hub process.
    _layer_limit_support: ClassVar[LayerLimitSupport | None] = None

    # Per-spawn state, set by apply_user_options and start().
    resource_request: ResourceRequest | None = None
    grant: Grant | None = None
    gpu_memory: dict[str, int] = {}
    gpu_order: list[str] = []
    #: The storage folders this start mounts, as the queue service resolved them.
    folder_mounts: list[dict] = []
    #: The key the queue service presents when it tells this session its planned end (and that
    #: opens nothing else: queue_service/session_end_notice.py), from its first answer.
    end_notice_key: str = ""
    session_id: str = ""
    _pending_message: str = ""
    # The giving back of an interrupted start's slice, while it runs (start() and stop()).
    _abandoning: asyncio.Future | None = None
    # The task of the latest start(): a stop lets an interrupted one end first.
    _start_task: asyncio.Task | None = None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Set whenever the queue reports a new position or reason; progress() waits on it.
        self._progress_changed = asyncio.Event()
        # A batch job's start waits longer (job_start_timeout); the next start may be interactive.
        self._interactive_start_timeout = self.start_timeout

    docker_threads = Integer(
        8,
        min=1,
        config=True,
        help="""Threads for the hub's calls to the Docker engine, shared by every server.

        DockerSpawner makes all its engine calls on one thread, so a single container that the
        engine does not answer about (a frozen one, say) held every other user's spawn, poll and
        stop until its call timed out. Each stuck container holds at most the threads of its own
        calls; the others go on.

        Example::

            c.FGPUSpawner.docker_threads = 16
        """,
    )

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The pool of `docker_threads` threads for engine calls, one per class."""
        cls = type(self)
        if cls.__dict__.get("_executor") is None:
            cls._executor = ThreadPoolExecutor(
                self.docker_threads, thread_name_prefix="fgpu-docker"
            )
        return cls._executor

    @property
    def client(self) -> docker.APIClient:
        """DockerSpawner's client (one per class), verifying a TLS engine against its own CA
        rather than `REQUESTS_CA_BUNDLE` (fgpu_shared/engine_client.py)."""
        cls = type(self)
        if cls.__dict__.get("_client") is None:
            kwargs = {"tls": docker.tls.TLSConfig(**self.tls_config)} if self.tls_config else {}
            cls._client = api_client_from_env(**kwargs, **self.client_kwargs)
        return cls._client

    @default("remove")
    def _default_remove(self):
        # Sessions are disposable: the home folder, not the container, is what lasts.
        return True

    @default("use_internal_ip")
    def _default_use_internal_ip(self):
        return True

    @default("options_form")
    def _default_options_form(self):
        async def render(spawner):
            return await spawner.render_form()

        return render

    async def render_form(self) -> str:
        """The spawn form from what the queue service says now (the catalog, this user's free
        resources and presets). A service that does not answer leaves a plain note on a form of
        the site's limits, not an error page: the student sees what is wrong and can retry."""
        answers = await asyncio.gather(
            *(
                asyncio.wait_for(read, FORM_READ_SECONDS)
                for read in (
                    self.user_catalog(),
                    self.user_resources(),
                    self.user_presets(),
                    self.user_folders(),
                )
            ),
            return_exceptions=True,
        )
        for answer in answers:
            if isinstance(answer, Exception) and not isinstance(answer, _UNANSWERED):
                raise answer
        catalog, resources, presets, folders = (
            None if isinstance(a, Exception) else a for a in answers
        )
        missing = [
            what for what, a in zip(FORM_READS, answers, strict=True) if isinstance(a, Exception)
        ]
        return form.render_spawn_form(
            self.request_limits,
            catalog or Catalog(()),
            units_per_gpu=self.units_per_gpu,
            simulated=self.gpu_sharing == "simulated",
            cpu_step=self.cpu_step,
            previous=self.user_options,
            resource_groups=offered_groups(resources or {}),
            resources=resources,
            presets=presets or [],
            folders=folders,
            note=form.unavailable_note(missing),
        )

    @default("options_from_form")
    def _default_options_from_form(self):
        return form.options_from_form

    @default("apply_user_options")
    def _default_apply_user_options(self):
        return apply_resource_options

    async def user_catalog(self) -> Catalog:
        """The images this user may start: from the queue service's catalog (its DB)."""
        try:
            entries = await self.queue.images_for(self.user.name)
        except QueueError as e:
            raise unavailable("The image catalog is", "catalog", e) from None
        return catalog_from_entries(entries)

    async def refuse_image(self, name: str, catalog: Catalog) -> None:
        """Raise the right refusal for an image not offered to this user: 403 when it exists
        but is not theirs to use, 400 when there is no such image."""
        try:
            await self.queue.image_for(self.user.name, name)
        except QueueError as e:
            if e.status == 403:
                raise spawn_error(e.message, reason="image_not_allowed", status_code=403) from None
        choices = ", ".join(image.name for image in catalog.visible()) or "none"
        raise spawn_error(
            f"Unknown image {name!r}. Available images: {choices}.", reason="invalid_options"
        )

    async def user_resources(self) -> dict:
        """What this user holds and may use, per resource group (the service's api/resources).
        A `resource_group` option is judged by the queue when the grant is asked for."""
        try:
            return await self.queue.resources_for(self.user.name)
        except QueueError as e:
            raise unavailable("The resource groups are", "resources", e) from None

    async def user_presets(self) -> list[dict]:
        """The resource presets offered to this user, with whether each is theirs to use now
        (the service's api/presets)."""
        try:
            return (await self.queue.presets_for(self.user.name))["presets"]
        except QueueError as e:
            raise unavailable("The resource presets are", "presets", e) from None

    async def user_folders(self) -> list[dict]:
        """The storage folders this user may mount, for the form's folder picker (the
        service's api/folders for that user): their own, and those shared with them."""
        try:
            return await self.queue.folders_for(self.user.name)
        except QueueError as e:
            raise unavailable("The storage folders are", "folders", e) from None

    @property
    def request_limits(self) -> RequestLimits:
        return RequestLimits(
            cpu=Range(self.cpu_min, self.cpu_max, self.cpu_default),
            mem=Range(self.mem_min, self.mem_max, self.mem_default),
            fgpu=Range(0.0, self.fgpu_max, self.fgpu_default),
            default_image=self.default_image_name or None,
        )

    async def check_allowed(self, image):
        # DockerSpawner passes user_options["image"], a catalog name; apply_user_options has
        # already validated it and resolved the reference.
        return self.resource_request.image

    async def pull_image(self, image):
        """No registry is reachable: an image is there, built offline, or the spawn stops here."""
        try:
            await self.docker("inspect_image", image)
        except docker.errors.ImageNotFound:
            name = self.resource_request.image_name
            raise spawn_error(
                f"Image {image} ({name}) is not on this host. An admin can build it with "
                f"`python -m image_catalog build {name}`.",
                reason="image_missing",
                status_code=500,
            ) from None

    @property
    def queue(self) -> QueueClient:
        """The queue service: every grant comes from it (docs/source/explanation/architecture.md, "fail closed")."""
        if not self.queue_url:
            raise spawn_error(
                "No queue service is configured (c.FGPUSpawner.queue_url): no session can start "
                "without a grant from it.",
                reason="config",
                status_code=500,
            )
        # Each of the hub's spawn slots may hold a long-poll: the client makes room for them all.
        settings = getattr(self.user, "settings", None) or {}
        slots = settings.get("concurrent_spawn_limit", 0)
        return QueueClient(self.queue_url, self.queue_token, spawn_slots=slots)

    async def acquire_grant(self, request: ResourceRequest) -> Grant:
        """The slice this session may use: from the queue service, waiting while PENDING."""
        # The key is chosen before asking: a request whose answer never comes (a timeout, a
        # dropped connection) can still be released by it, so it never starts a server later.
        # A launch's start names the record the queue service made for it (`request_key`).
        self.session_id = request.request_key or uuid.uuid4().hex
        try:
            record = await self.queue.request_grant(
                self.user.name,
                self.name,
                request,
                key=self.session_id,
                account=account_tag(self.user.created),
            )
            # Another id when the queue adopted an earlier record of this same start.
            self.session_id = record.id
            self._use_catalog_reference(record.image_ref)
            while record.status == "PENDING":
                self._report_pending(record)
                record = await self._wait_in_queue(record)
        except QueueError as e:
            raise spawn_error(e.message, reason="queue", status_code=e.status) from None
        if record.status != "SCHEDULED" or record.grant is None:
            reason = record.reason or f"the request ended as {record.status}"
            raise spawn_error(f"No grant: {reason}", reason=record.status.lower())
        self.gpu_memory = record.gpu_memory
        self.gpu_order = list(record.gpu_order)
        self.folder_mounts = list(record.mounts)
        self.end_notice_key = record.end_notice_key
        return record.grant

    def _use_catalog_reference(self, reference: str | None) -> None:
        """Start the image the catalog names now (a private image, or one re-pointed since)."""
        if reference and reference != self.resource_request.image:
            self.resource_request = dataclasses.replace(self.resource_request, image=reference)
            self.image = reference

    async def _wait_in_queue(self, record: QueueRecord) -> QueueRecord:
        """The next change to the record; rides out a restart of the service (the queue is in
        its DB), but not an outage longer than `queue_reconnect_timeout`."""
        deadline = asyncio.get_running_loop().time() + self.queue_reconnect_timeout
        while True:
            try:
                return await self.queue.wait(record)
            except QueueError as e:
                # Any 5xx here is the service going away (a restart, or the hub shutting down
                # and stopping it first): keep the place in line rather than give it up.
                if e.status < 500 or asyncio.get_running_loop().time() > deadline:
                    raise
                self._pending_message = "Pending: the queue service is restarting; still in line"
                self._progress_changed.set()
                await asyncio.sleep(1)

    def _report_pending(self, record: QueueRecord) -> None:
        position = record.position
        where = f"{ordinal(position)} in line" if position else "waiting"
        # The queue's reason already says what the request waits for; without one, say it here.
        slots = f"{record.fgpu:g} fGPU" if record.fgpu else f"{record.cpu:g} CPU"
        detail = record.reason or f"waiting for {slots}"
        self._pending_message = f"Pending: {where}; {detail}"
        self._progress_changed.set()

    async def progress(self):
        """Queue position and reason while PENDING, for the hub's spawn-pending page."""
        shown = None
        while self.grant is None and self._spawn_pending:
            # Cleared before reading, so that a message set while the hub takes this one is
            # shown at once, not after the timeout.
            self._progress_changed.clear()
            if self._pending_message and self._pending_message != shown:
                shown = self._pending_message
                yield {"progress": 10, "message": shown}
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress_changed.wait(), timeout=5)
        if self.grant is not None:
            yield {
                "progress": 50,
                "message": f"Granted on {self.grant.node}; starting the container",
            }

    async def release_grant(
        self, session_id: str | None = None, end_reason: str | None = None
    ) -> None:
        """Give back the grant of `session_id` (default: this spawn's); `end_reason` says why:
        "error" for a start that failed, "idle" for the idle culler's stop."""
        session_id = session_id or self.session_id
        if not session_id:
            return
        try:
            await self.queue.release(session_id, self.user.name, self.name, end_reason)
        except QueueError as e:
            # 404: the request never reached the queue (the service now refuses it if it comes).
            # Otherwise the reconciler ends it once it sees no container and no server.
            if e.status != 404:
                self.log.warning("Could not release grant %s: %s", session_id, e.message)
        self.session_id = ""

    async def _abandoned(self) -> None:
        """Wait until an interrupted start has given its slice back (it reads the session id and
        object id as it goes, so neither a stop nor a new start may change them meanwhile)."""
        abandoning, self._abandoning = self._abandoning, None
        if abandoning is None:
            return
        try:
            await asyncio.shield(abandoning)
        except Exception:
            self.log.exception("Giving back the slice of an interrupted start failed")

    @property
    def pending(self):
        """The hub's own, except that a spawn the hub has asked to cancel is no longer pending.

        The hub stops a spawn waiting in the queue by cancelling it and, one second later,
        stopping the server, which it refuses (a 500) if the spawn is still pending then; the
        server, which never ran, stayed listed as running. A storm of stops holds the hub's loop
        past that second. The spawn's end is certain once asked for, so the stop goes ahead at
        once, and stop() lets the start end first. A spawn that has just ended is not pending
        either: the hub clears its flag a turn of its loop later, and a stop that came in that
        turn was refused (12 of 800 stops at once, measured)."""
        if self._spawn_pending and _ended_or_ending(self._spawn_future):
            return None
        return super().pending

    async def poll_and_notify(self):
        """The hub's poll; a server the hub lists as running whose spawn never reached the hub's
        watch (no poll callback: an interrupted spawn the hub kept) and that does not run is
        forgotten by the hub here. Otherwise a stop through the hub's API (the queue service's
        reconciler's, or the student's) answers 204 and leaves it listed."""
        watched = bool(self._callbacks)
        status = await super().poll_and_notify()
        if status is not None and not watched and self.server is not None and not self.pending:
            self.log.warning("Forgetting %s: listed as running, but it never ran", self._log_name)
            await self.user.stop(self.name)
        return status

    async def _interrupted_start_ended(self) -> None:
        """Wait until a start the hub interrupted has ended and given back its slice (never
        for a start nobody interrupted: it may wait in the queue for hours)."""
        task = self._start_task
        interrupted = task is not None and (
            _being_cancelled(task) or _being_cancelled(self._spawn_future)
        )
        if interrupted and task is not asyncio.current_task():
            await asyncio.wait([task])
        await self._abandoned()

    async def start(self):
        self._start_task = asyncio.current_task()
        await self._abandoned()
        if self.resource_request is None:
            await apply_resource_options(self, self.user_options or {})
        self.forget_request_key()
        self.grant = None
        self._pending_message = ""
        try:
            self.grant = await self.acquire_grant(self.resource_request)
            ip, port = await super().start()
            await self.wait_until_ready(ip, port)
            await self._confirm_running()
            self.start_idle_clock()
            if self.resource_request.batch:
                self._releasing_job = asyncio.ensure_future(self.release_job(ip, port))
        except asyncio.CancelledError:
            # The hub interrupts a start (a stop while it waits) and stops the server one second
            # later only if the start has ended by then; otherwise it answers 500 and, once the
            # start ends, keeps the server as if it ran. So the start ends now, and its slice
            # goes back behind it (stop() waits for that).
            self._abandoning = asyncio.ensure_future(self._abandon_start())
            raise
        except BaseException:
            # Failed: the slice goes back to the queue now, not when someone notices, and only
            # once the container that held it is gone.
            await asyncio.shield(self._abandon_start(end_reason="error"))
            raise
        return ip, port

    def forget_request_key(self) -> None:
        """The hub keeps a start's options as the next start's defaults (a restart from the home
        page sends none); a request key names one start only, so it is dropped from them, and
        a restart asks the queue anew rather than for the record this start ended."""
        orm_spawner = self.orm_spawner
        saved = getattr(orm_spawner, "user_options", None)
        if not isinstance(saved, dict) or "request_key" not in saved:
            return
        orm_spawner.user_options = {k: v for k, v in saved.items() if k != "request_key"}
        db = object_session(orm_spawner)
        if db is not None:
            db.commit()

    async def _confirm_running(self) -> None:
        """Tell the queue the server is up. Fail closed: if the grant ended meanwhile (released,
        reclaimed), the queue refuses, and this spawn fails rather than run without a grant."""
        try:
            await self.queue.mark_running(self.session_id)
        except QueueError as e:
            raise spawn_error(e.message, reason="no_grant", status_code=e.status) from None

    async def _abandon_start(self, end_reason: str | None = None) -> None:
        if self.object_id:
            try:
                await self.remove_now()
            except docker.errors.NotFound:
                pass  # gone already
            except Exception:
                # Still there: the reconciler stops it, since its grant ends just below.
                self.log.exception("Could not remove the %s of a failed spawn", self.object_type)
            self.object_id = ""
        await self.release_grant(end_reason=end_reason)

    async def remove_now(self) -> None:
        """Remove the session's container at once, running or not (a failed start's)."""
        await self.docker("remove_container", self.object_id, v=True, force=True)

    async def stop(self, now=False):
        """Stop and remove the container, then give the grant back: only once the container is
        really gone. If the engine refuses, the grant is kept (its slice stays counted) and the
        error raised; the hub forgets the server all the same, and the service's reconciler
        stops the container of a session the hub no longer lists, and releases it then."""
        await self._interrupted_start_ended()
        if not self.object_id and not self.session_id:
            # Nothing to stop: an interrupted start removed its container and gave its slice
            # back itself.
            self.clear_state()
            return
        # Read first: DockerSpawner.stop clears the state (and with it the session id); the
        # hub's last activity is read before the stop, the culler's test on it (idle.py).
        session_id, container_id = self.session_id, self.object_id
        end_reason = self.stop_reason()
        await super().stop(now=now)
        if container_id and await self._still_there(container_id):
            raise RuntimeError(
                f"{self.object_type.capitalize()} {container_id[:12]} is still there after "
                f"stop; its grant {session_id} is kept until the queue service removes it"
            )
        await self.release_grant(session_id, end_reason)
        if self.gpu_sharing == "hami" and session_id:
            await asyncio.to_thread(self.remove_hami_cache, session_id)

    def start_idle_clock(self) -> None:
        """The hub stamps a server's last activity when its spawn begins, which for a request
        that waited in the queue may be longer ago than the idle timeout: the culler would stop
        the session as soon as it is ready (the server's own activity report corrects the stamp,
        where the image reports at all). The session's idle time counts from its start."""
        orm_spawner = self.orm_spawner
        if orm_spawner is None:
            return
        orm_spawner.last_activity = datetime.now(UTC).replace(tzinfo=None)  # the hub's naive UTC
        db = object_session(orm_spawner)
        if db is not None:
            db.commit()

    def stop_reason(self) -> str | None:
        """`admin` when an admin asked the hub to stop it (stop_requests.py), `idle` when the
        idle culler's test holds now (idle.py), else None."""
        asked = stop_requests.end_reason_for(self.user.name, stop_requests.STOPPED_BY.get())
        return asked or idle.reason_of(self.orm_spawner, self.idle_timeout)

    async def _still_there(self, container_id: str) -> bool:
        """True unless the engine says the container is gone (or, kept by `remove = False`,
        no longer running)."""
        try:
            state = (await self.docker("inspect_container", container_id))["State"]
        except docker.errors.NotFound:
            return False
        return self.remove or state.get("Running", False) or state.get("Paused", False)

    def remove_hami_cache(self, session_id: str) -> None:
        """Remove the session's HAMi-core cache folder once its container is gone, or a term's
        sessions leave thousands behind. On a Swarm node other than the hub's there is none here."""
        shutil.rmtree(session_cache_dir(self.gpu_paths, session_id), ignore_errors=True)

    def run_post_stop_hook(self):
        """The hub forgets a server here however it ended, `stop()` or not. A batch job (or a
        session) whose container exited by itself is found exited by the hub's poll, which then
        never calls `stop()` (queue_service/job_ends.py asks the hub to stop it afterwards): its
        HAMi-core cache folder is removed here. After `stop()` the state is cleared already
        (`stop()` removed the folder itself). A site's own `post_stop_hook` runs as well."""
        session_id = self.session_id
        if self.gpu_sharing == "hami" and session_id:
            try:
                self.remove_hami_cache(session_id)
            except ValueError as e:  # an id that cannot name a folder: nothing was made for it
                self.log.warning("No HAMi cache folder to remove for %r: %s", session_id, e)
        return super().run_post_stop_hook()

    def get_state(self):
        state = super().get_state()
        if self.session_id:
            state["fgpu_session_id"] = self.session_id
        return state

    def load_state(self, state):
        super().load_state(state)
        self.session_id = state.get("fgpu_session_id", "")

    def clear_state(self):
        super().clear_state()
        self.session_id = ""

    @property
    def storage_settings(self) -> StorageSettings:
        labels = self._render_templates(self.extra_create_kwargs).get("labels", {})
        return StorageSettings(
            home_volume=self.home_volume,
            home_path=self.home_mount_path,
            group_data_dir=self.group_data_dir,
            group_data_path=self.group_data_mount_path,
            group_data_writers=tuple(self.group_data_writers),
            # Labels an admin puts on containers also mark the volumes they create.
            labels=labels,
        )

    def prepare_group_folders(self, groups: list[str]) -> None:
        """Create missing group data folders on the host, writable by the session user (whose
        writes a read-only mount still stops for students)."""
        if not self.group_data_dir:
            return
        uid, _, gid = self.run_as.partition(":")
        for group in data_groups(groups):
            path = Path(self.group_data_dir) / group
            if path.is_dir():
                continue
            path.mkdir(parents=True, exist_ok=True)
            try:
                os.chown(path, int(uid), int(gid or uid))
                path.chmod(0o2775)
            except (OSError, ValueError) as e:
                self.log.warning("Group folder %s stays owned by the hub's user: %s", path, e)

    def storage_mounts(self, home_volume: str = "") -> list:
        groups = [group.name for group in self.user.groups]
        self.prepare_group_folders(groups)
        account = account_tag(self.user.created)
        mounts = session_mounts(self.storage_settings, self.user.name, groups, home_volume, account)
        return mounts + folder_mounts(self.storage_settings.home_path, self.folder_mounts)

    async def home_volume_of_account(self) -> str:
        """This account's home volume. A volume left by a deleted user of the same name stays as
        it is and out of reach: the new account gets one of its own (fgpu_spawner/storage.py)."""
        if not self.home_volume:
            return ""
        names = {
            home_volume_name(self.home_volume, self.user.name, tag)
            for tag in ("", account_tag(self.user.created))
        }
        volumes = {name: await self._inspect_volume(name) for name in names}
        return pick_home_volume(self.home_volume, self.user.name, self.user.created, volumes)

    async def _inspect_volume(self, name: str) -> dict | None:
        try:
            return await self.docker("inspect_volume", name)
        except docker.errors.NotFound:
            return None

    async def session_network(self) -> SessionNetwork:
        """The isolated session network, created again if someone removed it since start-up."""
        try:
            return await asyncio.to_thread(ensure_session_network, self.client, self.network_name)
        except (NetworkError, docker.errors.APIError) as e:
            raise spawn_error(
                f"No session network: {e}", reason="config", status_code=500
            ) from None

    async def writable_layer_limit(self) -> int:
        """`writable_layer_size` where the storage driver can apply it, else 0 (and a warning)."""
        if not self.writable_layer_size:
            return 0
        cls = type(self)
        if cls._layer_limit_support is None:
            cls._layer_limit_support = await asyncio.to_thread(self._check_layer_limit)
            if not cls._layer_limit_support.supported:
                self.log.warning(
                    "Session containers' writable layers are NOT limited to %s bytes: %s. A "
                    "session can fill the engine's disk; see docs/source/explanation/session-containers.md, 'Session containers'.",
                    self.writable_layer_size,
                    cls._layer_limit_support.reason,
                )
        return self.writable_layer_size if cls._layer_limit_support.supported else 0

    def _check_layer_limit(self) -> LayerLimitSupport:
        info = self.client.info()
        try:
            proc_mounts = Path("/proc/mounts").read_text()
        except OSError:
            proc_mounts = ""
        options = mount_options_of(info.get("DockerRootDir", "/var/lib/docker"), proc_mounts)
        return writable_layer_support(
            info.get("Driver", ""), info.get("DriverStatus") or [], options
        )

    def write_hami_preload_file(self) -> None:
        """The host file bound at /etc/ld.so.preload in `hami` sessions, written only when its
        text differs (running sessions keep the copy they have)."""
        path = Path(self.hami_preload_path)
        text = hami_preload_text()
        if path.is_file() and path.read_text() == text:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        partial.write_text(text)
        partial.chmod(0o644)
        os.replace(partial, path)

    def get_env(self) -> dict:
        env = super().get_env()
        if self.end_notice_key:
            # The session's end notice is told with this key, never with a token of the
            # service's (the session's own server reads whatever reaches it).
            env["FGPU_END_NOTICE_KEY"] = self.end_notice_key
        return env

    async def container_context(self) -> ContainerContext:
        return ContainerContext(
            name=self.container_name,
            user=self.user.name,
            server_name=self.name,
            command=await self.get_command(),
            env=self.get_env(),
            port=self.port,
            # By id: never ambiguous, even if two networks ever carried the name.
            network=(await self.session_network()).id,
            run_as=self.run_as,
            pids_limit=self.pids_limit,
            # Kept after exit so that an early exit can be reported with its code and output;
            # stop() removes it.
            auto_remove=False,
            publish_to=None if self.use_internal_ip else self.host_ip,
            binds=self.volume_binds,
            volumes=self.volume_mount_points,
            mounts=[*self.mount_binds, *self.storage_mounts(await self.home_volume_of_account())],
            extra_create_kwargs=self._render_templates(self.extra_create_kwargs),
            extra_host_config=self._render_templates(self.extra_host_config),
            gpu_sharing=self.gpu_sharing,
            gpu_memory=self.gpu_memory,
            gpu_order=tuple(self.gpu_order),
            gpu_paths=self.gpu_paths,
            writable_layer_size=await self.writable_layer_limit(),
            deployment_id=self.deployment_id,
        )

    @property
    def gpu_paths(self) -> GpuPaths:
        return GpuPaths(
            hami_library_path=self.hami_library_path,
            hami_cache_base=self.hami_cache_base,
            hami_lock_dir=self.hami_lock_dir,
            hami_preload_path=self.hami_preload_path,
            hami_shrreg_tool_path=self.hami_shrreg_tool_path,
            mps_pipe_dir=self.mps_pipe_dir,
        )

    def prepare_hami_host_paths(self, session_id: str) -> None:
        """HAMi-core's host folders for a `hami` session, made before the engine would make them
        root's own: the session user (`run_as`, no capabilities) must create its shared-region
        file in its cache folder, and open its own lock file read-write. The cache folder
        becomes the session user's (the hub runs as root), or, where the hub may not give it
        away, writable by all under a base folder that only the hub writes."""
        cache = Path(session_cache_dir(self.gpu_paths, session_id))
        cache.mkdir(parents=True, exist_ok=True)
        uid, _, gid = self.run_as.partition(":")
        if os.geteuid() == 0:
            os.chown(cache, int(uid), int(gid or uid))
            cache.chmod(0o700)
        else:
            cache.chmod(0o777)
        # The hub's own folder in it (never through a planted link): the session's lock.
        make_lock_file(session_lock_dir(self.gpu_paths, session_id))

    async def get_command(self) -> list[str]:
        """A batch job runs job_runner.py in the image's Python; a session, the image's server."""
        if self.resource_request is not None and self.resource_request.batch:
            return job_command()
        return await super().get_command()

    async def create_object(self):
        if self.gpu_sharing == "hami" and self.grant.gpus:
            try:
                await asyncio.to_thread(self.write_hami_preload_file)
                await asyncio.to_thread(self.prepare_hami_host_paths, self.grant.session_id)
            except (OSError, ValueError) as e:
                message = f"Cannot prepare HAMi-core's host files for this session: {e}"
                raise spawn_error(message, reason="config", status_code=500) from None
        try:
            spec = build_container_spec(
                self.resource_request, self.grant, await self.container_context()
            )
        except ValueError as e:
            raise spawn_error(str(e), reason="config", status_code=500) from None
        host_config = self.client.create_host_config(**spec.host_config)
        try:
            return await self.docker(
                "create_container", **spec.create_kwargs, host_config=host_config
            )
        except docker.errors.APIError as e:
            raise self._engine_refused("create", e) from None

    async def start_object(self):
        try:
            await super().start_object()
        except docker.errors.APIError as e:
            raise self._engine_refused("start", e) from None

    def _engine_refused(self, action: str, error: docker.errors.APIError) -> SpawnException:
        """The engine's own words (a full disk, a bad setting) for the user and the admin's log,
        rather than a bare 500."""
        detail = error.explanation or str(error)
        self.log.error("The engine could not %s %s: %s", action, self.container_name, detail)
        return spawn_error(
            f"The Docker engine could not {action} the session container: {detail}. "
            "Please tell the hub's admin.",
            reason="engine",
            status_code=500,
        )

    async def wait_until_ready(self, ip: str, port: int) -> None:
        """Return once the server answers; raise a clear error if the container exits first.

        The hub would otherwise wait out http_timeout and answer with a bare 500.
        """
        url = f"http://{ip}:{port}{self.server.base_url}api"
        deadline = asyncio.get_running_loop().time() + self.http_timeout
        while asyncio.get_running_loop().time() < deadline:
            exit_code = await self.exit_code()
            if exit_code is not None:
                # start() removes the container: the hub sees an exited server as stopped and
                # never calls stop().
                raise await self._early_exit_error(exit_code)
            if await _answers(url):
                return
            await asyncio.sleep(self.ready_poll_interval)
        # Past the deadline the hub's own http_timeout handling reports the failure.

    async def release_job(self, ip: str, port: int) -> None:
        """Let a batch job start once the hub's spawn is over (its last look at the server is
        then done): a GET of `{prefix}api` with the server's own token (job_runner.py). The
        hub's and this spawner's checks carry no token, so a look by anyone else who reaches
        the port never starts the job."""
        url = f"http://{ip}:{port}{self.server.base_url}api"
        headers = {"Authorization": f"token {self.api_token}"}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.http_timeout + JOB_RELEASE_GRACE
        while self.pending == "spawn" and loop.time() < deadline:
            await asyncio.sleep(self.ready_poll_interval)
        if not self.ready:
            return  # stopped or failed meanwhile; the job starts on its own after its wait
        try:
            await AsyncHTTPClient().fetch(url, headers=headers, request_timeout=10)
        except (HTTPClientError, OSError) as e:
            self.log.warning(
                "Could not tell %s's job to start (%s); it starts on its own", self._log_name, e
            )

    async def exit_code(self) -> int | None:
        """None while the session's container runs; its exit code once it has stopped."""
        state = (await self.docker("inspect_container", self.container_id))["State"]
        return None if state["Running"] else state["ExitCode"]

    async def log_tail(self, lines: int) -> str:
        """The last lines the session's server wrote."""
        logs = await self.docker("logs", self.container_id, tail=lines)
        return logs.decode(errors="replace").strip()

    async def _early_exit_error(self, exit_code: int) -> SpawnException:
        tail = await self.log_tail(_LOG_TAIL_LINES)
        request = self.resource_request
        message = (
            f"The session container from image {request.image} ({request.image_name}) exited "
            f"with code {exit_code} before its server was ready."
        )
        if tail:
            message += f" Last output: {tail}"
        return spawn_error(message, reason="container_exited", status_code=500)


def _ended_or_ending(future: asyncio.Future | None) -> bool:
    """Whether `future` (the hub's spawn task) has ended or has been asked to cancel."""
    return isinstance(future, asyncio.Task) and (future.done() or future.cancelling() > 0)


def _being_cancelled(future: asyncio.Future | None) -> bool:
    """Whether `future` (a task) has been asked to cancel and has not ended yet."""
    return isinstance(future, asyncio.Task) and not future.done() and future.cancelling() > 0


async def _answers(url: str) -> bool:
    try:
        response = await AsyncHTTPClient().fetch(url, request_timeout=2, raise_error=False)
    except (HTTPClientError, OSError):
        return False
    return response.code == 200
