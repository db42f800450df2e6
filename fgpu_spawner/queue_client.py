"""The spawner's only link to the queue service: a small HTTP client for grants, the catalog and
the resource groups a user may use.

The service owns every allocation; the spawner asks for a grant, waits for it (long-polling, so a
freed slot reaches a waiting spawn at once), reports the session running, and releases it.
Errors become `QueueError` with the service's own message and status code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import weakref
from dataclasses import dataclass, field
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .grant import Grant
from .request import ResourceRequest

#: Requests to the service one hub may have in flight besides its spawn slots' long-polls: the
#: catalog reads and grant requests of spawns, and the releases of stopping sessions.
REQUEST_ROOM = 1024
#: Times a catalog read, a grant request or a release is made before a timeout fails it.
READ_ATTEMPTS = 3
#: In flight when the hub sets no spawn limit (`concurrent_spawn_limit` 0).
UNLIMITED_SLOTS_REQUESTS = 10_000
_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def request_capacity(spawn_slots: int) -> int:
    """Requests one hub may have in flight to the service. Every spawn slot (the hub's
    `concurrent_spawn_limit`) may hold a long-poll while it waits in the queue, and every other
    call needs room besides: a request past the capacity waits in tornado's queue, which fails
    it after 20 s ("Timeout in request queue") while the long-polls ahead of it last 25 s."""
    if spawn_slots <= 0:
        return UNLIMITED_SLOTS_REQUESTS
    return spawn_slots + REQUEST_ROOM


#: Spawn slots beyond the waiting ones: room for spawns that are starting a container.
STARTING_SPAWN_ROOM = 100


def spawn_slots(class_size: int, pending_per_user: int) -> int:
    """The hub's `concurrent_spawn_limit` for a class: every student may have `pending_per_user`
    spawns waiting in the queue (each holds a slot while it waits), and the rest is room for
    spawns that are starting a container, so that a full queue never turns another's start into
    a 429. One formula for the config and the service unit's open-file limit."""
    return pending_per_user * class_size + STARTING_SPAWN_ROOM


def open_files_needed(spawn_slots: int) -> int:
    """Open files one hub needs: a connection for each request it may have in flight to the
    service (`request_capacity`), a progress stream from each waiting student's spawn-pending
    page, and room for the rest (its DB, the proxy, running sessions' API calls, logs)."""
    return request_capacity(spawn_slots) + max(spawn_slots, 0) + REQUEST_ROOM


