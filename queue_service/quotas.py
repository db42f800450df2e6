"""Quotas per user and per hub group, read from JupyterHub group properties.

Admins edit them in the hub's admin panel, as a group property named `fgpu_quota`:

    {"cpu": 8, "mem": "16G", "fgpu": 2, "sessions": 4, "pending": 4, "resource_groups": ["default"],
     "storage": "50G"}

Every key is optional; a missing key means no limit from that group. `per_member`
(`{"fgpu": 2, "sessions": 2}`) holds each member on their own: it tightens the member's per-user
quota (a course's "at most 2 fGPU per student"). `storage` bounds the size of
storage folders: a user's own folders under the user quota, all members' own folders under a
group's (folders.py). The same mapping holds the
group's budgets over a time window (`fgpu_hours_per_week`, ...: budgets.py). Each user also has the
configured per-user default (`DEFAULT_USER_QUOTA` unless the site sets its own), so that one student
cannot hold the hub. The scheduler needs these synchronously, so the book keeps what the hub last
said, refreshed whenever a user asks for a session.
"""

from __future__ import annotations

import math

from fgpu_shared.units import parse_size
from queue_service.core import resource_model
from queue_service.core.budgets import BUDGET_KEYS, Budget, BudgetError, parse_budgets
from queue_service.core.presets import PRESETS_PROPERTY, Preset, PresetError, parse_presets

from .hub_client import HubClient, HubError
from .jobs import JOB_TIME_PROPERTY, GroupJobTimes, parse_job_time_limit, tightest

QUOTA_PROPERTY = "fgpu_quota"
#: Every key a `fgpu_quota` mapping may hold (a course's bounds name some of them: course_bounds.py).
QUOTA_KEYS = {"cpu", "mem", "fgpu", "sessions", "pending", "resource_groups", "storage"}
QUOTA_KEYS |= BUDGET_KEYS | {"per_member"}
#: The keys of a group's `per_member` mapping: what each member may hold at once.
MEMBER_KEYS = {"cpu", "mem", "fgpu", "sessions", "pending"}


#: What one user may hold unless the site says otherwise: enough for a class's work (a notebook, a
#: second one to compare, a third for a long run; two more queued behind them), and no more, so
#: that a student who fires a hundred requests holds five, and the rest get a refusal at once.
#: `fgpu` is the shipped form's largest session (FGPU_MAX_PER_SESSION), so every session the form
#: offers can start. A site raises any of them (jupyterhub_config.py: FGPU_USER_QUOTA).
DEFAULT_USER_QUOTA = {"sessions": 3, "pending": 2, "fgpu": 4}


class QuotaError(ValueError):
    pass


def parse_quota(data: dict | None, where: str, keys=QUOTA_KEYS) -> resource_model.Quota | None:
    """A `fgpu_quota` mapping → Quota (its `per_member` checked: parse_member_quota); a clear
    error naming the group for a malformed one."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise QuotaError(f"{where}: {QUOTA_PROPERTY} must be a mapping")
    unknown = set(data) - keys
    if unknown:
        raise QuotaError(f"{where}: unknown quota key(s) {', '.join(sorted(unknown))}")
    parse_member_quota(data, where)
    try:
        mem = parse_size(data["mem"]) if data.get("mem") is not None else None
        if mem is not None and mem < 0:
            raise ValueError(f"{data['mem']!r} is not a size")
        groups = data.get("resource_groups")
        if isinstance(groups, str):
            groups = [groups]
        return resource_model.Quota(
            max_slots=resource_model.SlotLimits(
                _number(data.get("cpu")), mem, _number(data.get("fgpu"))
            ),
            max_sessions=_count(data.get("sessions")),
            max_pending=_count(data.get("pending")),
            resource_groups=tuple(groups) if groups is not None else None,
        )
    except (TypeError, ValueError, OverflowError) as e:
        raise QuotaError(f"{where}: {e}") from None


def parse_member_quota(data: dict | None, where: str) -> resource_model.Quota | None:
    """A group quota's `per_member` → the Quota each member is held to on their own, on top of
    the per-user quota (`{"fgpu": 2, "sessions": 2}`: no member holds more than 2 fGPU or runs
    more than 2 sessions); None when it has none."""
    if not isinstance(data, dict) or data.get("per_member") is None:
        return None
    return parse_quota(data["per_member"], f"{where}: per_member", keys=MEMBER_KEYS)


def tightest_quota(quotas) -> resource_model.Quota:
    """One Quota holding each limit at its lowest among `quotas` (None: no limit there); the
    resource groups are the first's (a member quota never names them)."""
    quotas = list(quotas)

    def lowest(values):
        return min((v for v in values if v is not None), default=None)

    slots = [q.max_slots for q in quotas]
    return resource_model.Quota(
        max_slots=resource_model.SlotLimits(
            *(lowest(getattr(s, key) for s in slots) for key in ("cpu", "mem", "fgpu"))
        ),
        max_sessions=lowest(q.max_sessions for q in quotas),
        max_pending=lowest(q.max_pending for q in quotas),
        resource_groups=quotas[0].resource_groups,
    )


