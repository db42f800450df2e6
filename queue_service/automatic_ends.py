"""Automatic ends of sessions: the maximum lifetime per group, idle ends, and the warnings before.

**Lifetime.** Admins set a hub group property `max_session_lifetime` (Backend.AI's name), in
seconds or as a duration string ("90m", "8h", "1d", "1h30m"); 0 or absent means no limit from that
group. A user in several groups gets the tightest limit that any of them sets, as with quotas
(`quotas.py`). A malformed value is logged, naming the group, and ignored: it never stops a round.
The service ends a session over its lifetime by stopping its server through the hub's API (so the
spawner removes the container and only then gives the slice back, which schedules the next
request at once), and its record ends with reason `lifetime`.

**Idle.** jupyterhub-idle-culler, a hub-managed service of the shipped config, stops servers whose
hub `last_activity` is older than its timeout. The hub does not tell a spawner who asked for a stop;
the spawner says `end_reason=idle` in its release when the culler's own test holds for the server
(`fgpu_spawner/idle.py` says why that is sound). The service predicts the same end from the same
hub field (`last_activity` + the timeout, at the earliest), to show it and to warn.

**Warnings.** `warning_lead` seconds before a planned end the Sessions page says when and why
(`view`), and the session itself gets `~/FGPU-WARNING.txt`. A lifetime warning is also written to
the session's open terminals; an idle one is not: jupyter-server counts terminal output as activity
(`jupyter_server_terminals`' `write_message`), and would report it to the hub, postponing the very
end it announces. A file the service writes with `docker exec` is no activity. An idle warning whose
end has moved away (the student came back) takes its file away again. In Swarm mode sessions run
on other engines: the page warns, the file is not written (`notifier` None).

The time is `clock()`: tests set it.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from .errors import Refusal
from .hub_client import HubError
from .models import Status, as_utc

LIFETIME_PROPERTY = "max_session_lifetime"
IDLE, LIFETIME = "idle", "lifetime"
#: What a spawner may say about a stop it performs (a lifetime end is the service's own decision).
SPAWNER_CLAIMS = (IDLE,)
WARNING_FILE = "FGPU-WARNING.txt"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_RE = re.compile(r"(?:(\d+(?:\.\d+)?)\s*([smhd]))\s*", re.IGNORECASE)


class LifetimeError(ValueError):
    pass


def parse_duration(value) -> float | None:
    """Seconds from a number (seconds) or a string ("3600", "90m", "8h", "1d", "1h30m"); None for
    0 (no limit). A LifetimeError for anything else (negative, not finite, unknown unit)."""
    if isinstance(value, bool):
        raise LifetimeError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION_RE.findall(text)
            if not parts or _DURATION_RE.sub("", text):
                raise LifetimeError(
                    f"{value!r} is not a duration (seconds, or e.g. 90m, 8h, 1d, 1h30m)"
                ) from None
            seconds = sum(float(n) * _UNITS[unit.lower()] for n, unit in parts)
    else:
        raise LifetimeError(f"{value!r} is not a duration (seconds, or e.g. 90m, 8h, 1d, 1h30m)")
    if not 0 <= seconds < float("inf"):
        raise LifetimeError(f"{value!r} is not a duration (zero or more seconds)")
    return seconds or None


def group_lifetime(group: str, properties: dict) -> float | None:
    """The group's `max_session_lifetime` in seconds (None: no limit); LifetimeError naming the
    group for a malformed one."""
    value = (properties or {}).get(LIFETIME_PROPERTY)
    if value is None:
        return None
    try:
        return parse_duration(value)
    except LifetimeError as e:
        raise LifetimeError(f"group {group}: {LIFETIME_PROPERTY} {e}") from None


def tightest(limits: dict[str, float | None]) -> tuple[float, str] | None:
    """(seconds, group) of the shortest limit any group sets, or None when none does."""
    set_ = [(seconds, group) for group, seconds in limits.items() if seconds is not None]
    return min(set_) if set_ else None


def describe(seconds: float) -> str:
    """3600 → "1 h", 5400 → "1 h 30 min", 45 → "45 s"."""
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    parts = [f"{h} h" if h else "", f"{m} min" if m else "", f"{s} s" if s else ""]
    return " ".join(p for p in parts if p) or "0 s"


@dataclass(frozen=True)
class PlannedEnd:
    """When (epoch seconds) and why (`IDLE`, `LIFETIME`) a session will end, and the limit."""

    why: str
    at: float
    limit: float
    group: str = ""

    def text(self) -> str:
        if self.why == LIFETIME:
            return f"maximum lifetime of {describe(self.limit)} ({self.group})"
        return f"idle: no activity for {describe(self.limit)}"

    def reason(self) -> str:
        """The record's reason once it ended so."""
        if self.why == LIFETIME:
            return f"lifetime: reached the maximum of {describe(self.limit)} (group {self.group})"
        return idle_reason(self.limit)