def _http_client(capacity: int) -> AsyncHTTPClient:
    """One client per event loop, of our own, so the hub's shared client (10 requests) is left
    alone; it holds the largest capacity any caller asked for."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.max_clients < capacity:
        client = AsyncHTTPClient(force_instance=True, max_clients=capacity)
        _clients[loop] = client
    return client


class QueueError(Exception):
    """The service refused a request, or could not be reached (status 503); `timed_out` when no
    answer came in time (the service, or this hub's own event loop, was busy)."""

    def __init__(self, message: str, status: int, timed_out: bool = False):
        super().__init__(message)
        self.message = message
        self.status = status
        self.timed_out = timed_out


@dataclass(frozen=True)
class QueueRecord:
    """The service's record of one request, as the spawner reads it (api/grants answers).

    `grant` is set once the request is SCHEDULED (or later); `version` changes whenever status,
    place in line or reason does, and is what a long-poll waits to see change.
    """

    id: str
    status: str
    version: str = ""
    cpu: float = 0.0
    fgpu: float = 0.0
    position: int | None = None
    reason: str = ""
    grant: Grant | None = None
    gpu_memory: dict[str, int] = field(default_factory=dict)
    gpu_order: tuple[str, ...] = ()
    image_ref: str | None = None
    #: The storage folders the session mounts, as the service resolved them when asked.
    mounts: tuple[dict, ...] = ()
    #: What the service will present when it tells the session its planned end: for the
    #: session's environment (FGPU_END_NOTICE_KEY), given with the first answer only.
    end_notice_key: str = ""

    @classmethod
    def from_json(cls, data: dict) -> QueueRecord:
        try:
            grant = data.get("grant")
            return cls(
                id=str(data["id"]),
                status=str(data["status"]),
                version=str(data.get("version") or ""),
                cpu=float(data.get("cpu") or 0),
                fgpu=float(data.get("fgpu") or 0),
                position=data.get("position"),
                reason=str(data.get("reason") or ""),
                grant=Grant(grant["session_id"], grant["node"], dict(grant.get("gpus") or {}))
                if grant
                else None,
                gpu_memory=dict(data.get("gpu_memory") or {}),
                gpu_order=tuple(data.get("gpu_order") or ()),
                image_ref=data.get("image_ref"),
                mounts=tuple(data.get("mounts") or ()),
                end_notice_key=str(data.get("end_notice_key") or ""),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise QueueError(
                f"The queue service sent a record that cannot be read: {e}", 502
            ) from None


class QueueClient:
    def __init__(self, url: str, token: str, timeout: float = 30, spawn_slots: int = 0):
        self.api = url.rstrip("/") + "/api"
        self.token = token
        self.timeout = timeout
        self.capacity = request_capacity(spawn_slots)

    async def request_grant(
        self, user: str, server_name: str, request: ResourceRequest, key: str, account: str = ""
    ) -> QueueRecord:
        """Ask for a slice. `key` (32 hex digits, chosen before asking) names the request: asking
        again with it returns the same record, and releasing it ends the request even when its
        answer never came. `account` (storage.account_tag) tells this user's hub account from
        an earlier one of the same name, in the history and the usage figures."""
        body = {
            "id": key,
            "user": user,
            "account": account,
            "server_name": server_name,
            "image": request.image_name,
            "cpu": request.cpu,
            "mem": request.mem,
            "fgpu": request.fgpu,
            "resource_group": request.resource_group,
            "folders": list(request.folders),
            "job": request.job,
        }
        # Made again after a timeout, with the same key: a line of thousands makes each request
        # wait for the passes of those before it, and the answer may come after the timeout.
        return QueueRecord.from_json(await self._call_again("POST", "/grants", body))

    async def wait(self, seen: QueueRecord, wait_seconds: float = 55) -> QueueRecord:
        """The record once it differs from `seen` (status, position or reason), or after a while:
        near the service's longest wait (60 s), since every waiting spawn asks again when it ends
        (2,000 waiting at 25 s cost the hub 80 requests a second)."""
        path = f"/grants/{seen.id}?wait={wait_seconds:g}&version={quote(seen.version)}"
        answer = await self._call("GET", path, timeout=wait_seconds + self.timeout)
        # The long-poll does not repeat what the first answer gave: keep it.
        return dataclasses.replace(
            QueueRecord.from_json(answer),
            image_ref=seen.image_ref,
            mounts=seen.mounts,
            end_notice_key=seen.end_notice_key,
        )

    async def mark_running(self, session_id: str) -> QueueRecord:
        return QueueRecord.from_json(await self._call("POST", f"/grants/{session_id}/running", {}))

    async def release(
        self, session_id: str, user: str, server_name: str, end_reason: str | None = None
    ) -> dict:
        """End the request `session_id`, if it is this server's (the service refuses with 409
        a key that names another server's record); `end_reason`: `error` for a failed start,
        `idle` for the idle culler's stop."""
        query = f"?user={quote(user, safe='')}&server_name={quote(server_name, safe='')}"
        if end_reason:
            query += f"&end_reason={quote(end_reason, safe='')}"
        # Made again after a timeout (a repeated release changes nothing): a storm of stops holds
        # the hub's loop past the timeout, and a release that never lands leaves the request
        # waiting for a spawn that was cancelled.
        return await self._call_again("DELETE", f"/grants/{session_id}{query}")

    async def images_for(self, user: str) -> list[dict]:
        """The catalog entries `user` may start (their groups, not hidden, not others' private).
        A read that timed out is made again, up to READ_ATTEMPTS times: a burst of spawns can
        hold the hub's event loop for longer than the timeout (JupyterHub's own work for each
        start, 0.1-0.3 s on a busy machine), and every spawn of the burst reads the catalog."""
        return (await self._call_again("GET", f"/images?user={quote(user)}"))["images"]

    async def image_for(self, user: str, name: str) -> dict:
        """One entry, or QueueError 403 (not allowed for `user`) / 400 (unknown)."""
        return await self._call("GET", f"/images/{quote(name, safe='')}?user={quote(user)}")

    async def resources_for(self, user: str) -> dict:
        """What `user` holds and may still take (api/resources for that user): per resource
        group, whether they may use it and what is free there for them."""
        return await self._call_again("GET", f"/resources?user={quote(user, safe='')}")

    async def presets_for(self, user: str) -> dict:
        """The resource presets `user` may pick (api/presets for that user)."""
        return await self._call_again("GET", f"/presets?user={quote(user, safe='')}")

    async def folders_for(self, user: str) -> list[dict]:
        """The storage folders `user` may mount: their own and those shared with them
        (api/folders for that user), for the spawn form's folder picker."""
        return (await self._call_again("GET", f"/folders?user={quote(user, safe='')}"))["folders"]

    async def _call_again(self, method: str, path: str, body: dict | None = None) -> dict:
        """`_call`, made again after a timeout, up to READ_ATTEMPTS times in all: only for calls
        that may be repeated (a read, a grant request named by its key, a release)."""
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                return await self._call(method, path, body)
            except QueueError as e:
                if not e.timed_out or attempt == READ_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    async def _call(self, method: str, path: str, body: dict | None = None, timeout=None) -> dict:
        request = HTTPRequest(
            self.api + path,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            request_timeout=timeout or self.timeout,
        )
        try:
            response = await _http_client(self.capacity).fetch(request)
        except HTTPClientError as e:
            # 599 is tornado's code for a connection that failed or dropped: the service is away.
            timed_out = e.code == 599 and "Timeout" in str(e.message)
            raise QueueError(_message_of(e), 503 if e.code == 599 else e.code, timed_out) from None
        except OSError as e:
            raise QueueError(f"The queue service is not answering ({e}).", 503) from None
        return json.loads(response.body)


def _message_of(error: HTTPClientError) -> str:
    if error.code == 599:
        return f"The queue service is not answering ({error.message})."
    try:
        return json.loads(error.response.body)["message"]
    except (AttributeError, TypeError, ValueError, KeyError):
        return f"The queue service answered {error.code}."