def parse_storage(data: dict | None, where: str) -> int | None:
    """The `storage` of a quota mapping in bytes (a size: "10G"), or None for no limit."""
    if not isinstance(data, dict) or data.get("storage") is None:
        return None
    try:
        size = parse_size(data["storage"])
    except (TypeError, ValueError) as e:
        raise QuotaError(f"{where}: storage: {e}") from None
    if size < 0:
        raise QuotaError(f"{where}: storage: {data['storage']!r} is not a size")
    return size


def active_session_limit(quota: dict) -> int:
    """How many sessions of one user may run or wait at once under this per-user quota: its
    running `sessions` plus its `pending` ones; 0 (no limit) when either is unlimited. The hub's
    named-server limit follows it, so that the hub never refuses what the queue would take
    (batch jobs waiting, which count against their own limit and not `pending`, are given room
    of their own there: fgpu_spawner/named_servers.py)."""
    parsed = parse_quota(quota, "user quota")
    if parsed.max_sessions is None or parsed.max_pending is None:
        return 0
    return parsed.max_sessions + parsed.max_pending


def _number(value) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan  # said below as people read it, not as float() does
    # inf and nan are no amount; the scheduler would fail on them in every pass.
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{value!r} is not an amount (a finite number, zero or more)")
    return number


def _count(value) -> int | None:
    if value is None:
        return None
    try:
        count = int(value)
    except (TypeError, ValueError, OverflowError):
        count = -1  # said below as people read it, not as int() does
    if count < 0:
        raise ValueError(f"{value!r} is not a count (a whole number, zero or more)")
    return count


