"""The queue's scheduling pass and the state it publishes, beside the queue manager (queue.py).

A pass starts from the records this process last committed (the published state) and reads from
the DB only what its change touched; it considers again only the waiting requests that the changes
since the last pass can concern (`reconsideration.reconsidered`): a release in one resource group leaves
thousands waiting in another as they were, and decides exactly what a pass over all of them would
(tests/test_queue.py compares the two over random changes). A pass over everything still runs when
the inventory, the quotas or the settings change, and under DRF; `schedule` and `refresh` read
every active record from the DB again, and so does a pass that finds one changed outside.

- `SchedulerSettings`: what the pass is told (order, placement, skips, timeout);
- `PublishedState`: what every read sees, replaced whole after each write; `_Dirt`: what the next
  pass must consider again; `RecordFacts`: what a pass reads of one record object, read once;
- `QueuePass`: the pass itself, the base class of `QueueManager`, which holds what it reads
  (`_state`, `_facts`, `_facts_basis`, `incremental`, `settings`, `quotas`, `engine_problem`,
  `withheld_nodes`, the inventory of `set_nodes`) and builds the views it publishes
  (`_base_view`); the pass runs on the manager's DB thread, in the transaction of its write;
- `withheld_note`, `scheduler_free_view`: what a request waiting for room is told of withheld
  nodes, and the scheduler's free capacity per node and GPU;
- `finish_record`: ends a record, in a pass (a timeout, a refusal) or in a write of the manager;
- `deferred_seq`, `in_line`, `deferred_reason`: a batch job with a `start_after` still ahead.

A job deferred to its `start_after` waits PENDING out of the line: its `seq`, the place in line,
is negative (unique, below every other) until then, so the scheduler never sees it, it holds no
position and no quota counts it as waiting for room. The first placing pass at or after its time
gives it the next `seq`, as a new request gets: it joins the line at the end, behind everyone who
asked before that time. That is the fair order: they have been waiting, while a job that kept its
place from its submission would pass all of them, and a deferral of days would then be a way to
hold a place in line without waiting in it. Its pending timeout counts from its `start_after`.
The manager's timer runs a pass at the earliest such time (queue.py, `_arm_deferred_timer`).

The SQL it runs is store/queue_rows.py's.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select

from image_catalog.job_options import parse_job, start_after_of
from queue_service.core import (
    end_reasons,
    free_capacity,
    pending_timeouts,
    reconsideration,
    resource_model,
    scheduler,
)
from queue_service.core.status import ALLOCATED, FINAL, Status
from queue_service.store.models import SessionRecord, as_utc, utcnow
from queue_service.store.queue_rows import (
    StaleRecord,
    attach,
    flushed_and_deleted,
    load_active,
    normal_row,
    record_row,
)

_ACTIVE_VALUES = [Status.PENDING.value, *(status.value for status in ALLOCATED)]


@dataclass(frozen=True)
class SchedulerSettings:
    units_per_gpu: int = 1
    policy: str = "fifo"
    placement: str = "best_fit"
    max_skips: int = 10
    pending_timeout: float = 3600.0
    #: A batch job's wait may be far longer: it runs whenever its turn comes.
    job_pending_timeout: float = 86400.0


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
class PublishedState:
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


class RecordFacts:
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
        "start_after",
    )

    def __init__(self, record: SessionRecord, groups: tuple[str, ...]):
        self.record, self.id, self.user, self.groups = record, record.id, record.user, groups
        self.created = as_utc(record.created).timestamp() if record.created else 0.0
        self.request: resource_model.Request | None = None
        self.allocation: resource_model.Allocation | None = None
        #: Its `reconsideration.ScopeKeys` under the quotas the facts were kept for, once asked.
        self.scope: tuple | None = None
        #: Every column, to tell a change made outside this process (`_read_outside_changes`).
        self.row = record_row(record)
        #: A batch job's `start_after` (epoch seconds), parsed once; None for none.
        self.start_after = start_after_seconds(record)

    @property
    def since(self) -> float:
        """When its wait began, for its pending timeout: its submission, or its `start_after`."""
        return max(self.created, self.start_after or 0.0)


def start_after_seconds(record: SessionRecord) -> float | None:
    """A record's `start_after` in epoch seconds (None: none). The JSON is parsed only for a job
    that has one."""
    text = record.job_json
    if not text or '"start_after"' not in text:
        return None
    moment = start_after_of(parse_job(text))
    return moment.timestamp() if moment else None


def in_line(record: SessionRecord) -> bool:
    """Whether a pending record is in the line (not a job deferred to its `start_after`)."""
    return record.seq > 0


def deferred_seq(db) -> int:
    """The `seq` of a job deferred to its `start_after`: below every other, so unique, and out
    of the line (`in_line`)."""
    return min(0, db.scalar(select(func.min(SessionRecord.seq))) or 0) - 1


def next_seq(db) -> int:
    """The `seq` of a request joining the line now: after every other."""
    return max(0, db.scalar(select(func.max(SessionRecord.seq))) or 0) + 1


def deferred_reason(start_after: datetime, now: datetime) -> str:
    """What a deferred job's reason says: "Waits until 02:00 UTC, as asked" (the day too when it
    is not today's)."""
    moment, today = start_after.astimezone(UTC), now.astimezone(UTC)
    if moment.date() == today.date():
        when = moment.strftime("%H:%M UTC")
    else:
        when = moment.strftime("%a %d %b %H:%M UTC")
    return f"Waits until {when}, as asked"


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


