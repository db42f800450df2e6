"""The queue manager: the DB's session records joined to the pure scheduler.

Every change (a new request, a release, a cancel, a timeout) runs with one scheduling pass, in one
transaction, under one lock, so two spawns can never be granted the same slice. The DB work runs on
a thread of its own; the event loop only publishes the state each pass leaves (the active records,
their views and queue positions, as one object), so reads never wait for the DB and never see half
a pass. A long-poll is woken only when its own record changes: a release reaches the next pending
spawn at once, with no polling timer, and leaves the other waiters asleep.

A pass starts from the records this process last committed (the published state) and reads from
the DB only what its change touched; it considers again only the waiting requests that the changes
since the last pass can concern (`reconsideration.reconsidered`): a release in one resource group
leaves thousands waiting in another as they were, and decides exactly what a pass over all of them
would (tests/test_queue.py compares the two over random changes). A pass over everything still
runs when the inventory, the quotas or the settings change, and under DRF; `schedule` and
`refresh` read every active record from the DB again, and so does a pass that finds one changed
outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import operator
import re
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import event, func, select
from sqlalchemy.orm import sessionmaker

from queue_service.core import (
    admission,
    end_reasons,
    free_capacity,
    limits,
    pending_timeouts,
    reconsideration,
    resource_model,
    scheduler,
)
from queue_service.core.errors import Refusal
from queue_service.core.status import ALLOCATED, FINAL, Status
from queue_service.store.models import SessionRecord, as_utc, request_view, utcnow

#: Views of ended records kept in memory, so a spawn that reads its ended record needs no DB call.
ENDED_VIEWS_KEPT = 10_000
#: Request keys released before their request arrived, remembered so that a late request with one
#: of them never queues. A spawn that gave up sends its release at once, so a few suffice.
ABANDONED_KEYS_KEPT = 10_000
#: Ends announced before they happen (`expect_end`), kept until the release comes.
EXPECTED_ENDS_KEPT = 10_000
_KEY_RE = re.compile(r"[0-9a-f]{32}")
_FINAL_VALUES = [status.value for status in FINAL]
_ACTIVE_VALUES = [Status.PENDING.value, *(status.value for status in ALLOCATED)]


#: Why a record that was still waiting runs: its container ran already (an older DB restored).
ADOPTED_WAITING_REASON = "adopted from its container: the service's record of it was still waiting"


class Refused(Refusal):
    """A request that must not wait: it can never fit, or it breaks a quota outright."""


@dataclass(frozen=True)
class _Dirt:
    """What changed since the last pass that placed: resource groups whose nodes, holdings or
    line changed (None: every group), and users whose holdings changed (their quotas then read
    differently). The next pass considers again only the requests joined to these
    (`reconsideration.reconsidered`)."""

    groups: frozenset = frozenset()
    users: frozenset = frozenset()

    def __or__(self, other: _Dirt) -> _Dirt:
        return _Dirt(self.groups | other.groups, self.users | other.users)


@dataclass(frozen=True)
class _State:
    """What every read sees, replaced whole after each write: the active records (detached,
    read only) by request order and by id, their views by id, the waiting ones' positions, and the
    views of the records this write ended."""

    records: tuple[SessionRecord, ...] = ()
    by_id: dict = dataclasses.field(default_factory=dict)
    views: dict = dataclasses.field(default_factory=dict)
    #: Per id, what its view was built from (`_view_signature`): an unchanged one is reused.
    signatures: dict = dataclasses.field(default_factory=dict)
    positions: dict = dataclasses.field(default_factory=dict)
    ended: dict = dataclasses.field(default_factory=dict)
    #: The ids whose view's version this write changed, or that ended: their long-polls wake.
    changed: frozenset = frozenset()
    #: What the next pass must consider again (see `_Dirt`).
    dirt: _Dirt = _Dirt()
    #: What the last pass that placed took as given (inventory, quotas, hub groups, policy); a
    #: pass that finds another runs over every record. None: the next pass runs over all.
    basis: tuple | None = None
    inventory_version: int = 0


@dataclass(frozen=True)
class SchedulerSettings:
    units_per_gpu: int = 1
    policy: str = "fifo"
    placement: str = "best_fit"
    max_skips: int = 10
    pending_timeout: float = 3600.0


def withheld_note(withheld: dict[str, list[str]]) -> str:
    """What a request waiting for room is told of nodes held back ("" when none is)."""
    if not withheld:
        return ""
    names = sorted(withheld)
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    if len(names) == 1:
        return (
            f"node {shown} takes no sessions until an admin fixes its engine's isolation settings"
        )
    return f"nodes {shown} take no sessions until an admin fixes their engines' isolation settings"


class QueueManager:
    def __init__(
        self, db: sessionmaker, nodes, settings: SchedulerSettings, quotas, incremental=True
    ):
        self.db = db
        watch_flushes(db)
        # False: every pass reads every active record and considers every pending one (the
        # reference the tests compare the incremental pass against).
        self.incremental = incremental
        self.settings = settings
        self.quotas = quotas
        self._lock = asyncio.Lock()
        # Every write and every pass runs here, one at a time, off the event loop: a pass over
        # thousands of records or a slow PostgreSQL round trip never stalls the pages and the
        # long-polls, which read the published state (`_State`) instead.
        self._db_thread = ThreadPoolExecutor(1, thread_name_prefix="fgpu-queue-db")
        self._abandoned: OrderedDict[str, None] = OrderedDict()
        # Long-polls by session id, woken only when their own record's version changes.
        self._watchers: dict[str, set[asyncio.Future]] = {}
        # The records a spawn or a launch has dealt with in this process's life. The service
        # ends with its hub, so a spawn from before it is gone, and so is any release of its.
        self._handled_here: set[str] = set()
        self._ended_views: OrderedDict[str, dict] = OrderedDict()
        # Why a session is being stopped through the hub: (code, reason) by id, for its release.
        self._expected_ends: OrderedDict[str, tuple[str, str | None]] = OrderedDict()
        # None while the engine's containers are counted (the reconciler says so), else why not:
        # no slice is granted before every container that holds one is known.
        self.engine_problem: str | None = None
        # Nodes of the Swarm kept out of the inventory because their engine lets sessions reach
        # one another or gain privileges (app.py, `isolation_refused`): name → the wrong settings.
        # A request waiting for room is told, so that it does not wait in silence.
        self.withheld_nodes: dict[str, list[str]] = {}
        self._inventory_version = 0
        # Per record id, the scheduler's view of a record object (`_Facts`), rebuilt only when a
        # write gives the id a new object: a pass over thousands of waiting records reads these.
        self._facts: dict[str, _Facts] = {}
        self._facts_basis: tuple | None = None
        self.set_nodes(nodes)
        # Read once, at start (before any request is served); from then on every write publishes.
        self._state = _State()
        self._state = self._read_state()
        # Live usage by session id; the service wires in its stats sampler (stats.py).
        self.usage_of: Callable[[str], dict | None] = lambda session_id: None
        # A further admission check, run in the write that admits a request, after the quotas:
        # (db, request, groups) → a Refusal or None. The service wires in the usage budgets
        # (usage_store.py).
        self.admission_check: Callable[..., Refusal | None] = lambda db, request, groups: None
        # A running session's next automatic end; the service wires in automatic_ends.py.
        self.ends_of: Callable[[str], dict | None] = lambda session_id: None

    async def replace_nodes(self, nodes, withheld: dict[str, list[str]] | None = None) -> None:
        """A new inventory (a Swarm node joined, drained or failed), taken between writes: a pass
        on the DB thread reads the inventory throughout, and must see one, whole. `withheld`:
        the nodes left out of it until an admin fixes their engine."""
        async with self._lock:
            self.withheld_nodes = dict(withheld or {})
            self.set_nodes(nodes)

    def set_nodes(self, nodes) -> None:
        """The inventory, known at start or once the engine first answers; every view reads it.
        Once the service runs, `replace_nodes` sets it."""
        self.nodes = list(nodes)
        self._inventory_version += 1
        self._gpu_memory = {gpu.uuid: gpu.memory_bytes for n in self.nodes for gpu in n.gpus}
        self._gpu_order = {n.name: [gpu.uuid for gpu in n.gpus] for n in self.nodes}
        self._node_names = {n.name for n in self.nodes}
        self._nodes_by_group: dict[str, set[str]] = {}
        self._group_of_node = {n.name: n.resource_group for n in self.nodes}
        for n in self.nodes:
            self._nodes_by_group.setdefault(n.resource_group, set()).add(n.name)

    def group_of_node(self, node: str | None) -> str | None:
        """The resource group of a node of the inventory, by name (None for an unknown one)."""
        return self._group_of_node.get(node)

    # -- requests from the spawner -------------------------------------------------------------

    async def submit(self, data: dict, groups: tuple[str, ...]) -> dict:
        """Queue a request. Its key (`id`, chosen by the spawner before it asks) makes a repeated
        submit return the same record, and one released before it arrived never queues."""
        request = _parse(data)
        key = _key(data)

        def record_request(db, quotas) -> str:
            if self.engine_problem is not None:
                raise Refused(self.engine_problem, "unavailable")
            known = db.get(SessionRecord, key) if key else None
            if known is not None:
                # A key can come from a user (a launch passes it through the hub's start): it
                # claims only the very request it was made for, never a bigger one.
                if any(getattr(known, field) != value for field, value in request.items()):
                    raise Refused(
                        "That request key belongs to another server or request.", "conflict"
                    )
                return known.id
            if key in self._abandoned:
                raise Refused("This spawn was given up before its request arrived.", "conflict")
            waiting = self._end_previous(db, request)
            if waiting is not None:
                return waiting.id
            return self._queue_new(db, key or uuid.uuid4().hex, request, groups, quotas)

        session_id = await self._write(record_request)
        self.note_handled(session_id)
        return await self.get(session_id)

    async def submit_many(self, requests: list[dict], groups: tuple[str, ...]) -> list[dict]:
        """Queue one user's requests together, all or none (a launch of `count` sessions). Each
        is admitted as `submit` admits it after the ones before it, a pass between them; a
        refusal of any records none. Every request carries its own new key (`id`)."""
        parsed = [(_key(data), _parse(data)) for data in requests]
        if any(key is None for key, _ in parsed):
            raise Refused("Malformed grant request: each request of a launch needs its key.")

        def record_all(db, quotas) -> None:
            if self.engine_problem is not None:
                raise Refused(self.engine_problem, "unavailable")
            for key, request in parsed:
                self._admit_one_of_many(db, key, request, groups, quotas)

        await self._write(record_all)
        for key, _ in parsed:
            self.note_handled(key)
        return [await self.get(key) for key, _ in parsed]

    def _admit_one_of_many(self, db, key: str, request: dict, groups, quotas) -> None:
        if key in self._abandoned or db.get(SessionRecord, key) is not None:
            raise Refused("That request key is taken.", "conflict")
        self._queue_new(db, key, request, groups, quotas)
        pending = db.scalars(_pending_query())
        self._place(list(db.scalars(_allocated_query())), list(pending), quotas)

    def _queue_new(self, db, key: str, request: dict, groups, quotas) -> str:
        """Admit `request` (or raise the refusal) and add it, PENDING, at the end of the line."""
        refusal = self._admission_refusal(db, request, groups, quotas)
        if refusal is None:
            refusal = self.admission_check(db, request, groups)
        if refusal is not None:
            raise Refused(refusal.message, refusal.cause)
        seq = (db.scalar(select(func.max(SessionRecord.seq))) or 0) + 1
        db.add(SessionRecord(id=key, seq=seq, status=Status.PENDING, **request))
        return key

    async def withdraw(self, ids: list[str]) -> None:
        """Remove records no spawn has used (a launch the hub refused at once), as if they had
        never been asked for; their keys never queue again."""

        def remove(db, _quotas) -> None:
            query = select(SessionRecord).where(
                SessionRecord.id.in_(ids),
                SessionRecord.status.in_([Status.PENDING.value, Status.SCHEDULED.value]),
            )
            for record in db.scalars(query):
                db.delete(record)
            for key in ids:
                self._remember_abandoned(key)

        await self._write(remove)

    async def wait(self, session_id: str, seen_version: str, timeout: float) -> dict:
        """The record once its version differs from `seen_version`, or at the timeout. Only a
        change of this record wakes the call: a pass that moves one spawn leaves the rest asleep."""
        view = await self.get(session_id)
        self.note_handled(session_id)
        if view["version"] != seen_version:
            return view
        woken = asyncio.get_running_loop().create_future()
        watchers = self._watchers.setdefault(session_id, set())
        watchers.add(woken)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken, timeout)
        finally:
            watchers.discard(woken)
            if not watchers:
                self._watchers.pop(session_id, None)
        return await self.get(session_id)

    def awaited(self, session_id: str) -> bool:
        """Whether a spawn waits on this record right now (it holds a long-poll on it)."""
        return bool(self._watchers.get(session_id))

    def note_handled(self, session_id: str) -> None:
        """A spawn or a launch of this process's life deals with this record."""
        self._handled_here.add(session_id)

    def handled_here(self, session_id: str) -> bool:
        """Whether a spawn or a launch has dealt with this record since the service started. One
        that none has may still be waiting only from before a hub crash: no release of its can
        be on its way (reconciler.respawn_abandoned issues its spawn again without a grace)."""
        return session_id in self._handled_here

    async def mark_running(self, session_id: str) -> dict:
        """Record that the granted session's server is up. Fail closed: a session whose grant has
        ended (released, reclaimed, cancelled) or never came is refused with 409, so that its
        spawn fails instead of running a container without a grant."""

        def mark(db, _quotas) -> None:
            record = self._load(db, session_id)
            if record.status not in ALLOCATED:
                why = f": {record.reason}" if record.reason else ""
                raise Refused(f"The session has no grant; it is {record.status}{why}.", "conflict")
            if record.status == Status.SCHEDULED:
                record.status, record.started = Status.RUNNING, utcnow()

        await self._write(mark, place=False)
        return await self.get(session_id)

    def expect_end(self, session_id: str, code: str, reason: str | None = None) -> None:
        """Say why a session is about to end, before stopping it through the hub: its release
        (from the spawner, which does not know who asked) then ends it with this code and
        reason. An expected end wins over the code its release or the reconciler names."""
        self._expected_ends[session_id] = (code, reason)
        self._expected_ends.move_to_end(session_id)
        while len(self._expected_ends) > EXPECTED_ENDS_KEPT:
            self._expected_ends.popitem(last=False)

    def forget_expected_end(self, session_id: str) -> None:
        """The stop announced by `expect_end` did not happen (the hub refused it)."""
        self._expected_ends.pop(session_id, None)

    def _end_code(self, session_id: str, code: str | None, reason: str | None):
        expected = self._expected_ends.pop(session_id, None)
        if expected is None:
            return code, reason
        return expected[0], expected[1] if expected[1] is not None else reason

    async def release(
        self, session_id: str, end_reason: str | None = None, reason: str | None = None
    ) -> dict:
        """End a session: TERMINATED if it held a slice, CANCELLED if it was waiting; ERROR when
        `end_reason` is `error` (a failed start). `end_reason` is a code of end_reasons.py (by
        default `user`, or `cancelled` for a waiting one; `idle`, `lifetime`, `reclaimed` for the
        automatic ends of automatic_ends.py), `reason` the words beside it.

        The answer is the ended record, with `released_from`: the status this call ended, or None
        when it had ended already (a repeated release changes nothing)."""

        def end(db, _quotas) -> str | None:
            record = db.get(SessionRecord, session_id)
            if record is None:
                self._remember_abandoned(session_id)
                raise KeyError(session_id)
            if record.status in FINAL:
                return None
            released_from = str(record.status)
            code, words = self._end_code(session_id, end_reason, reason)
            ending = Status.CANCELLED if record.status == Status.PENDING else Status.TERMINATED
            if code == end_reasons.ERROR:
                ending = Status.ERROR
            _finish(record, ending, words, code)
            return released_from

        released_from = await self._write(end)
        self._handled_here.discard(session_id)  # ended: never issued again, nothing to keep
        return {**await self.get(session_id), "released_from": released_from}

    async def release_where(
        self,
        ids: list[str],
        status: Status,
        reason: str,
        schedule: bool = True,
        end_reason: str | None = None,
    ) -> None:
        """Used by the reconciler: end these sessions with a reason and its code (end_reasons.py;
        by default the status's), then schedule (unless told not to: the P2 benchmark's polling
        baseline)."""

        def end(db, _quotas) -> None:
            for record in db.scalars(select(SessionRecord).where(SessionRecord.id.in_(ids))):
                if record.status not in FINAL:
                    code, words = self._end_code(record.id, end_reason, reason)
                    _finish(record, status, words, code)

        await self._write(end, place=schedule)

    async def schedule(self) -> None:
        """A pass with no other change: timeouts, and what a change outside this process freed
        (the reconciler runs one every round): it reads every active record from the DB again."""
        await self._write(lambda db, quotas: None, reload=True)

    async def refresh(self) -> None:
        """Read the active records again without placing anything: the reconciler starts each
        round with it, so a change made outside this process (an admin's SQL edit, a restored
        backup) is seen within a round."""
        await self._write(lambda db, quotas: None, place=False, reload=True)

    def _remember_abandoned(self, key: str) -> None:
        """A release of a key with no record: its request may still be on its way (the spawn
        timed out waiting for the answer), and must then end at once rather than queue."""
        if _KEY_RE.fullmatch(key or ""):
            self._abandoned[key] = None
            while len(self._abandoned) > ABANDONED_KEYS_KEPT:
                self._abandoned.popitem(last=False)

    async def unknown_among(self, ids: set[str]) -> set[str]:
        """The ids among `ids` that no record has, active or ended (for the reconciler)."""
        if not ids:
            return set()

        def known(db) -> set[str]:
            return set(db.scalars(select(SessionRecord.id).where(SessionRecord.id.in_(ids))))

        return set(ids) - await self._read(known)

    async def ended_among(self, ids: set[str]) -> list[SessionRecord]:
        """The records among `ids` that have ended (for the reconciler: containers to stop)."""
        if not ids:
            return []
        query = select(SessionRecord).where(
            SessionRecord.id.in_(ids), SessionRecord.status.in_(_FINAL_VALUES)
        )
        return await self._read(lambda db: list(db.scalars(query)))

    async def adopt(self, sessions, reason: str) -> list[str]:
        """Record running sessions from their containers' labels, as RUNNING with their grants,
        so that their slices count in the next pass: those that have no record (the DB was lost)
        and those whose record still waits (the DB was replaced by an older copy, a restored
        backup, taken before the request was granted). Returns the ids adopted."""

        def record_sessions(db, _quotas) -> list[str]:
            adopted = []
            seq = db.scalar(select(func.max(SessionRecord.seq))) or 0
            for session in sessions:
                record = db.get(SessionRecord, session.id)
                if record is None:
                    seq += 1
                    db.add(self._adopted_record(session, seq, reason))
                elif record.status == Status.PENDING:  # read again here: a grant may have come
                    self._take_grant(record, session)
                else:
                    continue
                adopted.append(session.id)
            return adopted

        return await self._write(record_sessions)

    def _adopted_record(self, session, seq: int, reason: str) -> SessionRecord:
        now = utcnow()
        return SessionRecord(
            id=session.id,
            seq=seq,
            status=Status.RUNNING,
            user=session.user,
            server_name=session.server_name,
            image=session.image,
            cpu=session.cpu,
            mem=session.mem,
            fgpu=session.fgpu,
            resource_group=self._group_of(session.node),
            node=session.node,
            grant_json=session.grant_json,
            reason=reason,
            scheduled_at=now,
            started=now,
        )

    def _take_grant(self, record: SessionRecord, session) -> None:
        """A waiting record takes the grant its running container carries."""
        record.status = Status.RUNNING
        record.node, record.grant_json = session.node, session.grant_json
        record.resource_group = self._group_of(session.node) or record.resource_group
        record.scheduled_at = record.started = utcnow()
        record.reason = ADOPTED_WAITING_REASON

    def _group_of(self, node: str) -> str | None:
        return next((n.resource_group for n in self.nodes if n.name == node), None)

    # -- reads: the published state, or the DB thread for ended records ----------------------------

    async def get(self, session_id: str) -> dict:
        """One session's view: an active or recently ended one from memory, any other from the DB
        (on its thread). KeyError if there is no such record."""
        view = self._state.views.get(session_id) or self._ended_views.get(session_id)
        if view is None:
            view = await self._read(lambda db: self._base_view(self._load(db, session_id), {}))
        return self._with_usage(view)

    def sessions(self, user: str | None = None) -> list[dict]:
        """The active sessions (of `user`, or everyone's), oldest request first."""
        return [
            self._with_usage(self._state.views[record.id])
            for record in self._state.records
            if user is None or record.user == user
        ]

    async def history(self, user: str | None = None) -> list[dict]:
        """Every session, ended ones included (of `user`, or everyone's), oldest first."""
        query = select(SessionRecord).order_by(SessionRecord.seq)
        if user is not None:
            query = query.where(SessionRecord.user == user)
        views = await self._read(lambda db: [self._base_view(r, {}) for r in db.scalars(query)])
        return [self._with_usage(self._state.views.get(v["id"], v)) for v in views]

    def active_records(self) -> list[SessionRecord]:
        """The records that have not ended, as of the last write (detached copies: read only)."""
        return list(self._state.records)

    def _allocated_records(self) -> list[SessionRecord]:
        return [r for r in self._state.records if r.status in ALLOCATED]

    def running_ids(self) -> set[str]:
        return {r.id for r in self._state.records if r.status == Status.RUNNING}

    async def resources(self, user: str, groups: tuple[str, ...], admin: bool) -> dict:
        """What `user` holds and may still take, in total and per resource group (contract 4).

        Keys (kept stable; the pages draw their indicators from them):
        - `allocated`, `allocatable`, `capacity`: {cpu, mem, fgpu} over the whole cluster;
        - `resource_groups`: {name: {allocated, allocatable, capacity, allowed}} for every resource
          group; `allocatable` there is what is free in that group, within every quota that
          applies; a group this user may not use has nothing allocatable;
        - `free`: {cpu, mem, fgpu} free in the resource groups this user may use, whoever asks
          (no quota counted); each resource group has its own `free` too;
        - `limits`: every quota figure that applies, with its use and a sentence
          (limits.py): [{kind, group, used, limit, left, reached, text}];
        - `sessions`: how many of the user's sessions hold a slice; `units_per_gpu`;
        - admins only, `nodes`: each node's totals and free capacity, and per GPU its free share
          and `slices`, [{session_id, user, server_name, fraction, fgpu}]: who holds which part.
        """
        allocated = self._allocated_records()
        mine = [r for r in allocated if r.user == user]
        headroom = self._quota_headroom(user, groups, allocated)
        allowed = self.quotas.snapshot().allowed_resource_groups(user, groups)
        by_group, usable_nodes = {}, set()
        for name, nodes in self._nodes_by_group.items():
            on_group = [r for r in allocated if r.node in nodes]
            capacity = self._capacity_totals(nodes)
            may_use = allowed is None or name in allowed
            if may_use:
                usable_nodes |= nodes
            by_group[name] = {
                "allocated": _sum_slots([r for r in on_group if r.user == user]),
                "allocatable": _allocatable(capacity, _sum_slots(on_group), headroom, may_use),
                "free": _allocatable(capacity, _sum_slots(on_group), NO_QUOTA, may_use),
                "capacity": capacity,
                "allowed": may_use,
            }
        totals = self._capacity_totals(self._node_names)
        usable_used = _sum_slots([r for r in allocated if r.node in usable_nodes])
        result = {
            "user": user,
            "units_per_gpu": self.settings.units_per_gpu,
            "allocated": _sum_slots(mine),
            # Only what this user may use: the free part of their resource groups, within quota.
            "allocatable": _allocatable(
                self._capacity_totals(usable_nodes), usable_used, headroom, True
            ),
            # What the cluster has free there, whoever asks: beside `allocatable`, it tells
            # "your quota is used up" apart from "others hold it all".
            "free": _allocatable(self._capacity_totals(usable_nodes), usable_used, NO_QUOTA, True),
            "capacity": totals,
            "sessions": len(mine),
            "resource_groups": by_group,
            "limits": limits.quota_limits(self._holdings(user, groups)),
        }
        if admin:
            result["nodes"] = self._cluster_view(allocated)
        return result

    def _holdings(self, user: str, groups: tuple[str, ...]) -> list[limits.Holding]:
        """What each quota that applies to `user` counts now: the user's own sessions, and all
        members' of each of the user's hub groups (as the scheduler counts them)."""
        snapshot = self.quotas.snapshot()
        holdings = [self._holding(None, snapshot.for_user(user), lambda r: r.user == user)]
        for group in groups:
            holdings.append(
                self._holding(
                    group,
                    snapshot.for_group(group),
                    lambda r, group=group: group in self.quotas.groups_of(r.user),
                )
            )
        return holdings

    def _holding(self, group, quota, counts: Callable) -> limits.Holding:
        held = [r for r in self._state.records if r.status in ALLOCATED and counts(r)]
        pending = [r for r in self._state.records if r.status == Status.PENDING and counts(r)]
        return limits.Holding(
            group, quota, **_sum_slots(held), sessions=len(held), pending=len(pending)
        )

    def _quota_headroom(self, user: str, groups: tuple[str, ...], allocated) -> dict:
        """Per slot, what every quota that applies still leaves (None: no quota limits it). Each
        quota counts its own holder: the user's own use, or all of a group's members' use."""
        snapshot = self.quotas.snapshot()
        quota = snapshot.for_user(user)
        scopes = [(quota.max_slots, [r for r in allocated if r.user == user], quota.max_sessions)]
        for group in groups:
            members = [r for r in allocated if group in self.quotas.groups_of(r.user)]
            quota = snapshot.for_group(group)
            scopes.append((quota.max_slots, members, quota.max_sessions))
        headroom: dict = {"cpu": None, "mem": None, "fgpu": None}
        for limit, holders, max_sessions in scopes:
            if max_sessions is not None and len(holders) >= max_sessions:
                return {"cpu": 0, "mem": 0, "fgpu": 0}  # no further session may start at all
            usage = _sum_slots(holders)
            for key in headroom:
                if getattr(limit, key) is not None:
                    room = getattr(limit, key) - usage[key]
                    headroom[key] = room if headroom[key] is None else min(headroom[key], room)
        return headroom

    def cluster_view(self) -> list[dict]:
        return self._cluster_view(self._allocated_records())

    def _cluster_view(self, allocated: list[SessionRecord]) -> list[dict]:
        """Every node and GPU with what is free, and which session holds which slice."""
        nodes = scheduler_free_view(self.nodes, self._allocations(allocated), self.settings)
        slices: dict[str, list[dict]] = {}
        for record in allocated:
            for uuid_, fraction in record.gpus.items():
                slices.setdefault(uuid_, []).append(
                    {
                        "session_id": record.id,
                        "user": record.user,
                        "server_name": record.server_name,
                        "fraction": fraction,
                        "fgpu": round(fraction * self.settings.units_per_gpu, 6),
                    }
                )
        for node in nodes:
            for gpu in node["gpus"]:
                gpu["slices"] = slices.get(gpu["uuid"], [])
        return nodes

    # -- writes and the pass, on the DB thread ------------------------------------------------------

    async def _write(self, change: Callable, place: bool = True, reload: bool = False):
        """Run `change(db, quotas)` and then a pass, in one transaction on the DB thread, and
        publish the state that results; return what `change` returned. One at a time (the lock),
        so two passes never grant the same slice. A change that raises leaves nothing behind: the
        transaction is rolled back and the published state stays as it was. `reload` reads every
        active record from the DB again (a change made outside this process)."""
        async with self._lock:
            # Taken here, on the loop: the book is refreshed on the loop while the thread works.
            quotas = self.quotas.snapshot()
            result, state = await self._in_thread(
                self._change_and_pass, change, quotas, place, reload
            )
            self._publish(state)
        return result

    async def _read(self, query: Callable):
        """Run `query(db)` in a read-only session on the DB thread."""

        def run():
            with self.db() as db:
                return query(db)

        return await self._in_thread(run)

    async def _in_thread(self, work: Callable, *args):
        return await asyncio.get_running_loop().run_in_executor(self._db_thread, work, *args)

    def _change_and_pass(self, change: Callable, quotas, place: bool, reload: bool):
        with self.db.begin() as db:
            result = change(db, quotas)
            state = self._pass(db, quotas, place, reload)
        return result, state

    def _read_state(self) -> _State:
        with self.db.begin() as db:
            return self._pass(db, None, place=False, reload=True)

    def _pass(self, db, quotas, place: bool, reload: bool) -> _State:
        """Time out and place the pending requests; the state that results, whole: statuses and
        positions come from the same pass, so no reader ever sees one without the other.

        The records of the published state are what this process last committed, so a pass starts
        from them and reads from the DB only what the change touched (all active records with
        `reload`). It considers again only the pending requests that the changes since the last
        placing pass can concern (`_Dirt`, `reconsideration.reconsidered`); all of them, as the
        reference does, when the inventory, the quotas or the settings changed, under DRF (whose
        order moves with every grant), and when the DB holds a record otherwise than this process
        published it."""
        previous = self._state
        # `everything`: every active record is read into the session (the reference does so in
        # every pass, and a pass over all places through the session's records).
        everything, gone = not self.incremental, set()
        if everything:
            _load_active(db)
        elif reload:
            gone = self._read_outside_changes(db)
        memberships = self.quotas.memberships()
        if (memberships, quotas) != self._facts_basis and quotas is not None:
            # Facts carry their users' hub groups and scope keys: none of them holds any more.
            self._facts, self._facts_basis = {}, (memberships, quotas)
        active, touched, fresh = self._current(db, everything, gone)
        dirt = previous.dirt | self._dirt_of(touched)
        if not place:
            return self._state_of(db, active, fresh, previous.positions, dirt, previous.basis)
        basis = (self._inventory_version, quotas, memberships, self.settings)
        if self.engine_problem is not None:
            # One the DB does not know may hold any slice: nothing is placed, timeouts still run;
            # the first pass after runs over everything.
            _, moved = self._expire_records(db, active)
            active, _, fresh = self._current(db, everything, gone)
            return self._state_of(db, active, fresh, previous.positions, dirt | moved, None)
        full = not self.incremental or basis != previous.basis or self.settings.policy != "fifo"
        placed = None if full else self._place_some(db, active, fresh, quotas, dirt)
        if placed is None:
            if not everything:
                everything = True
                _load_active(db)
                active, _, _ = self._current(db, True)
            placed = self._place_all(db, active, quotas)
        positions, moved = placed
        active, _, fresh = self._current(db, everything, gone)
        # What this pass changed is what the next one starts from: a pass that placed may leave a
        # request a second pass would place (its quota read before a later request took it).
        return self._state_of(db, active, fresh, positions, moved, basis)

    def _read_outside_changes(self, db) -> set:
        """Compare every active row of the DB with the record published for it, and read the ones
        that differ (or are new) into the session; the ids published as active that the DB holds
        as ended, or not at all. Rows are compared as plain tuples: 2,000 of them in a few ms."""
        table = SessionRecord.__table__
        query = select(table).where(table.c.status.in_(_ACTIVE_VALUES))
        published, facts = self._state.by_id, self._facts
        seen, differing = set(), []
        for row in db.execute(query):
            session_id = row.id
            seen.add(session_id)
            fact = facts.get(session_id)
            if (
                fact is None
                or fact.record is not published.get(session_id)
                or fact.row != _normal(row)
            ):
                differing.append(session_id)
        if len(differing) > 500:
            _load_active(db)
        elif differing:
            # Held by the session until it ends (`_hold_loaded`).
            db.scalars(select(SessionRecord).where(SessionRecord.id.in_(differing))).all()
        return published.keys() - seen

    def _place_all(self, db, active: dict, quotas) -> tuple[dict, _Dirt]:
        """The reference pass: every pending request considered, as it is in the session."""
        pending = [r for r in active.values() if r.status == Status.PENDING]
        before = {r.id: _schedule_key(r) for r in pending}
        _, moved = self._expire_records(db, active)
        allocated = [r for r in active.values() if r.status in ALLOCATED]
        waiting = [r for r in pending if r.status == Status.PENDING]
        positions = self._place(allocated, waiting, quotas)
        return positions, moved | self._dirt_of(
            [(before[r.id], r) for r in waiting if _schedule_key(r) != before[r.id]]
        )

    def _place_some(self, db, active: dict, fresh: set, quotas, dirt: _Dirt):
        """The pass over the requests the changes concern; None when it cannot be trusted (the
        DB holds a record otherwise than it was published)."""
        facts = self._facts_of(active, fresh)
        try:
            waiting = [f for f in facts if f.request is not None]
            expired, moved = self._expire(db, waiting, active.__getitem__)
            pending = [f for f in waiting if f.id not in expired] if expired else waiting
            scope_key = reconsideration.ScopeKeys(quotas)
            for f in pending:
                if f.scope is None:
                    f.scope = scope_key(f.request)
            chosen = reconsideration.reconsidered(
                [f.request for f in pending],
                quotas,
                self._nodes_by_group,
                (dirt | moved).groups,
                {user: self.quotas.groups_of(user) for user in (dirt | moved).users},
                keys=[f.scope for f in pending],
            )
            ended = set()
            if chosen:
                outcome = self._schedule(
                    self.nodes,
                    [f.allocation for f in facts if f.allocation is not None],
                    chosen,
                    quotas,
                    **self._pass_settings(),
                )
                ended, changed = self._apply_some(db, outcome, active)
                moved = moved | changed
        except _Stale:
            return None
        waiting = [f.id for f in pending if f.id not in ended]
        return {session_id: n for n, session_id in enumerate(waiting, 1)}, moved

    def _apply_some(self, db, outcome, records: dict) -> tuple[set, _Dirt]:
        """Write `outcome` to the records it changes (read from the DB first, and checked against
        what was published); the ids it ended or granted, and what it changed."""
        targets = {grant.request_id for grant in outcome.placed} | set(outcome.refused)
        targets |= {
            request_id
            for request_id, waiting in outcome.waiting.items()
            if (records[request_id].reason, records[request_id].skips)
            != (waiting.reason, waiting.skips)
        }
        attached = {request_id: _attach(db, records[request_id]) for request_id in targets}
        before = {request_id: _schedule_key(r) for request_id, r in attached.items()}
        self._apply(outcome, attached)
        pairs = [(before[i], r) for i, r in attached.items() if _schedule_key(r) != before[i]]
        return targets - set(outcome.waiting), self._dirt_of(pairs)

    def _current(self, db, everything: bool, gone=()) -> tuple[dict, list[tuple], set]:
        """The active records as this transaction has them, by request order: the published ones,
        each replaced by the session's own when the session holds it (loaded, added or changed;
        with `everything`, the session's alone; `gone` ones ended outside); (old, new) for each
        record whose scheduling key (`_schedule_key`) differs from the published one's; and the ids
        of the session's own."""
        previous = self._state.by_id
        db.flush()
        flushed, deleted = _flushed(db)
        held = dict(flushed)
        held.update((r.id, r) for r in db.identity_map.values() if isinstance(r, SessionRecord))
        active = {} if everything else dict(previous)
        touched, added = [], []
        for session_id, record in held.items():
            if session_id in deleted:
                continue
            if record.status in FINAL:
                active.pop(session_id, None)
            else:
                if session_id not in active:
                    added.append(record)
                active[session_id] = record
            old = previous.get(session_id)
            if _schedule_key(old) != _schedule_key(record):
                touched.append((old, record))
        gone = deleted | set(gone) | (set(previous) - set(held) if everything else set())
        for session_id in gone:
            active.pop(session_id, None)
            if session_id in previous:
                touched.append((previous[session_id], None))
        fresh = {i for i, r in held.items() if active.get(i) is r}
        return _in_request_order(active, added, previous, everything), touched, fresh

    def _dirt_of(self, pairs) -> _Dirt:
        """The resource groups and users that (old, new) record pairs concern: a pending one its
        resource group (None: any) and user, one holding a slice its node's group and user.
        Either side may be a record, its `_schedule_key`, or None."""
        groups, users = set(), set()
        for pair in pairs:
            for side in pair:
                key = side if side is None or isinstance(side, tuple) else _schedule_key(side)
                if key is None:
                    continue
                kind, user, resource_group, node = key[0], key[2], key[6], key[7]
                users.add(user)
                if kind == "pending":
                    groups.add(resource_group)
                elif node in self._group_of_node:
                    groups.add(self._group_of_node[node])
        return _Dirt(frozenset(groups), frozenset(users))

    def _state_of(
        self, db, active: dict, fresh: set, positions: dict, dirt: _Dirt, basis
    ) -> _State:
        """The state to publish. A pass over thousands of waiting requests changes few of them:
        only the views of the session's own records and of those whose position moved are built
        again (all of them after an inventory change)."""
        previous = self._state
        views, signatures = dict(previous.views), dict(previous.signatures)
        gone = previous.by_id.keys() - active.keys()
        for session_id in gone:
            del views[session_id], signatures[session_id]
        if previous.inventory_version != self._inventory_version:
            suspects = set(active)
        else:
            suspects = set(fresh)
            if positions is not previous.positions:
                old = previous.positions
                suspects.update(i for i, p in positions.items() if old.get(i) != p)
                suspects.update(i for i in old.keys() - positions.keys() if i in active)
        changed = set(gone)
        for session_id in suspects:
            record = active[session_id]
            signature = self._view_signature(record, positions)
            if signatures.get(session_id) != signature:
                view = self._base_view(record, positions)
                if _version(previous, session_id) != view["version"]:
                    changed.add(session_id)
                views[session_id], signatures[session_id] = view, signature
        ended = {}
        for session_id in gone:
            # The session's own when it ended here; the DB's when it ended elsewhere.
            record = db.get(SessionRecord, session_id)
            if record is not None:
                ended[session_id] = self._base_view(record, {})
        self._remember_facts(active, fresh, gone)
        return _State(
            records=tuple(active.values()),
            by_id=active,
            views=views,
            signatures=signatures,
            positions=positions,
            ended=ended,
            changed=frozenset(changed),
            dirt=dirt,
            basis=basis,
            inventory_version=self._inventory_version,
        )

    def _view_signature(self, record: SessionRecord, positions: dict) -> tuple:
        """Everything a record's view depends on that can change once it exists (its request
        never does; its grant changes only with its status)."""
        return (
            record.status,
            record.reason,
            record.node,
            record.started,
            record.ended,
            positions.get(record.id),
            self._inventory_version,
        )

    def _publish(self, state: _State) -> None:
        """Make `state` the one every read sees, and wake the long-polls whose record it
        changed (a record that ended counts as changed)."""
        self._state = state
        for session_id, view in state.ended.items():
            self._ended_views[session_id] = view
            self._ended_views.move_to_end(session_id)
        while len(self._ended_views) > ENDED_VIEWS_KEPT:
            self._ended_views.popitem(last=False)
        for session_id in state.changed:
            for woken in self._watchers.get(session_id, ()):
                if not woken.done():
                    woken.set_result(None)

    def _pass_settings(self) -> dict:
        return {
            "policy": self.settings.policy,
            "placement": self.settings.placement,
            "units_per_gpu": self.settings.units_per_gpu,
            "max_skips": self.settings.max_skips,
        }

    def _place(self, allocated: list[SessionRecord], pending: list[SessionRecord], quotas) -> dict:
        """Grant what fits; the positions of what waits, by id."""
        outcome = self._schedule(
            self.nodes,
            self._allocations(allocated),
            [self._scheduler_request(r) for r in pending],
            quotas,
            **self._pass_settings(),
        )
        self._apply(outcome, {r.id: r for r in pending})
        return {request_id: waiting.position for request_id, waiting in outcome.waiting.items()}

    def _schedule(self, *args, **kwargs) -> scheduler.SchedulePass:
        """A scheduling pass, whose requests waiting for room also hear of withheld nodes."""
        outcome = scheduler.schedule(*args, **kwargs)
        note = withheld_note(self.withheld_nodes)
        if not note:
            return outcome
        waiting = {
            request_id: dataclasses.replace(w, reason=f"{w.reason}; {note}")
            if w.cause == "capacity"
            else w
            for request_id, w in outcome.waiting.items()
        }
        return dataclasses.replace(outcome, waiting=waiting)

    def _apply(self, outcome: scheduler.SchedulePass, records: dict) -> None:
        """Write a pass's outcome into `records` (by id; a waiting one not among them is left
        as it is, and must need no change)."""
        for grant in outcome.placed:
            record = records[grant.request_id]
            record.status, record.scheduled_at = Status.SCHEDULED, utcnow()
            record.node, record.reason = grant.node, ""
            record.grant_json = json.dumps(
                {"session_id": record.id, "node": grant.node, "gpus": dict(grant.gpus)}
            )
        for request_id, message in outcome.refused.items():
            _finish(records[request_id], Status.ERROR, message)
        for request_id, waiting in outcome.waiting.items():
            record = records.get(request_id)
            if record is not None and (record.reason, record.skips) != (
                waiting.reason,
                waiting.skips,
            ):
                record.reason, record.skips = waiting.reason, waiting.skips

    def _expire_records(self, db, active: dict) -> tuple[set, _Dirt]:
        pending = [self._new_fact(r) for r in active.values() if r.status == Status.PENDING]
        return self._expire(db, pending, active.__getitem__)

    def _expire(self, db, waiting: list[_Facts], record_of: Callable) -> tuple[set, _Dirt]:
        """End the requests that waited too long; their ids, and what that changed."""
        timeout = self.settings.pending_timeout
        now = utcnow().timestamp()
        if not timeout or timeout <= 0 or not waiting:
            return set(), _Dirt()
        if now - min(f.created for f in waiting) <= timeout:
            return set(), _Dirt()
        enqueued = {f.id: f.created for f in waiting}
        expired = set(pending_timeouts.pending_timeouts(enqueued, now, timeout))
        pairs = []
        for session_id in expired:
            attached = _attach(db, record_of(session_id))
            pairs.append((_schedule_key(attached), None))
            _finish(attached, Status.PENDING_TIMEOUT, f"waited over {timeout:g} s")
        return expired, self._dirt_of(pairs)

    def _facts_of(self, active: dict, fresh: set) -> list[_Facts]:
        """What the scheduler reads of each record, in order: kept for a published record (it
        never changes), built afresh for one the session holds (`fresh`) and for one whose facts
        were kept in a write that was rolled back."""
        cache = self._facts
        return [
            f
            if i not in fresh and (f := cache.get(i)) is not None and f.record is r
            else self._new_fact(r)
            for i, r in active.items()
        ]

    def _new_fact(self, record: SessionRecord) -> _Facts:
        groups = self.quotas.groups_of(record.user)
        fact = _Facts(record, groups)
        if record.status == Status.PENDING:
            fact.request = self._scheduler_request(record)
        elif record.status in ALLOCATED:
            fact.allocation = self._allocations([record])[0]
        return fact

    def _remember_facts(self, active: dict, fresh: set, gone: set) -> None:
        """Keep the facts of the records about to be published (the session makes no further
        change to them); forget those of records that ended. Facts of a write that is rolled
        back stay, and are told apart by their record (`_fact`)."""
        cache = self._facts
        for session_id in gone:
            cache.pop(session_id, None)
        for session_id in fresh:
            cache[session_id] = self._new_fact(active[session_id])
        if len(cache) < len(active):
            for session_id, record in active.items():
                if session_id not in cache:
                    cache[session_id] = self._new_fact(record)

    # -- helpers ---------------------------------------------------------------------------------

    def _admission_refusal(self, db, request: dict, groups: tuple[str, ...], quotas):
        active, _, fresh = self._current(db, everything=False)
        pending = [f.request for f in self._facts_of(active, fresh) if f.request is not None]
        candidate = resource_model.Request(
            id="new",
            user=request["user"],
            groups=groups,
            slots=resource_model.Slots(request["cpu"], request["mem"], request["fgpu"]),
            resource_group=request["resource_group"],
        )
        return admission.admission_refusal(
            candidate,
            self.nodes,
            quotas,
            units_per_gpu=self.settings.units_per_gpu,
            pending=pending,
        )

    def _end_previous(self, db, request: dict) -> SessionRecord | None:
        """Settle what an earlier start of the same server left behind.

        The same request still PENDING (or granted, with no container yet) is adopted, so a spawn
        re-issued after a hub restart keeps its place in line or its grant. Anything else is
        superseded by the new start.
        """
        query = select(SessionRecord).where(
            SessionRecord.user == request["user"],
            SessionRecord.server_name == request["server_name"],
            SessionRecord.status.not_in(_FINAL_VALUES),
        )
        adopted = None
        for record in db.scalars(query):
            same = all(getattr(record, key) == value for key, value in request.items())
            if adopted is None and same and record.status in (Status.PENDING, Status.SCHEDULED):
                adopted = record
            else:
                _finish(
                    record,
                    Status.TERMINATED,
                    "superseded by a new start of the same server",
                    end_reasons.SUPERSEDED,
                )
        return adopted

    def _scheduler_request(self, record: SessionRecord) -> resource_model.Request:
        return resource_model.Request(
            id=record.id,
            user=record.user,
            groups=self.quotas.groups_of(record.user),
            slots=_slots(record),
            resource_group=record.resource_group,
            enqueued_seq=record.seq,
            skips=record.skips,
        )

    def _allocations(self, records: list[SessionRecord]) -> list:
        return [
            resource_model.Allocation(
                request_id=r.id,
                user=r.user,
                groups=self.quotas.groups_of(r.user),
                slots=_slots(r),
                node=r.node,
                gpus=r.gpus,
            )
            for r in records
        ]

    def _capacity_totals(self, names: set[str]) -> dict:
        nodes = [n for n in self.nodes if n.name in names]
        return {
            "cpu": sum(n.cpu for n in nodes),
            "mem": sum(n.mem for n in nodes),
            "fgpu": sum(len(n.gpus) for n in nodes) * self.settings.units_per_gpu,
        }

    def _load(self, db, session_id: str) -> SessionRecord:
        record = db.get(SessionRecord, session_id)
        if record is None:
            raise KeyError(session_id)
        return record

    def _with_usage(self, view: dict) -> dict:
        running = view["status"] == Status.RUNNING
        usage = self.usage_of(view["id"]) if running else None
        return {**view, "usage": usage, "ends": self.ends_of(view["id"]) if running else None}

    def _base_view(self, record: SessionRecord, positions: dict) -> dict:
        position = positions.get(record.id) if record.status == Status.PENDING else None
        grant = json.loads(record.grant_json) if record.grant_json else None
        return {
            **request_view(record),
            "grant": grant,
            "gpu_memory": {
                uuid_: self._gpu_memory.get(uuid_, 0) for uuid_ in (grant or {}).get("gpus", {})
            },
            "gpu_order": self._gpu_order.get(record.node, []),
            "position": position,
            "reason": record.reason,
            "created": _iso(record.created),
            "scheduled": _iso(record.scheduled_at),
            "started": _iso(record.started),
            "ended": _iso(record.ended),
            "end_reason": record.end_reason,
            # Usage (added by _with_usage) is left out: a waiting spawner wakes for a change of
            # state, not of load.
            "version": f"{record.status}|{position}|{record.reason}",
        }


