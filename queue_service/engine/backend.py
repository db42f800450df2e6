"""What differs between the places sessions run: one Docker engine, a Docker Swarm, or another.

The queue service makes one `EngineBackend` at start, of the class `QueueService.engine_class`
names (an entry point of the `fgpu_hub.engines` group, `docker` or `swarm`, or a class), and from
then on asks it rather than a mode's name. Each backend is a configurable of its own, with its own
settings (`c.DockerEngine.…`, `c.SwarmEngine.…`; `c.EngineBackend.…` for all of them), and owns:

- which nodes take sessions (`read_nodes`, `describe`), and whether they change while the
  service runs (`nodes_change`): the one engine's node is read once, a Swarm's every round;
- what runs (`session_lister`, for the reconciler);
- a running session's live usage (`usage_of`): sampled on this engine, or reported by the
  session's node agent;
- which catalog images sessions can run (`images_listable`, `runnable_images`): the engine's own,
  or those the site's registry holds;
- a batch job's exit, its exit code and its log (`job_exit`, `remove_job`, `job_log`,
  `follow_job_log`): its container's on one engine (job_containers.py), its service's and task's
  on a Swarm (job_services.py);
- what runs beside the API while the service lives (`start`): the live stats on one engine, the
  node agents on a Swarm; how job exits are noticed (`watch_job_exits`);
- what the service can do to a running session's container itself (`freeze_watch`,
  `session_notifier`, `builds_images`), which where sessions run on other nodes it leaves to
  each node's agent (`reported_nodes`, `commit_registry`, `rotate_node_key`).

`DockerEngine` (docker_engine.py) and `SwarmEngine` (swarm_engine.py) are the two shipped;
docs/source/reference/engines.md shows a third's skeleton.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from jupyterhub.traitlets import ByteSpecification, EntryPointType
from traitlets import Float, MetaHasTraits
from traitlets.config import LoggingConfigurable

from queue_service.core.errors import Refusal

from .inventory import NodeInfo

#: The entry point group engine classes are found in, by name (pyproject.toml).
ENTRY_POINTS = "fgpu_hub.engines"
#: The shipped engines, found by name even where the package's entry points are not installed
#: (a source tree run in place).
SHIPPED = {
    "docker": "queue_service.engine.docker_engine.DockerEngine",
    "swarm": "queue_service.engine.swarm_engine.SwarmEngine",
}


@dataclass(frozen=True)
class NodeReading:
    """What one read of the nodes found: those taking sessions, and those withheld until an
    admin fixes their engine (name → its wrong settings), which waiting requests are told of."""

    nodes: list[NodeInfo]
    withheld: dict[str, list[str]] = field(default_factory=dict)


#: A job's exit as the engine has it: (its exit code, the end of its log), the code None while
#: it runs (job_exit).
JobExit = tuple[int | None, str]


@dataclass(frozen=True)
class SessionCommit:
    """What a session is saved as (private_images.py names it): the image's reference without a
    registry, its labels, the commit's message, and the label the engine adds naming the image
    the session ran."""

    reference: str
    labels: dict[str, str]
    message: str
    source_label: str


class LogStream(Protocol):
    """A job's output as it comes (bytes), which another thread may `close()`."""

    def __iter__(self): ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ServiceHooks:
    """What a backend may ask of the service that makes it (all engine-neutral)."""

    #: The ids of the sessions that hold a slice now.
    running_ids: Callable[[], Iterable[str]]
    #: The registry's credentials (QueueService.registry_auth_file), or None.
    registry_auth: Callable[[], dict[str, str] | None]
    #: The catalog's images pinned to a registry digest: {reference: digest}.
    image_digests: Callable[[], dict[str, str]]
    #: This hub's deployment id (the `fgpu.deployment` label).
    deployment_id: str
    #: Engine calls that may hang, each bounded and counted (container_calls.py).
    container_calls: object
    #: Per-container locks the commits and in-session warnings share (container_calls.py).
    container_locks: object
    #: The node agents' reports (node_reports.py), which the service's API receives.
    node_reports: object
    #: The nodes' keys (node_credentials.py).
    node_credentials: object
    #: The hub service whose token the node agents hold (QueueService.agent_service).
    agent_service: str
    #: The catalog's entries, as the image store views them (what the nodes pull ahead).
    catalog: Callable[[], list[dict]] = list