def scheduler_free_view(nodes, allocations, settings: SchedulerSettings) -> list[dict]:
    free = free_capacity.free_capacity(nodes, allocations, units_per_gpu=settings.units_per_gpu)
    return [dataclasses.asdict(node) for node in free]


class QueuePass:
    """The scheduling pass of `QueueManager` (queue.py), its base class: every method runs on the
    manager's DB thread, inside the transaction of one write, and reads the manager's attributes
    (see the module's docstring)."""

    def _pass(self, db, quotas, place: bool, reload: bool) -> PublishedState:
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
            load_active(db)
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
        # A deferred job whose time came joins the line: rare, and then the pass runs over all.
        if self._release_due(db, active):
            full = True
            if everything:
                active, _, fresh = self._current(db, True)
        placed = None if full else self._place_some(db, active, fresh, quotas, dirt)
        if placed is None:
            if not everything:
                everything = True
                load_active(db)
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
                or fact.row != normal_row(row)
            ):
                differing.append(session_id)
        if len(differing) > 500:
            load_active(db)
        elif differing:
            # Held by the session until it ends (`queue_rows.watch_flushes`).
            db.scalars(select(SessionRecord).where(SessionRecord.id.in_(differing))).all()
        return published.keys() - seen

    def _release_due(self, db, active: dict) -> bool:
        """Give each deferred job whose `start_after` has come its place at the end of the line
        (a new `seq`, as a new request's); whether any joined. Deferred records come first in
        `active` (their `seq` is negative), so only they are looked at."""
        now, released = utcnow().timestamp(), False
        for record in list(active.values()):
            if in_line(record):
                break
            if record.status != Status.PENDING:
                continue
            start_after = start_after_seconds(record)
            if start_after is not None and start_after > now:
                continue
            # The DB's own row: a deferred job is no record a pass has changed.
            row = db.get(SessionRecord, record.id)
            if row is None or row.status != Status.PENDING or in_line(row):
                continue
            row.seq, row.reason = next_seq(db), ""
            db.flush()
            released = True
        return released

    def next_deferred(self) -> float | None:
        """The earliest `start_after` (epoch seconds) of the published deferred jobs, or None."""
        earliest = None
        for record in self._state.records:
            if in_line(record):
                break
            moment = start_after_seconds(record)
            if moment is not None and (earliest is None or moment < earliest):
                earliest = moment
        return earliest

    def _place_all(self, db, active: dict, quotas) -> tuple[dict, _Dirt]:
        """The reference pass: every pending request considered, as it is in the session."""
        pending = [r for r in active.values() if r.status == Status.PENDING and in_line(r)]
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
            waiting = [f for f in facts if f.request is not None and in_line(f.record)]
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
        except StaleRecord:
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
        attached = {request_id: attach(db, records[request_id]) for request_id in targets}
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
        flushed, deleted = flushed_and_deleted(db)
        held = dict(flushed)
        held.update((r.id, r) for r in db.identity_map.values() if isinstance(r, SessionRecord))
        active = {} if everything else dict(previous)
        touched, added = [], []
        for session_id, record in held.items():
            if session_id in deleted:
                continue
            old = previous.get(session_id)
            if record.status in FINAL:
                active.pop(session_id, None)
            else:
                # A deferred job that joined the line has a new `seq`: it moves as a new one.
                if session_id not in active or (old is not None and old.seq != record.seq):
                    added.append(record)
                active[session_id] = record
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
    ) -> PublishedState:
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
        return PublishedState(
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

    def _pass_settings(self) -> dict:
        return {
            "policy": self.settings.policy,
            "placement": self.settings.placement,
            "units_per_gpu": self.settings.units_per_gpu,
            "max_skips": self.settings.max_skips,
            "image_nodes": self.image_nodes(),
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
            finish_record(records[request_id], Status.ERROR, message)
        for request_id, waiting in outcome.waiting.items():
            record = records.get(request_id)
            if record is not None and (record.reason, record.skips) != (
                waiting.reason,
                waiting.skips,
            ):
                record.reason, record.skips = waiting.reason, waiting.skips

    def _expire_records(self, db, active: dict) -> tuple[set, _Dirt]:
        pending = [
            self._new_fact(r) for r in active.values() if r.status == Status.PENDING and in_line(r)
        ]
        return self._expire(db, pending, active.__getitem__)

    def _expire(self, db, waiting: list[RecordFacts], record_of: Callable) -> tuple[set, _Dirt]:
        """End the requests that waited too long (sessions and jobs each by their own
        timeout, a deferred job's from its `start_after`); their ids, and what that changed."""
        now = utcnow().timestamp()
        expired, pairs = set(), []
        for batch, timeout in (
            (False, self.settings.pending_timeout),
            (True, self.settings.job_pending_timeout),
        ):
            facts = [f for f in waiting if bool(f.record.job_json) == batch]
            if not timeout or timeout <= 0 or not facts:
                continue
            if now - min(f.since for f in facts) <= timeout:
                continue
            enqueued = {f.id: f.since for f in facts}
            for session_id in pending_timeouts.pending_timeouts(enqueued, now, timeout):
                attached = attach(db, record_of(session_id))
                pairs.append((_schedule_key(attached), None))
                finish_record(attached, Status.PENDING_TIMEOUT, f"waited over {timeout:g} s")
                expired.add(session_id)
        return expired, self._dirt_of(pairs)

    def _facts_of(self, active: dict, fresh: set) -> list[RecordFacts]:
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

    def _new_fact(self, record: SessionRecord) -> RecordFacts:
        groups = self.quotas.groups_of(record.user)
        fact = RecordFacts(record, groups)
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

    def _scheduler_request(self, record: SessionRecord) -> resource_model.Request:
        return resource_model.Request(
            id=record.id,
            user=record.user,
            groups=self.quotas.groups_of(record.user),
            slots=_slots(record),
            resource_group=record.resource_group,
            enqueued_seq=record.seq,
            skips=record.skips,
            image=record.image,
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


def finish_record(
    record: SessionRecord, status: Status, reason: str | None = None, code: str | None = None
) -> None:
    """End `record` as `status`, with its reason and the reason's code (end_reasons.py; by
    default the status's)."""
    record.status, record.ended = status, utcnow()
    record.end_reason = code or end_reasons.default_for(status)
    if reason is not None:
        record.reason = reason


def _version(state: PublishedState, session_id: str) -> str | None:
    view = state.views.get(session_id)
    return view["version"] if view is not None else None


def _slots(record: SessionRecord) -> resource_model.Slots:
    return resource_model.Slots(record.cpu, record.mem, record.fgpu)


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