def scheduler_free_view(nodes, allocations, settings: SchedulerSettings) -> list[dict]:
    free = free_capacity.free_capacity(nodes, allocations, units_per_gpu=settings.units_per_gpu)
    return [dataclasses.asdict(node) for node in free]


def _version(state: _State, session_id: str) -> str | None:
    view = state.views.get(session_id)
    return view["version"] if view is not None else None


def _slots(record: SessionRecord) -> resource_model.Slots:
    return resource_model.Slots(record.cpu, record.mem, record.fgpu)


def _pending_query():
    return (
        select(SessionRecord)
        .where(SessionRecord.status == Status.PENDING)
        .order_by(SessionRecord.seq)
    )


def _allocated_query():
    return select(SessionRecord).where(SessionRecord.status.in_([s.value for s in ALLOCATED]))


def _sum_slots(records) -> dict:
    return {
        "cpu": sum(r.cpu for r in records),
        "mem": sum(r.mem for r in records),
        "fgpu": round(sum(r.fgpu for r in records), 6),
    }


#: No quota's headroom: `_allocatable` then gives what the cluster has free.
NO_QUOTA = {"cpu": None, "mem": None, "fgpu": None}


def _allocatable(capacity: dict, used: dict, headroom: dict, may_use: bool) -> dict:
    """Per slot: what is free of `capacity`, capped by the quotas' headroom; never below 0."""
    result = {}
    for key in ("cpu", "mem", "fgpu"):
        room = [capacity[key] - used[key]] + ([headroom[key]] if headroom[key] is not None else [])
        # Rounded so that 1 - 0.8 reads 0.2 on a page, not 0.19999999999999996.
        result[key] = round(max(0, min(room)), 6) if may_use else 0
    return result


