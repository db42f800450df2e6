"""The queue manager: the DB's session records joined to the pure scheduler.

Every change (a new request, a release, a cancel, a timeout) runs with one scheduling pass, in one
transaction, under one lock, so two spawns can never be granted the same slice. The DB work runs on
a thread of its own; the event loop only publishes the state each pass leaves (the active records,
their views and queue positions, as one object), so reads never wait for the DB and never see half
a pass. A long-poll is woken only when its own record changes: a release reaches the next pending
spawn at once, with no polling timer, and leaves the other waiters asleep.

`QueueManager` is the API (requests, releases, long-polls, views); the pass and the state it
publishes are queue_pass.py's (`QueuePass`, its base class), the SQL they share
store/queue_rows.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from image_catalog.job_options import parse_job, start_after_of
from queue_service.core import admission, end_reasons, limits, resource_model
from queue_service.core.errors import Refusal
from queue_service.core.status import ALLOCATED, FINAL, Status
from queue_service.grant_requests import KEY_RE, Refused, parse_key, parse_request
from queue_service.queue_pass import (
    PublishedState,
    QueuePass,
    RecordFacts,
    SchedulerSettings,
    deferred_reason,
    deferred_seq,
    finish_record,
    in_line,
    next_seq,
    scheduler_free_view,
)
from queue_service.repeated_requests import RepeatedRequests
from queue_service.store.models import SessionRecord, as_utc, request_view, utcnow
from queue_service.store.queue_rows import allocated_query, pending_query, watch_flushes

log = logging.getLogger(__name__)

#: Views of ended records kept in memory, so a spawn that reads its ended record needs no DB call.
ENDED_VIEWS_KEPT = 10_000
#: Request keys released before their request arrived, remembered so that a late request with one
#: of them never queues. A spawn that gave up sends its release at once, so a few suffice.
ABANDONED_KEYS_KEPT = 10_000
#: Ends announced before they happen (`expect_end`), kept until the release comes.
EXPECTED_ENDS_KEPT = 10_000
_FINAL_VALUES = [status.value for status in FINAL]


#: Why a record that was still waiting runs: its container ran already (an older DB restored).
ADOPTED_WAITING_REASON = "adopted from its container: the service's record of it was still waiting"


class QueueManager(QueuePass):
    def __init__(
        self,
        db: sessionmaker,
        nodes,
        settings: SchedulerSettings,
        quotas,
        incremental=True,
        *,
        engine_problem: str | None = None,
        usage_of: Callable[[str], dict | None] = lambda session_id: None,
        admission_check: Callable[..., Refusal | None] = lambda db, request, groups: None,
        ends_of: Callable[[str], dict | None] = lambda session_id: None,
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
        # long-polls, which read the published state (`PublishedState`) instead.
        self._db_thread = ThreadPoolExecutor(1, thread_name_prefix="fgpu-queue-db")
        self._abandoned: OrderedDict[str, None] = OrderedDict()
        self._repeats = RepeatedRequests()
        # Long-polls by session id, woken only when their own record's version changes.
        self._watchers: dict[str, set[asyncio.Future]] = {}
        # The records a spawn or a launch has dealt with in this process's life. The service
        # ends with its hub, so a spawn from before it is gone, and so is any release of its.
        self._handled_here: set[str] = set()
        self._ended_views: OrderedDict[str, dict] = OrderedDict()
        # Why a session is being stopped through the hub: (code, reason) by id, for its release.
        self._expected_ends: OrderedDict[str, tuple[str, str | None]] = OrderedDict()
        # None once the engine's containers are counted (the reconciler says so), else why not:
        # no slice is granted before every container that holds one is known.
        self.engine_problem = engine_problem
        # Nodes of the Swarm kept out of the inventory because their engine lets sessions reach
        # one another or gain privileges (engine/swarm_engine.py, `isolation_refused`): name →
        # the wrong settings. A request waiting for room is told, so that it does not wait in
        # silence.
        self.withheld_nodes: dict[str, list[str]] = {}
        # The nodes that hold each catalog image (name → node names), read at every pass: its
        # requests go there first (the engine's `image_holders`; none in single-host mode).
        self.image_nodes: Callable[[], dict[str, frozenset[str]]] = dict
        self._inventory_version = 0
        # Per record id, the scheduler's view of a record object (`RecordFacts`), rebuilt only when
        # a write gives the id a new object: a pass over thousands of waiting records reads these.
        self._facts: dict[str, RecordFacts] = {}
        self._facts_basis: tuple | None = None
        self.set_nodes(nodes)
        # Read once, at start (before any request is served); from then on every write publishes.
        self._state = PublishedState()
        self._state = self._read_state()
        # Live usage by session id: the service passes its engine backend's (engine/backend.py).
        self.usage_of = usage_of
        # A further admission check, run in the write that admits a request, after the quotas:
        # (db, request, groups) → a Refusal or None. The service passes the usage budgets'
        # (store/usage.py).
        self.admission_check = admission_check
        # A running session's next automatic end; the service passes automatic_ends.py's.
        self.ends_of = ends_of
        # The timer of the next deferred job's start (`_arm_deferred_timer`).
        self._deferred_timer: asyncio.TimerHandle | None = None
        self._deferred_due: float | None = None
        self._deferred_pass: asyncio.Future | None = None

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
        request = parse_request(data)
        key = parse_key(data)

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

        repeated = self._repeats.answer_of(key, request, self._state.views)
        if repeated is not None:
            session_id = await repeated
        else:
            session_id = await self._repeats.ask(key, request, lambda: self._write(record_request))
        self.note_handled(session_id)
        return await self.get(session_id)

    async def submit_many(self, requests: list[dict], groups: tuple[str, ...]) -> list[dict]:
        """Queue one user's requests together, all or none (a launch of `count` sessions). Each
        is admitted as `submit` admits it after the ones before it, a pass between them; a
        refusal of any records none. Every request carries its own new key (`id`)."""
        parsed = [(parse_key(data), parse_request(data)) for data in requests]
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
        pending = [r for r in db.scalars(pending_query()) if in_line(r)]
        self._place(list(db.scalars(allocated_query())), pending, quotas)

    def _queue_new(self, db, key: str, request: dict, groups, quotas) -> str:
        """Admit `request` (or raise the refusal) and add it, PENDING, at the end of the line."""
        refusal = self._admission_refusal(db, request, groups, quotas)
        if refusal is None:
            refusal = self.admission_check(db, request, groups)
        if refusal is not None:
            raise Refused(refusal.message, refusal.cause)
        start_after, now = start_after_of(parse_job(request["job_json"])), utcnow()
        if start_after is not None and start_after > now:
            # Out of the line until its time (queue_pass.py: a deferred job).
            record = SessionRecord(id=key, seq=deferred_seq(db), status=Status.PENDING, **request)
            record.reason = deferred_reason(start_after, now)
        else:
            record = SessionRecord(id=key, seq=next_seq(db), status=Status.PENDING, **request)
        db.add(record)
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

    async def end_job(
        self, session_id: str, code: str, reason: str, exit_code: int, log_tail: str
    ) -> None:
        """End a batch job that exited by itself (job_ends.py), keeping its exit code and the end
        of its log; its slice goes to the next request in the same pass."""

        def end(db, _quotas) -> None:
            record = db.get(SessionRecord, session_id)
            if record is None or record.status in FINAL:
                return
            record.exit_code, record.log_tail = exit_code, log_tail
            finish_record(record, Status.TERMINATED, reason, code)

        await self._write(end)

    async def job_log(self, session_id: str) -> str:
        """The end of an ended job's log as kept with its record ('' when none was kept)."""
        return await self._read(lambda db: self._load(db, session_id).log_tail or "")

    def take_expected_end(self, session_id: str) -> tuple[str, str | None] | None:
        """The (code, reason) `expect_end` announced, taken (a job's end applies it: job_ends.py)."""
        return self._expected_ends.pop(session_id, None)

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
            if record.job_json and code in (None, end_reasons.USER):
                code = end_reasons.CANCELLED  # a job its owner stops, running or waiting
            ending = Status.CANCELLED if record.status == Status.PENDING else Status.TERMINATED
            if code == end_reasons.ERROR:
                ending = Status.ERROR
            finish_record(record, ending, words, code)
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
                    finish_record(record, status, words, code)

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
        if KEY_RE.fullmatch(key or ""):
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
        # `pending` is the quota of waiting sessions: waiting jobs have their own limit.
        pending = [
            r
            for r in self._state.records
            if r.status == Status.PENDING and not r.job_json and counts(r)
        ]
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

    # -- writes, each with a pass (queue_pass.py), on the DB thread -----------------------------

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

    def _read_state(self) -> PublishedState:
        with self.db.begin() as db:
            return self._pass(db, None, place=False, reload=True)

    def _publish(self, state: PublishedState) -> None:
        """Make `state` the one every read sees, and wake the long-polls whose record it
        changed (a record that ended counts as changed)."""
        self._state = state
        self._arm_deferred_timer()
        for session_id, view in state.ended.items():
            self._ended_views[session_id] = view
            self._ended_views.move_to_end(session_id)
        while len(self._ended_views) > ENDED_VIEWS_KEPT:
            self._ended_views.popitem(last=False)
        for session_id in state.changed:
            for woken in self._watchers.get(session_id, ()):
                if not woken.done():
                    woken.set_result(None)

    def _arm_deferred_timer(self) -> None:
        """A pass at the earliest `start_after` of the deferred jobs, which then join the line
        (queue_pass.py); the reconciler's rounds would find them too, a round later."""
        due = self.next_deferred()
        if due == self._deferred_due:
            return
        if self._deferred_timer is not None:
            self._deferred_timer.cancel()
            self._deferred_timer = None
        self._deferred_due = due
        if due is None:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: the state read at start
            loop = asyncio.get_running_loop()
            # The wall clock's seconds to go, on the loop's monotonic clock (+ a little: the pass
            # must find the time come).
            delay = due - utcnow().timestamp()
            # Overdue (a pass that could not place, the engine away): a while later, not at once.
            delay = delay + 0.05 if delay > 0 else 5.0
            self._deferred_timer = loop.call_later(delay, self._deferred_due_now)

    def _deferred_due_now(self) -> None:
        self._deferred_timer, self._deferred_due = None, None
        task = asyncio.ensure_future(self._write(lambda db, quotas: None))
        task.add_done_callback(_log_failed_pass)
        self._deferred_pass = task  # held, so that it is not collected while it runs

    # -- helpers ---------------------------------------------------------------------------------

    def _admission_refusal(self, db, request: dict, groups: tuple[str, ...], quotas):
        """The quotas' refusal of a new request, or None. The `pending` quota bounds waiting
        interactive sessions: a batch job is not counted against it, and counts against its own
        limit instead (jobs.JobRules, `jobs_waiting_per_user`)."""
        active, _, fresh = self._current(db, everything=False)
        pending = []
        if not request["job_json"]:
            pending = [
                f.request
                for f in self._facts_of(active, fresh)
                if f.request is not None and not f.record.job_json
            ]
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
                finish_record(
                    record,
                    Status.TERMINATED,
                    "superseded by a new start of the same server",
                    end_reasons.SUPERSEDED,
                )
        return adopted

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
            # A batch job's earliest start (UTC, ISO 8601), None for none; until then it waits
            # with no position (queue_pass.py).
            "start_after": (parse_job(record.job_json) or {}).get("start_after"),
            "created": _iso(record.created),
            "scheduled": _iso(record.scheduled_at),
            "started": _iso(record.started),
            "ended": _iso(record.ended),
            "end_reason": record.end_reason,
            # Usage (added by _with_usage) is left out: a waiting spawner wakes for a change of
            # state, not of load.
            "version": f"{record.status}|{position}|{record.reason}",
        }


def _log_failed_pass(task: asyncio.Future) -> None:
    """A timer's pass that failed (the DB away): said, and left to the reconciler's next round."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("the pass for a deferred job's start failed: %s", task.exception())


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


def _iso(moment: datetime | None) -> str | None:
    return as_utc(moment).isoformat() if moment else None
