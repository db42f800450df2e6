"""Automatic ends of sessions: the maximum lifetime per group, idle ends (the culler's and a
group's GPU-aware idle policy, which may reclaim only when someone waits), and the warnings before.

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

**GPU-aware idle policy** (a group property `idle_policy`, a mapping; every key optional):

    {"timeout": "1h", "fgpu_timeout": "20m", "cpu_percent": 10, "gpu_percent": 10,
     "reclaim": "when_waiting"}

A session is idle when the hub has seen no activity from it (kernels, terminals, pages: the
server's reports; SSH shells and forwards: the SSH service's, ssh/activity.py) and its own use stayed under `cpu_percent` (of one core) and `gpu_percent` (where
NVML reports it) for the whole timeout: `fgpu_timeout` for sessions holding fGPU, `timeout` for
the others. `reclaim`: `always` (the default) ends an idle session at its timeout, with reason
`idle`; `when_waiting` keeps it while no PENDING request needs what it holds, and once one does,
warns and ends it `warning_lead` seconds later (if it is still idle and still needed), with
reason `reclaimed`. A user in several groups gets the strictest policy: the shortest timeouts,
the highest thresholds, and `when_waiting` only if every group with a policy says so.

**Warnings.** `warning_lead` seconds before a planned end the Sessions page says when and why
(`view`), and the session itself gets `~/FGPU-WARNING.txt` (the `notifier`,
engine/session_warnings.py, writes it). A lifetime warning is also written to
the session's open terminals; an idle one is not: jupyter-server counts terminal output as activity
(`jupyter_server_terminals`' `write_message`), and would report it to the hub, postponing the very
end it announces. A file the service writes into the container is no activity. An idle warning whose
end has moved away (the student came back) takes its file away again. In Swarm mode sessions run
on other engines: the page warns, the file is not written (`notifier` None).

The time is `clock()`: tests set it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from fgpu_shared import units
from image_catalog.job_options import parse_job
from queue_service.core.errors import Refusal
from queue_service.core.status import Status
from queue_service.store.models import as_utc

from .hub_client import HubError
from .queue_pass import in_line

LIFETIME_PROPERTY = "max_session_lifetime"
POLICY_PROPERTY = "idle_policy"
IDLE, LIFETIME, RECLAIMED, TIMEOUT = "idle", "lifetime", "reclaimed", "timeout"
_POLICY_KEYS = {"timeout", "fgpu_timeout", "cpu_percent", "gpu_percent", "reclaim"}
_RECLAIM_MODES = ("always", "when_waiting")
#: What a spawner may say about a stop it performs (a lifetime end is the service's own decision).
SPAWNER_CLAIMS = (IDLE,)


class LifetimeError(ValueError):
    """A malformed group property of this module (a lifetime, an idle policy)."""


def parse_duration(value) -> float | None:
    """units.parse_duration, failing with this module's LifetimeError."""
    try:
        return units.parse_duration(value)
    except ValueError as e:
        raise LifetimeError(str(e)) from None


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


@dataclass(frozen=True)
class IdlePolicy:
    """A group's idle policy (the module's docstring); `group` names where it came from."""

    timeout: float | None = None
    fgpu_timeout: float | None = None
    cpu_percent: float = 10.0
    gpu_percent: float = 10.0
    when_waiting: bool = False
    group: str = ""

    def limit_for(self, fgpu: float) -> float | None:
        if fgpu > 0 and self.fgpu_timeout is not None:
            return self.fgpu_timeout
        return self.timeout

    def busy(self, usage: dict | None) -> bool:
        """Whether a usage sample is above the thresholds (unknown figures count as idle)."""
        usage = usage or {}
        cpu, gpu = usage.get("cpu_percent"), usage.get("gpu_util_percent")
        return (cpu is not None and cpu >= self.cpu_percent) or (
            gpu is not None and gpu >= self.gpu_percent
        )