def idle_reason(timeout: float) -> str:
    return f"idle: no activity for {describe(timeout)}, stopped by the idle culler"


def planned_end(
    started: float,
    lifetime: tuple[float, str] | None,
    last_activity: float | None,
    idle_timeout: float,
) -> PlannedEnd | None:
    """The first automatic end ahead of a running session: its lifetime's, or the earliest moment
    the idle culler may stop it (the hub's last activity, or the start, + the timeout)."""
    ends = []
    if lifetime is not None:
        ends.append(PlannedEnd(LIFETIME, started + lifetime[0], lifetime[0], lifetime[1]))
    if idle_timeout > 0:
        since = last_activity if last_activity is not None else started
        ends.append(PlannedEnd(IDLE, since + idle_timeout, idle_timeout))
    return min(ends, key=lambda end: end.at) if ends else None


def warning_message(end: PlannedEnd, now: float) -> str:
    """What the student reads in the session (the file, a terminal)."""
    at = datetime.fromtimestamp(end.at, UTC).strftime("%H:%M:%S UTC")
    left = describe(max(0.0, end.at - now))
    if end.why == LIFETIME:
        return (
            f"fGPU hub: this session ends at {at} (in about {left}): it reaches the {end.text()}."
            " Save your work now; your home folder is kept."
        )
    return (
        f"fGPU hub: this session will be stopped at {at} (in about {left}) if it stays unused"
        f" ({end.text()}). Use it to keep it; your home folder is kept either way."
    )


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat()


def _epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    return as_utc(datetime.fromisoformat(iso.replace("Z", "+00:00"))).timestamp()


#: Writes the warning file in the session's home and, when $2 is 1, to each of its terminals (the
#: pseudo-terminals its user owns: Jupyter's terminals are not in utmp, so `wall` misses them).
#: The text comes as an argument, never as shell code.
_WARN_SCRIPT = (
    'printf "%s\\n" "$1" > "$HOME/' + WARNING_FILE + '"; '
    'if [ "$2" = 1 ]; then for t in /dev/pts/[0-9]*; do '
    '[ -w "$t" ] && printf "\\r\\n\\033[1;31m%s\\033[0m\\r\\n" "$1" > "$t"; done; fi; true'
)
_CLEAR_SCRIPT = 'rm -f "$HOME/' + WARNING_FILE + '"'


class DockerNotifier:
    """Puts a warning inside a session container on this engine (`docker exec` as its user)."""

    def __init__(self, docker_client):
        self.docker = docker_client

    def _container(self, session_id: str):
        from .session_containers import running_session_containers

        return running_session_containers(self.docker, session_id).get(session_id)

    def warn(self, session_id: str, text: str, terminals: bool) -> bool:
        container = self._container(session_id)
        if container is None:
            return False
        result = container.exec_run(
            ["sh", "-c", _WARN_SCRIPT, "sh", text, "1" if terminals else "0"]
        )
        return result.exit_code == 0

    def clear(self, session_id: str) -> None:
        container = self._container(session_id)
        if container is not None:
            container.exec_run(["sh", "-c", _CLEAR_SCRIPT])