def _finish(
    record: SessionRecord, status: Status, reason: str | None = None, code: str | None = None
) -> None:
    """End `record` as `status`, with its reason and the reason's code (end_reasons.py; by
    default the status's)."""
    record.status, record.ended = status, utcnow()
    record.end_reason = code or end_reasons.default_for(status)
    if reason is not None:
        record.reason = reason


def _iso(moment: datetime | None) -> str | None:
    return as_utc(moment).isoformat() if moment else None


def _key(data: dict) -> str | None:
    """The request key the spawner chose (32 hex digits, a uuid4's), or None for none given."""
    key = data.get("id")
    if key is None:
        return None
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise Refused("Malformed grant request: the key must be 32 hex digits.")
    return key


def _parse(data: dict) -> dict:
    """The spawner has validated the options; this only guards the record's types."""
    try:
        return {
            "user": str(data["user"]),
            "account": _account(data.get("account")),
            "server_name": str(data.get("server_name") or ""),
            "image": str(data["image"]),
            "cpu": float(data["cpu"]),
            "mem": int(data["mem"]),
            "fgpu": float(data.get("fgpu") or 0),
            "resource_group": data.get("resource_group") or None,
        }
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise Refused(f"Malformed grant request: {e}") from None


def _account(value) -> str:
    """The hub account's key (accounts.py) a request names; '' when it names none."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or not _ACCOUNT_KEY.fullmatch(value):
        raise Refused(f"Malformed grant request: account must be an account key, not {value!r}")
    return value


_ACCOUNT_KEY = re.compile(r"\d{8}T\d{12}Z")


class _Stale(Exception):
    """The DB holds a record otherwise than this process published it (changed outside)."""


class _Facts:
    """What a pass reads of one record object, read once (a published record never changes)."""

    __slots__ = (
        "record",
        "id",
        "user",
        "groups",
        "created",
        "request",
        "allocation",
        "scope",
        "row",
    )

    def __init__(self, record: SessionRecord, groups: tuple[str, ...]):
        self.record, self.id, self.user, self.groups = record, record.id, record.user, groups
        self.created = as_utc(record.created).timestamp() if record.created else 0.0
        self.request: resource_model.Request | None = None
        self.allocation: resource_model.Allocation | None = None
        #: Its `reconsideration.ScopeKeys` under the quotas the facts were kept for, once asked.
        self.scope: tuple | None = None
        #: Every column, to tell a change made outside this process (`_read_outside_changes`).
        self.row = _row(record)


_by_seq = operator.attrgetter("seq")


def _in_request_order(active: dict, added: list, previous: dict, everything: bool) -> dict:
    """`active` by `seq`. Unless it holds everything the session read, it holds the published
    records in their order, and then the `added` ones: new requests, as a rule later than all of
    them, only need sorting."""
    if everything:
        return {r.id: r for r in sorted(active.values(), key=_by_seq)}
    if not added:
        return active
    added.sort(key=_by_seq)
    last = next(reversed(previous.values()), None)
    if last is not None and added[0].seq < last.seq:
        return {r.id: r for r in sorted(active.values(), key=_by_seq)}
    for record in added:
        del active[record.id]
    active.update((r.id, r) for r in added)
    return active


_COLUMNS = tuple(column.key for column in SessionRecord.__table__.columns)
_FLUSHED, _DELETED, _LOADED = "fgpu_flushed", "fgpu_deleted", "fgpu_loaded"
_WATCHED = "_fgpu_watched"


def _schedule_key(record: SessionRecord | None) -> tuple | None:
    """What a pass reads of a record; None for none or an ended one. RUNNING and SCHEDULED
    hold a slice alike."""
    if record is None or record.status in FINAL:
        return None
    kind = "pending" if record.status == Status.PENDING else "held"
    return (
        kind,
        record.seq,
        record.user,
        record.cpu,
        record.mem,
        record.fgpu,
        record.resource_group,
        record.node,
        record.grant_json,
        record.skips,
    )


def _row(record: SessionRecord) -> tuple:
    """Every column, in the table's order (times as UTC: SQLite reads them back naive)."""
    return _normal(getattr(record, column) for column in _COLUMNS)