def group_idle_policy(group: str, properties: dict) -> IdlePolicy | None:
    """The group's `idle_policy` (None: none set); LifetimeError naming the group and the key
    for a malformed one."""
    value = (properties or {}).get(POLICY_PROPERTY)
    if value is None:
        return None
    where = f"group {group}: {POLICY_PROPERTY}"
    if not isinstance(value, dict):
        raise LifetimeError(f"{where} must be a mapping, not {value!r}")
    unknown = set(value) - _POLICY_KEYS
    if unknown:
        raise LifetimeError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if value.get("reclaim", "always") not in _RECLAIM_MODES:
        raise LifetimeError(f"{where}: reclaim must be always or when_waiting")
    try:
        return IdlePolicy(
            timeout=parse_duration(value["timeout"]) if "timeout" in value else None,
            fgpu_timeout=parse_duration(value["fgpu_timeout"]) if "fgpu_timeout" in value else None,
            cpu_percent=_percent(value.get("cpu_percent", 10.0)),
            gpu_percent=_percent(value.get("gpu_percent", 10.0)),
            when_waiting=value.get("reclaim") == "when_waiting",
            group=group,
        )
    except LifetimeError as e:
        raise LifetimeError(f"{where}: {e}") from None


def _percent(value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
        raise LifetimeError(f"{value!r} is not a percentage (0 to 100)")
    return float(value)


def strictest(policies: list[IdlePolicy]) -> IdlePolicy | None:
    """One policy from several groups': the shortest timeouts, the highest thresholds, and
    `when_waiting` only if every one says so."""
    if not policies:
        return None

    def shortest(values):
        set_ = [v for v in values if v is not None]
        return min(set_) if set_ else None

    return IdlePolicy(
        timeout=shortest(p.timeout for p in policies),
        fgpu_timeout=shortest(p.fgpu_timeout for p in policies),
        cpu_percent=max(p.cpu_percent for p in policies),
        gpu_percent=max(p.gpu_percent for p in policies),
        when_waiting=all(p.when_waiting for p in policies),
        group=", ".join(sorted(p.group for p in policies)),
    )


def needs_slice_of(pending, holder, holder_group: str | None) -> bool:
    """Whether a waiting request needs what a running session holds: it may run where the session
    runs, and it wants fGPU only if the session holds some (CPU and memory every session holds)."""
    if pending.resource_group not in (None, holder_group):
        return False
    return pending.fgpu <= 0 or holder.fgpu > 0


def policy_end(
    policy: IdlePolicy | None,
    fgpu: float,
    idle_since: float,
    needed: bool,
    needed_since: float | None,
    lead: float,
) -> PlannedEnd | None:
    """The end an idle policy plans for a session idle since `idle_since`: at its timeout
    (`always`), or, with `when_waiting`, `lead` seconds after a request first needed its slice
    once it was idle (None while nobody needs it)."""
    limit = policy.limit_for(fgpu) if policy is not None else None
    if limit is None:
        return None
    idle_at = idle_since + limit
    if not policy.when_waiting:
        return PlannedEnd(IDLE, idle_at, limit, policy.group)
    if not needed or needed_since is None:
        return None
    return PlannedEnd(RECLAIMED, max(idle_at, needed_since + lead), limit, policy.group)


def _idle_long(policy: IdlePolicy, record, idle_since: float, now: float) -> bool:
    limit = policy.limit_for(record.fgpu)
    return limit is not None and now >= idle_since + limit


def tightest(limits: dict[str, float | None]) -> tuple[float, str] | None:
    """(seconds, group) of the shortest limit any group sets, or None when none does."""
    set_ = [(seconds, group) for group, seconds in limits.items() if seconds is not None]
    return min(set_) if set_ else None


#: How every duration reads (fgpu_shared/units.py).
describe = units.format_duration


@dataclass(frozen=True)
class PlannedEnd:
    """When (epoch seconds) and why (`IDLE`, `LIFETIME`) a session will end, and the limit."""

    why: str
    at: float
    limit: float
    group: str = ""

    def text(self) -> str:
        if self.why == TIMEOUT:
            return f"time limit of {describe(self.limit)}"
        if self.why == LIFETIME:
            return f"maximum lifetime of {describe(self.limit)} ({self.group})"
        if self.why == RECLAIMED:
            return f"idle for {describe(self.limit)} while a request waits for its slice"
        if self.group:
            return f"idle: no use for {describe(self.limit)} ({self.group})"
        return f"idle: no activity for {describe(self.limit)}"

    def reason(self) -> str:
        """The record's reason once it ended so."""
        if self.why == TIMEOUT:
            return f"timeout: the job ran for its time limit of {describe(self.limit)}"
        if self.why == LIFETIME:
            return f"lifetime: reached the maximum of {describe(self.limit)} (group {self.group})"
        if self.why == RECLAIMED:
            return (
                f"reclaimed for the queue: idle for {describe(self.limit)} while a request"
                f" waited (group {self.group})"
            )
        if self.group:
            return f"idle: no use for {describe(self.limit)} (group {self.group})"
        return idle_reason(self.limit)

    @property
    def by_culler(self) -> bool:
        """An idle end the culler makes (the service only predicts it)."""
        return self.why == IDLE and not self.group


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
    if end.why == RECLAIMED:
        return (
            f"fGPU hub: this session is idle and another student waits for its resources: it"
            f" will be stopped at {at} (in about {left}) unless you use it."
            " Your home folder is kept either way."
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


class AutomaticEnds:
    """Each round: plans every running session's next automatic end, warns ahead of it, and ends
    the sessions over their lifetime or their group's idle policy (the culler's ends are its own:
    they are only predicted here)."""

    def __init__(
        self,
        manager,
        hub,
        quotas,
        idle_timeout: float = 0.0,
        warning_lead: float = 600.0,
        notifier=None,
        end_notice=None,
        clock=time.time,
        log=None,
        job_limit=None,
    ):
        self.manager = manager
        # A batch job's time limit in seconds, from its job (jobs.JobRules.limit_of).
        self.job_limit = job_limit
        self.hub = hub
        self.quotas = quotas
        self.idle_timeout = idle_timeout
        self.warning_lead = warning_lead
        self.notifier = notifier
        # Tells each running session its planned end, for its status bar (session_end_notice.py).
        self.end_notice = end_notice
        self.clock = clock
        self.log = log
        self._ends: dict[str, PlannedEnd] = {}
        # Sessions this service has asked the hub to stop (once each). Why is told to the manager
        # (`expect_end`), whose release of the session then takes that reason, whoever releases.
        self._stopping: set[str] = set()
        self._warned: dict[str, PlannedEnd] = {}
        # Running sessions seen so far: a new one has its home's warning file from an earlier
        # session (homes outlive sessions) taken away.
        self._seen: set[str] = set()
        self._bad_values: dict[tuple[str, str], str] = {}
        self._tasks: set[asyncio.Task] = set()
        # Per running session: when its use was last above its policy's thresholds, and since
        # when a waiting request has needed its slice while it was idle past its timeout.
        self._busy_at: dict[str, float] = {}
        self._needed_since: dict[str, float] = {}
        self._kept: set[str] = set()

    # -- what the pages and the release path read ----------------------------------------------

    def view(self, session_id: str) -> dict | None:
        """`ends` of a running session's view, or None: {at, why, text, warning, kept_idle};
        `at` and `why` are None for a session idle past its policy's timeout that nobody needs
        (`kept_idle`), with no other end ahead."""
        end = self._ends.get(session_id)
        kept = session_id in self._kept
        if end is None and not kept:
            return None
        if end is None:
            return {"at": None, "why": None, "text": "", "warning": False, "kept_idle": True}
        return {
            "at": _iso(end.at),
            "why": end.why,
            "text": end.text(),
            "warning": self._due(end, self.clock()),
            "kept_idle": kept,
        }

    def spawner_claim(self, claimed: str | None) -> tuple[str | None, str | None]:
        """(end code, reason text) that a spawner's release may claim: only `idle`; (None, None)
        for an ordinary stop. The service's own planned ends (lifetime, reclaim, a policy's idle
        end) need no claim: the manager was told of them before the stop (`expect_end`), and
        they win over what a release names."""
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
        now = self.clock()
        active = self.manager.active_records()
        running = [r for r in active if r.status == Status.RUNNING and r.started is not None]
        # A job works by definition: no idle end, no reclaim, no lifetime; its time limit alone.
        jobs = [r for r in running if r.job_json]
        running = [r for r in running if not r.job_json]
        # A job deferred to its `start_after` is not waiting for room yet: it reclaims nothing.
        pending = [r for r in active if r.status == Status.PENDING and in_line(r)]
        lifetimes, policies = await self._group_settings({r.user for r in running})
        wants_activity = self.idle_timeout > 0 or any(policies.values())
        activity = await self._activity() if wants_activity and running else {}
        ids = {r.id for r in running}
        self._forget_all_but(ids | {r.id for r in jobs})
        idle_since = {
            r.id: self._idle_since(r, policies[r.user], activity)
            for r in running
            if r.user in policies
        }
        needed = self._needed(running, policies, idle_since, pending, now)
        ends, kept = {}, set()
        for record in running:
            started = as_utc(record.started).timestamp()
            last_activity = activity.get((record.user, record.server_name))
            candidates = [planned_end(started, lifetimes.get(record.user), last_activity, 0)]
            if self.idle_timeout > 0:
                candidates.append(planned_end(started, None, last_activity, self.idle_timeout))
            policy = policies.get(record.user)
            if policy is not None:
                since = idle_since[record.id]
                is_needed = record.id in needed
                if is_needed:
                    self._needed_since.setdefault(record.id, now)
                else:
                    self._needed_since.pop(record.id, None)
                candidates.append(
                    policy_end(
                        policy,
                        record.fgpu,
                        since,
                        is_needed,
                        self._needed_since.get(record.id),
                        self.warning_lead,
                    )
                )
                if _idle_long(policy, record, since, now) and policy.when_waiting and not is_needed:
                    kept.add(record.id)
            found = [end for end in candidates if end is not None]
            if found:
                ends[record.id] = min(found, key=lambda end: end.at)
        ends.update(self._job_ends(jobs))
        self._ends, self._kept = ends, kept
        for record in jobs:
            end = ends.get(record.id)  # none: no time limit at all (a site's limit of 0)
            if end is not None and now >= end.at:
                self._end(record, end)
        for record in running:
            end = ends.get(record.id)
            if record.id not in self._seen and not self._due(end, now):
                await self._notify("clear", record.id)
            await self._warn(record, end, now)
            self._seen.add(record.id)
            if end is not None and not end.by_culler and now >= end.at:
                self._end(record, end)
        if self.end_notice is not None:
            await self.end_notice.tell(
                {r.id: (r.user, r.server_name, self.view(r.id)) for r in running}
            )

    def _job_ends(self, jobs) -> dict[str, PlannedEnd]:
        ends = {}
        for record in jobs:
            job = parse_job(record.job_json)
            limit = self.job_limit(job, record.user) if self.job_limit else None
            if limit:
                started = as_utc(record.started).timestamp()
                ends[record.id] = PlannedEnd(TIMEOUT, started + limit, limit)
        return ends

    def _idle_since(self, record, policy: IdlePolicy, activity: dict) -> float:
        """Since when the session has been idle by its policy: its start, the hub's last activity,
        or its last use above the thresholds, whichever came last."""
        if policy.busy(self.manager.usage_of(record.id)):
            self._busy_at[record.id] = self.clock()
        moments = (
            as_utc(record.started).timestamp(),
            activity.get((record.user, record.server_name)),
            self._busy_at.get(record.id),
        )
        return max(t for t in moments if t is not None)

    def _needed(self, running, policies, idle_since, pending, now) -> set[str]:
        """The `when_waiting` sessions, idle past their timeout, that a waiting request needs: one
        per request, in queue order, the longest idle first (one already warned before any other,
        so a warning is not moved to another session). One session's slice may not be all that a
        large request lacks; the next round gives it another once this one is reclaimed."""
        candidates = [
            r
            for r in running
            if r.user in policies
            and policies[r.user].when_waiting
            and _idle_long(policies[r.user], r, idle_since[r.id], now)
        ]
        candidates.sort(key=lambda r: (r.id not in self._needed_since, idle_since[r.id]))
        taken: set[str] = set()
        for request in sorted(pending, key=lambda r: r.seq):
            for record in candidates:
                group = self.manager.group_of_node(record.node)
                if record.id not in taken and needs_slice_of(request, record, group):
                    taken.add(record.id)
                    break
        return taken

    def _forget_all_but(self, ids: set[str]) -> None:
        """What was kept about sessions that no longer run."""
        self._seen &= ids
        self._stopping &= ids
        for kept in (self._warned, self._busy_at, self._needed_since):
            for gone in set(kept) - ids:
                kept.pop(gone)

    async def _group_settings(self, users):
        """Each user's tightest lifetime and strictest idle policy, from the groups the queue knows
        them in (as of their last request), the groups' properties as the hub has them (cached a
        few seconds). A malformed value counts as not set."""
        lifetimes: dict[str, float | None] = {}
        policies: dict[str, IdlePolicy | None] = {}
        for group in {g for user in users for g in self.quotas.groups_of(user)}:
            try:
                properties = (await self.hub.group(group)).get("properties") or {}
            except HubError as e:
                self._say("cannot read group %s from the hub: %s", group, e.message)
                properties = {}
            lifetimes[group] = self._read(group, LIFETIME_PROPERTY, group_lifetime, properties)
            policies[group] = self._read(group, POLICY_PROPERTY, group_idle_policy, properties)
        by_user_lifetime, by_user_policy = {}, {}
        for user in users:
            groups = self.quotas.groups_of(user)
            limit = tightest({g: lifetimes.get(g) for g in groups})
            if limit is not None:
                by_user_lifetime[user] = limit
            policy = strictest([policies[g] for g in groups if policies.get(g) is not None])
            if policy is not None:
                by_user_policy[user] = policy
        return by_user_lifetime, by_user_policy

    def _read(self, group: str, name: str, parse, properties: dict):
        try:
            value = parse(group, properties)
        except LifetimeError as e:
            self._complain((group, name), str(e))
            return None
        self._bad_values.pop((group, name), None)
        return value

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
            text = warning_message(end, now)
            if not await self._notify("warn", record.id, text, end.why == LIFETIME):
                self._warned.pop(record.id, None)  # not written (a commit, say): next round
        elif not due and warned is not None:
            # The end moved out of reach (activity, a longer limit): the warning no longer holds.
            self._warned.pop(record.id)
            await self._notify("clear", record.id)

    async def _notify(self, action: str, session_id: str, *args) -> bool:
        """Whether the notifier did it; the page warns either way."""
        if self.notifier is None:
            return True
        try:
            return bool(await getattr(self.notifier, action)(session_id, *args))
        except Exception as e:  # the next change tries again
            self._say("could not %s inside session %s: %s", action, session_id, e)
            return False

    def _end(self, record, end: PlannedEnd) -> None:
        if record.id in self._stopping:
            return
        self._stopping.add(record.id)
        self.manager.expect_end(record.id, end.why, end.reason())
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
            self._stopping.discard(record.id)
            self.manager.forget_expected_end(record.id)
            self._say("the hub cannot stop %s/%s: %s", record.user, record.server_name, e.message)

    def _complain(self, key: tuple[str, str], message: str) -> None:
        """Log a malformed value once per value (every round would flood the log)."""
        if self._bad_values.get(key) != message:
            self._bad_values[key] = message
            if self.log:
                what = "session lifetime" if key[1] == LIFETIME_PROPERTY else "idle policy"
                self.log.error("Ignoring a malformed %s: %s", what, message)

    def _say(self, message: str, *args) -> None:
        if self.log:
            self.log.warning("automatic ends: " + message, *args)