class AutomaticEnds:
    """Each round: plans every running session's next automatic end, warns ahead of it, and ends
    the sessions over their lifetime (the idle culler ends the idle ones)."""

    def __init__(
        self,
        manager,
        hub,
        quotas,
        idle_timeout: float = 0.0,
        warning_lead: float = 600.0,
        notifier=None,
        clock=time.time,
        log=None,
    ):
        self.manager = manager
        self.hub = hub
        self.quotas = quotas
        self.idle_timeout = idle_timeout
        self.warning_lead = warning_lead
        self.notifier = notifier
        self.clock = clock
        self.log = log
        self._ends: dict[str, PlannedEnd] = {}
        # Ends this service has asked the hub for: the release that follows takes its reason.
        self._ending: dict[str, PlannedEnd] = {}
        self._warned: dict[str, PlannedEnd] = {}
        # Running sessions seen so far: a new one has its home's warning file from an earlier
        # session (homes outlive sessions) taken away.
        self._seen: set[str] = set()
        self._bad_values: dict[str, str] = {}
        self._tasks: set[asyncio.Task] = set()

    # -- what the pages and the release path read ----------------------------------------------

    def view(self, session_id: str) -> dict | None:
        """`ends` of a running session's view: {at, why, text, warning} or None."""
        end = self._ends.get(session_id)
        if end is None:
            return None
        return {
            "at": _iso(end.at),
            "why": end.why,
            "text": end.text(),
            "warning": self._due(end, self.clock()),
        }

    def release_reason(self, session_id: str, claimed: str | None) -> tuple[str | None, str | None]:
        """(end code, reason text) of a release: the service's own planned end first, else what
        the spawner says (only `idle`); (None, None) for an ordinary stop."""
        if session_id in self._ending:
            end = self._ending[session_id]
            return end.why, end.reason()
        if claimed is None or claimed == "":
            return None, None
        if claimed not in SPAWNER_CLAIMS:
            raise Refusal(f"Unknown end reason {claimed!r}; a spawner may say: idle.")
        return IDLE, idle_reason(self.idle_timeout)

    # -- the rounds -------------------------------------------------------------------------------

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.round()
            except Exception:  # tried again next round
                if self.log:
                    self.log.exception("automatic ends: a round failed")

    async def round(self) -> None:
        running = [
            r
            for r in self.manager.active_records()
            if r.status == Status.RUNNING and r.started is not None
        ]
        lifetimes = await self._lifetimes({r.user for r in running})
        activity = await self._activity() if self.idle_timeout > 0 and running else {}
        ends = {}
        for record in running:
            end = planned_end(
                as_utc(record.started).timestamp(),
                lifetimes.get(record.user),
                activity.get((record.user, record.server_name)),
                self.idle_timeout,
            )
            if end is not None:
                ends[record.id] = end
        self._ends = ends
        ids = {r.id for r in running}
        self._seen &= ids
        for gone in set(self._ending) - ids:
            self._ending.pop(gone)
        for gone in set(self._warned) - ids:
            self._warned.pop(gone)
        now = self.clock()
        for record in running:
            end = ends.get(record.id)
            if record.id not in self._seen and not self._due(end, now):
                await self._notify("clear", record.id)
            await self._warn(record, end, now)
            self._seen.add(record.id)
            if end is not None and end.why == LIFETIME and now >= end.at:
                self._end(record, end)

    async def _lifetimes(self, users) -> dict[str, tuple[float, str]]:
        """Each user's tightest lifetime from the groups the queue knows them in (as of their last
        request), the groups' properties as the hub has them (cached a few seconds)."""
        by_group: dict[str, float | None] = {}
        for group in {g for user in users for g in self.quotas.groups_of(user)}:
            try:
                properties = (await self.hub.group(group)).get("properties") or {}
                by_group[group] = group_lifetime(group, properties)
                self._bad_values.pop(group, None)
            except LifetimeError as e:
                self._complain(group, str(e))
                by_group[group] = None
            except HubError as e:
                self._say("cannot read group %s from the hub: %s", group, e.message)
                by_group[group] = None
        result = {}
        for user in users:
            limit = tightest({g: by_group.get(g) for g in self.quotas.groups_of(user)})
            if limit is not None:
                result[user] = limit
        return result

    async def _activity(self) -> dict[tuple[str, str], float]:
        """The hub's last activity of every active server, the field the idle culler reads."""
        try:
            servers = await self.hub.server_activity()
        except (HubError, OSError) as e:
            self._say("cannot read the servers' activity from the hub: %s", e)
            return {}
        return {key: moment for key, iso in servers.items() if (moment := _epoch(iso))}

    def _due(self, end: PlannedEnd | None, now: float) -> bool:
        return end is not None and now >= end.at - self.warning_lead

    async def _warn(self, record, end: PlannedEnd | None, now: float) -> None:
        due = self._due(end, now)
        warned = self._warned.get(record.id)
        if due and warned != end:
            self._warned[record.id] = end
            await self._notify("warn", record.id, warning_message(end, now), end.why == LIFETIME)
        elif not due and warned is not None:
            # The end moved out of reach (activity, a longer limit): the warning no longer holds.
            self._warned.pop(record.id)
            await self._notify("clear", record.id)

    async def _notify(self, action: str, session_id: str, *args) -> None:
        if self.notifier is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, getattr(self.notifier, action), session_id, *args
            )
        except Exception as e:  # the page still warns; the next change tries again
            self._say("could not %s inside session %s: %s", action, session_id, e)

    def _end(self, record, end: PlannedEnd) -> None:
        if record.id in self._ending:
            return
        self._ending[record.id] = end
        self._say(
            "session %s of %s reached its %s; stopping it", record.id, record.user, end.text()
        )
        task = asyncio.create_task(self._stop(record))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stop(self, record) -> None:
        try:
            await self.hub.stop_server(record.user, record.server_name)
        except HubError as e:
            # Tried again next round.
            self._ending.pop(record.id, None)
            self._say("the hub cannot stop %s/%s: %s", record.user, record.server_name, e.message)

    def _complain(self, group: str, message: str) -> None:
        """Log a malformed value once per value (every round would flood the log)."""
        if self._bad_values.get(group) != message:
            self._bad_values[group] = message
            if self.log:
                self.log.error("Ignoring a malformed session lifetime: %s", message)

    def _say(self, message: str, *args) -> None:
        if self.log:
            self.log.warning("automatic ends: " + message, *args)