class QuotaBook:
    def __init__(self, user_default: dict | None = None, log=None):
        self.user_default = parse_quota(user_default or {}, "default user quota")
        self.user_storage = parse_storage(user_default, "default user quota")
        self.log = log
        self._group_storage: dict[str, int | None] = {}
        self._groups: dict[str, tuple[str, ...]] = {}
        self._group_quotas: dict[str, resource_model.Quota | None] = {}
        self._member_quotas: dict[str, resource_model.Quota | None] = {}
        #: Each member's own quota where a group of theirs has `per_member`, made again after
        #: a refresh (None: to be made), not on each of the scheduler's passes.
        self._user_quotas: dict[str, resource_model.Quota] | None = None
        self._group_budgets: dict[str, tuple[Budget, ...]] = {}
        self._group_presets: dict[str, tuple[Preset, ...]] = {}
        self._members: dict[str, tuple[str, ...]] = {}
        self._group_job_times: dict[str, GroupJobTimes] = {}

    async def refresh(self, user_model: dict, hub: HubClient) -> None:
        """Remember the user's groups and those groups' quotas, as the hub has them now."""
        groups = tuple(user_model.get("groups", []))
        self._groups[user_model["name"]] = groups
        for group in groups:
            model = await hub.group(group)
            properties = model.get("properties") or {}
            self._members[group] = tuple(model.get("users") or ())
            try:
                data = properties.get(QUOTA_PROPERTY)
                self._group_quotas[group] = parse_quota(data, f"group {group}")
                self._member_quotas[group] = parse_member_quota(data, f"group {group}")
            except QuotaError as e:
                # A typo in the admin panel must not stop every spawn: ignore it, loudly.
                if self.log:
                    self.log.error("Ignoring a malformed quota: %s", e)
                self._group_quotas[group] = self._member_quotas[group] = None
            self._group_storage[group] = self._parse_storage(properties, group)
            self._group_budgets[group] = self._parse_budgets(properties, group)
            self._group_presets[group] = self._parse_presets(properties, group)
            self._group_job_times[group] = self._parse_job_times(properties, group)
        self._user_quotas = None  # the user's groups, or a group's per_member, may have changed

    def _parse_job_times(self, properties: dict, group: str) -> GroupJobTimes:
        try:
            return parse_job_time_limit(properties.get(JOB_TIME_PROPERTY), f"group {group}")
        except ValueError as e:
            if self.log:
                self.log.error("Ignoring a malformed job time limit: %s", e)
            return GroupJobTimes()

    def job_times_of(self, user: str) -> GroupJobTimes:
        """The tightest job time limits of the user's groups (jobs.py), as last refreshed."""
        return tightest(self._group_job_times.get(g, GroupJobTimes()) for g in self.groups_of(user))

    def _parse_storage(self, properties: dict, group: str) -> int | None:
        try:
            return parse_storage(properties.get(QUOTA_PROPERTY), f"group {group}")
        except QuotaError as e:
            if self.log:
                self.log.error("Ignoring a malformed storage quota: %s", e)
            return None

    def storage_limits(self, groups) -> list[tuple[str | None, int]]:
        """The storage quotas over a user's folders: (None, bytes) for the user's own, and
        (group, bytes) for each of their groups' over all its members' folders."""
        limits = [(None, self.user_storage)] if self.user_storage is not None else []
        for group in groups:
            if self._group_storage.get(group) is not None:
                limits.append((group, self._group_storage[group]))
        return limits

    def _parse_budgets(self, properties: dict, group: str) -> tuple[Budget, ...]:
        data = properties.get(QUOTA_PROPERTY)
        try:
            return parse_budgets(data if isinstance(data, dict) else None, group)
        except BudgetError as e:
            if self.log:
                self.log.error("Ignoring a malformed budget: %s", e)
            return ()

    def _parse_presets(self, properties: dict, group: str) -> tuple[Preset, ...]:
        try:
            return parse_presets(properties.get(PRESETS_PROPERTY), f"group {group}")
        except PresetError as e:
            if self.log:
                self.log.error("Ignoring a group's malformed presets: %s", e)
            return ()

    def presets_of(self, groups: tuple[str, ...]) -> dict[str, tuple[Preset, ...]]:
        """Each of these groups' own presets (presets.py), as the hub last said."""
        return {group: self._group_presets.get(group, ()) for group in groups}

    async def refresh_users(self, names, hub: HubClient) -> None:
        """Refresh these users (say, everyone with an active session after a restart, when the
        book is empty and their group quotas would otherwise go unchecked in the first pass)."""
        for name in sorted(set(names)):
            try:
                await self.refresh(await hub.user(name), hub)
            except HubError as e:
                if self.log:
                    self.log.error("Cannot read the groups of %s from the hub: %s", name, e.message)

    def groups_of(self, user: str) -> tuple[str, ...]:
        return self._groups.get(user, ())

    def memberships(self) -> dict[str, tuple[str, ...]]:
        """Every known user's hub groups (a copy: compare it with a later one to see a change)."""
        return dict(self._groups)

    def budgets_of(self, group: str) -> tuple[Budget, ...]:
        """The group's budgets (budgets.py), as the hub last said."""
        return self._group_budgets.get(group, ())

    def members_of(self, group: str) -> tuple[str, ...]:
        """The group's members, as the hub last said: a budget counts all of their use."""
        return self._members.get(group, ())

    def snapshot(self) -> resource_model.Quotas:
        """What the scheduler checks: the default user quota and every known group's quota."""
        groups = {name: quota for name, quota in self._group_quotas.items() if quota is not None}
        return resource_model.Quotas(
            users=self._members_own_quotas(),
            groups=groups,
            default_user=self.user_default or resource_model.UNLIMITED,
        )

    def _members_own_quotas(self) -> dict[str, resource_model.Quota]:
        """The per-user quota, tightened by the `per_member` quotas of each user's groups, for
        every known user in such a group."""
        if self._user_quotas is None:
            default = self.user_default or resource_model.UNLIMITED
            self._user_quotas = {}
            for user, groups in self._groups.items():
                members = [self._member_quotas[g] for g in groups if self._member_quotas.get(g)]
                if members:
                    self._user_quotas[user] = tightest_quota([default, *members])
        return self._user_quotas

    def user_limit(self, user: str, groups: tuple[str, ...]) -> dict:
        """The tightest cpu/mem/fgpu totals among the quotas that apply to this user."""
        snapshot = self.snapshot()
        limits = [snapshot.for_user(user).max_slots]
        limits += [snapshot.for_group(group).max_slots for group in groups]
        return {
            key: min((getattr(q, key) for q in limits if getattr(q, key) is not None), default=None)
            for key in ("cpu", "mem", "fgpu")
        }