class EngineClass(EntryPointType):
    """`engine_class`: an entry point's name, a class or its import name; the shipped engines'
    names work without the entry points installed."""

    @property
    def help(self) -> str:
        # Without JupyterHub's list of the installed entry points after it: the help ends with
        # its example, as every setting's does (the docs render it from there).
        return self._original_help

    @help.setter
    def help(self, value: str) -> None:
        self._original_help = value

    def validate(self, obj, value):
        if isinstance(value, str) and value.lower() not in self.load_entry_points():
            value = SHIPPED.get(value.lower(), value)
        return super().validate(obj, value)


class _ConfigurableABC(ABCMeta, MetaHasTraits):
    """Traits, and abstract methods that a backend missing one cannot be made without."""


class EngineBackend(LoggingConfigurable, metaclass=_ConfigurableABC):
    """The things the queue service does differently where sessions run (see above)."""

    #: Whether nodes join, drain and fail while the service runs, so that every reconciler
    #: round reads them again; otherwise they are read once, when the engine first answers.
    nodes_change: ClassVar[bool]
    #: Whether a followed job log ends when the job exits (see follow_job_log).
    follow_ends_by_itself: ClassVar[bool] = True
    #: Whether the catalog's heavy images are built on the engine the service talks to (the
    #: one sessions run on), when QueueService.build_in_background is on.
    builds_images: ClassVar[bool] = False
    #: Whether the nodes' GPUs are simulated (the pages say so).
    gpus_simulated: ClassVar[bool] = False

    reserve_cpu = Float(
        0.0,
        config=True,
        help="""
        CPU cores of the node kept back from sessions.

        Example::

            c.EngineBackend.reserve_cpu = 2
        """,
    )
    reserve_mem = ByteSpecification(
        "512M",
        config=True,
        help="""
        Memory of the node kept back from sessions (bytes or 1G...).

        Example::

            c.EngineBackend.reserve_mem = "4G"
        """,
    )

    def __init__(self, client, hooks: ServiceHooks, **kwargs) -> None:
        super().__init__(**kwargs)
        self.client = client
        self.hooks = hooks

    async def start(self) -> None:
        """Start what runs beside the API while the service lives (the service has listened)."""

    @abstractmethod
    def watch_job_exits(self, job_ends) -> Awaitable[None]:
        """What notices batch jobs that exit by themselves, for as long as the service runs:
        `job_ends.watch()` where the engine's events say so, `job_ends.look()` where not."""

    def freeze_watch(self):
        """What thaws the sessions' frozen containers (frozen_containers.py), where the service
        can reach their freezer; None elsewhere."""
        return None

    def session_notifier(self):
        """What warns inside a running session (by `docker exec`), where the service reaches
        its container; None where sessions are warned on their pages only."""
        return None

    def session_exec(self):
        """What starts a process inside a running session (session_exec.py: the SSH service's
        shells), where the service reaches its container; None elsewhere."""
        return None

    def reported_nodes(self) -> Callable[[], list[dict]] | None:
        """What reads the nodes as their agents report them (NodeReports.nodes), for the health
        check of their engines, where sessions run on other nodes; None where they run on the
        engine the service checks itself."""
        return None

    def volume_inspector(self) -> Callable[[str], dict | None] | None:
        """What reads a named volume of the sessions' engine (its inspect answer, None when it
        does not exist), where the service reaches their volumes (the homes a job's notebook
        is looked for in); None elsewhere."""
        return None

    @property
    def commit_registry(self) -> str:
        """The registry to which a node's agent pushes a session saved as a private image;
        empty where the service commits sessions itself (or nowhere)."""
        return ""

    async def commit_session(
        self, session_id: str, node: str, commit: SessionCommit
    ) -> tuple[dict, Callable[[], None] | None]:
        """Save the running session `session_id` (on `node`) as the image `commit` names, the
        session going on; what was committed (`image`, `id`, and what else the engine says)
        and what removes it again (None when it cannot be). Refusal when it cannot be saved."""
        raise Refusal("Sessions cannot be saved as images on this engine.", "conflict")

    def note_report(self, node: str) -> None:
        """A node's agent has just reported (api/nodes/{node}/report): what to order it is
        decided now, and goes out in the answer."""

    def image_holders(self) -> dict[str, frozenset[str]]:
        """Per catalog image name, the nodes that hold it already (where its sessions go
        first); none where sessions run on one engine."""
        return {}

    def images_on_nodes(self) -> tuple[dict[str, dict], dict[str, dict]] | None:
        """(per image name, per node) what each node holds of the catalog's images
        (image_prepull.py's views), where nodes pull them ahead; None elsewhere."""
        return None

    async def rotate_node_key(self, node: str):
        """A new key for `node`'s agent (api/nodes/{node}/key); refused where no agents run."""
        raise Refusal("No node agents are deployed here (single-host mode).", "conflict")

    @abstractmethod
    async def read_nodes(self) -> NodeReading:
        """The nodes as the engine has them now."""

    @abstractmethod
    def describe(self, nodes: list[NodeInfo]) -> str:
        """The log line of a new inventory."""

    @abstractmethod
    def session_lister(self):
        """What lists the sessions that hold a slice, for the reconciler."""

    @abstractmethod
    def usage_of(self, session_id: str) -> dict | None:
        """A running session's live usage (stats.py's shape), None while unknown."""

    @property
    @abstractmethod
    def images_listable(self) -> bool:
        """Whether the images sessions can run can be listed at all; if not, every image of the
        catalog is offered."""

    @abstractmethod
    def runnable_images(self, wanted: Iterable[str]) -> dict[str, str | None]:
        """Blocking: the references sessions can run (among `wanted`, the catalog's), each with
        the registry digest it points at now, or None where no registry pins it."""

    @abstractmethod
    def job_exit(self, session_id: str) -> JobExit | None:
        """Blocking: how a batch job ended by itself, with the end of its log; (None, "") while
        it runs where the engine sees it; None when there is no exit of the job's own to read
        (nothing of it is left, or it ended some other way: the reconciler's reason stands)."""

    @abstractmethod
    def remove_job(self, session_id: str) -> None:
        """Blocking: remove an ended job's container or service (its log has been read)."""

    @abstractmethod
    def job_log(self, session_id: str, lines: int) -> str | None:
        """Blocking: the last `lines` of a started job's output; None when nothing of it runs."""

    @abstractmethod
    def follow_job_log(self, session_id: str, tail: int) -> LogStream | None:
        """Blocking: a started job's output from its last `tail` lines on, as it comes; None
        when nothing of it runs. On one engine the stream ends when the job exits; a Swarm's
        goes on until it is closed (follow_ends_by_itself)."""

    def stop_folder_writes(self, session_id: str, source: str) -> bool:
        """Blocking: make the session's read-write binds of the host directory `source`
        read-only now (folder_write_stops.py); False where this engine cannot reach the
        session's mounts (a Swarm's are on other nodes: the folder is mounted read-only at the
        session's next start). Raises CalledProcessError or OSError when the kernel refuses."""
        return False

    def exited_jobs(self, deployment_id: str) -> list[str]:
        """Blocking: the batch jobs that have exited by themselves, for an engine whose events
        do not say so (a Swarm's); one engine's `die` events do (job_ends.py)."""
        return []
