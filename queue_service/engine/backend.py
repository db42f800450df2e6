"""What differs between the two places sessions run: one Docker engine, or a Docker Swarm.

The queue service picks one `EngineBackend` at start, from `QueueService.engine`, and from then
on asks it rather than the mode's name:

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
- whether the sessions' containers are on this machine (`sessions_here`): the service then reads
  their freezer, warns inside them by `docker exec`, commits them itself and builds the catalog's
  heavy images; otherwise they are on other nodes, reached only through each node's agent.

`DockerBackend` (docker_backend.py) and `SwarmBackend` (swarm_backend.py) are the two.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from .inventory import NodeInfo


@dataclass(frozen=True)
class NodeReading:
    """What one read of the nodes found: those taking sessions, and those withheld until an
    admin fixes their engine (name → its wrong settings), which waiting requests are told of."""

    nodes: list[NodeInfo]
    withheld: dict[str, list[str]] = field(default_factory=dict)


#: A job's exit as the engine has it: (its exit code, the end of its log), the code None while
#: it runs (job_exit).
JobExit = tuple[int | None, str]


class LogStream(Protocol):
    """A job's output as it comes (bytes), which another thread may `close()`."""

    def __iter__(self): ...

    def close(self) -> None: ...


class EngineBackend(ABC):
    """The few things the queue service does differently on one engine and on a Swarm."""

    #: Whether the sessions' containers run on the engine the service talks to (see above).
    sessions_here: ClassVar[bool]
    #: Whether nodes join, drain and fail while the service runs, so that every reconciler
    #: round reads them again; otherwise they are read once, when the engine first answers.
    nodes_change: ClassVar[bool]
    #: Whether a followed job log ends when the job exits (see follow_job_log).
    follow_ends_by_itself: ClassVar[bool] = True

    def __init__(self, client) -> None:
        self.client = client

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