def _normal(values) -> tuple:
    return tuple(as_utc(v) if isinstance(v, datetime) else v for v in values)


def _attach(db, record: SessionRecord) -> SessionRecord:
    """The session's own copy of a published record, to change; _Stale if the DB's differs."""
    attached = db.get(SessionRecord, record.id)
    if attached is record:
        return record
    if attached is None or _row(attached) != _row(record):
        raise _Stale(record.id)
    return attached


def _load_active(db) -> None:
    """Read every active record into the session, held there until the transaction ends
    (`_hold_loaded`)."""
    db.scalars(_allocated_query()).all()
    db.scalars(_pending_query()).all()


def _keep_flushed(session, _context) -> None:
    """Hold every record a flush writes until the transaction ends: the session keeps a record
    it no longer sees as changed only weakly, and the pass must find each one it changed."""
    flushed = session.info.setdefault(_FLUSHED, {})
    for record in (*session.new, *session.dirty):
        if isinstance(record, SessionRecord):
            flushed[record.id] = record
    deleted = session.info.setdefault(_DELETED, set())
    deleted.update(r.id for r in session.deleted if isinstance(r, SessionRecord))


def _hold_loaded(session, record) -> None:
    """Hold every record the session loads until the transaction ends: which unchanged records a
    pass finds in the session must not depend on when the garbage collector runs."""
    if isinstance(record, SessionRecord):
        session.info.setdefault(_LOADED, []).append(record)


def _forget_flushed(session, *_args) -> None:
    for key in (_FLUSHED, _DELETED, _LOADED):
        session.info.pop(key, None)


def _flushed(db) -> tuple[dict, set]:
    return db.info.get(_FLUSHED, {}), db.info.get(_DELETED, set())


def watch_flushes(sessions: sessionmaker) -> None:
    """Make the sessions of `sessions` hold what they load and flush (`_hold_loaded`,
    `_keep_flushed`) until they end."""
    # A mark on the sessionmaker itself, not `event.contains`: SQLAlchemy keys its registry by
    # `id(target)`, and a dead sessionmaker's entry outlives it until a garbage collection, so a
    # new one at its address would look registered and get no listeners.
    if getattr(sessions, _WATCHED, False):
        return
    setattr(sessions, _WATCHED, True)
    event.listen(sessions, "after_flush", _keep_flushed)
    event.listen(sessions, "loaded_as_persistent", _hold_loaded)
    event.listen(sessions, "after_commit", _forget_flushed)
    event.listen(sessions, "after_rollback", _forget_flushed)
