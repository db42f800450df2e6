"""A session container left frozen is thawed: no session stays paused for good.

The service's own commits no longer pause a container (`container_commits.py`), but a
container can still end up frozen: `docker pause` by hand, an engine that failed to resume one, or
a cgroup freezer left `FROZEN` while a `runc exec` was stuck in it (what froze a session for 46
minutes; docs/source/howto/logs-and-health.md, "A container that does not answer"). A frozen session answers
nothing, and every engine call that touches it hangs.

Each reconciler round, `FreezeWatch.check` reads the freezer of every live session container on
this machine's engine straight from the cgroup file system (no engine call, so it cannot hang on
the container), and thaws one frozen for longer than `thaw_after` seconds: `docker unpause` where
the engine itself paused it, then the freezer file where it is still frozen, since the engine may
be the part that is stuck. Each thaw is logged, and `api/health` reports the containers frozen
now and those thawed in the last hour (which `fgpu-hub doctor` and the Cluster page show).

Only a local engine's containers can be read so; on a remote engine `FreezeWatch` is not made.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: A container frozen for this long is thawed: a moment's pause (a commit by hand) is left alone.
THAW_AFTER_SECONDS = 60.0
#: How long a thaw stays in the health report.
THAW_REPORTED_SECONDS = 3600.0


def freezer_file(container_id: str, root: Path = CGROUP_ROOT) -> Path | None:
    """The file that says (and sets) whether the container is frozen, under either cgroup version
    and either cgroup driver of the engine; None when this machine has none for it."""
    candidates = (
        root / "freezer" / "docker" / container_id / "freezer.state",
        root / "freezer" / "system.slice" / f"docker-{container_id}.scope" / "freezer.state",
        root / "docker" / container_id / "cgroup.freeze",
        root / "system.slice" / f"docker-{container_id}.scope" / "cgroup.freeze",
    )
    return next((path for path in candidates if path.exists()), None)


def is_frozen(text: str) -> bool:
    """A freezer file's content: `FROZEN`/`FREEZING` (cgroup v1) or `1` (cgroup v2)."""
    return text.strip() in ("FROZEN", "FREEZING", "1")


def freezer_value(path: Path, frozen: bool) -> str:
    """What to write into `path` to freeze or thaw, in its cgroup version's words."""
    if path.name == "freezer.state":
        return "FROZEN" if frozen else "THAWED"
    return "1" if frozen else "0"


def read_frozen(path: Path) -> bool:
    try:
        return is_frozen(path.read_text())
    except OSError:  # the container went away meanwhile
        return False


@dataclass(frozen=True)
class Thaw:
    container_id: str
    session_id: str
    frozen_for: float
    at: float
    how: str

    def as_dict(self) -> dict:
        return {
            "container": self.container_id[:12],
            "session_id": self.session_id,
            "frozen_for": round(self.frozen_for),
            "at": self.at,
            "how": self.how,
        }


class FreezeWatch:
    """Thaws live session containers frozen past `thaw_after` (see the module's docstring)."""

    def __init__(
        self,
        calls,
        docker_client,
        thaw_after: float = THAW_AFTER_SECONDS,
        root: Path = CGROUP_ROOT,
        clock: Callable[[], float] = time.time,
        log=None,
    ):
        self.calls = calls
        self.docker = docker_client
        self.thaw_after = thaw_after
        self.root = root
        self.clock = clock
        self.log = log
        # Frozen containers: {container id: (session id, frozen since)}.
        self._frozen: dict[str, tuple[str, float]] = {}
        self._thaws: deque[Thaw] = deque(maxlen=50)

    async def check(self, running: dict) -> None:
        """One round over `running` ({session id: sparse container}, the reconciler's listing)."""
        now = self.clock()
        self.calls.forget({container.id for container in running.values()})
        frozen = {}
        for session_id, container in running.items():
            path = freezer_file(container.id, self.root)
            paused = (container.attrs.get("State") or "") == "paused"
            if paused or (path is not None and read_frozen(path)):
                frozen[container.id] = (session_id, paused, path)
        self._frozen = {
            cid: (sid, self._frozen.get(cid, (sid, now))[1]) for cid, (sid, _, _) in frozen.items()
        }
        for container_id, (session_id, paused, path) in frozen.items():
            since = self._frozen[container_id][1]
            if now - since >= self.thaw_after:
                await self._thaw(container_id, session_id, paused, path, now - since)

    def frozen(self) -> list[dict]:
        now = self.clock()
        return [
            {"container": cid[:12], "session_id": sid, "for": round(now - since)}
            for cid, (sid, since) in sorted(self._frozen.items(), key=lambda item: item[1][1])
        ]

    def thaws(self) -> list[Thaw]:
        """The thaws of the last `THAW_REPORTED_SECONDS`."""
        return [t for t in self._thaws if self.clock() - t.at < THAW_REPORTED_SECONDS]

    async def _thaw(self, container_id, session_id, paused, path, frozen_for) -> None:
        how = await self._unpause(container_id, session_id, path) if paused else []
        if path is not None and read_frozen(path):
            try:
                path.write_text(freezer_value(path, frozen=False))
                how.append(f"wrote {freezer_value(path, frozen=False)} to {path}")
            except OSError as e:
                self._say("cannot thaw %s through %s: %s", container_id[:12], path, e)
        if not how:
            return
        self._frozen.pop(container_id, None)
        thaw = Thaw(container_id, session_id, frozen_for, self.clock(), "; ".join(how))
        self._thaws.append(thaw)
        self._say(
            "thawed the container %s of session %s, frozen for %.0f s (%s)",
            container_id[:12],
            session_id,
            frozen_for,
            thaw.how,
        )

    async def _unpause(self, container_id, session_id, path) -> list[str]:
        """`docker unpause` of a container the engine holds paused; what it took, or []."""
        try:
            await self._engine_unpause(container_id, session_id)
            return ["docker unpause"]
        except Exception as e:  # unresponsive or refused: the freezer file may still do
            self._say("docker unpause of %s failed: %s", container_id[:12], e)
            if path is None or read_frozen(path) or "not paused" not in str(e):
                return []
        # The engine holds it paused while its cgroup runs (thawed behind the engine's back, as
        # an earlier round may have done): freeze it for a moment, so that the engine's own
        # unpause goes through and its state follows. Should that fail, the caller thaws it.
        path.write_text(freezer_value(path, frozen=True))
        try:
            await self._engine_unpause(container_id, session_id)
        except Exception as e:
            self._say("docker unpause of %s failed again: %s", container_id[:12], e)
            return []
        return ["froze it again for the engine's own docker unpause"]

    async def _engine_unpause(self, container_id: str, session_id: str) -> None:
        unpause = self.docker.api.unpause
        await self.calls.call(
            container_id, session_id, "unpause", unpause, container_id, remedy=True
        )

    def _say(self, message: str, *args) -> None:
        if self.log:
            self.log.warning("freeze watch: " + message, *args)
