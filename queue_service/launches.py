"""`POST sessions` with `count`: the records first, then the hub's starts, side by side.

The hub takes a while over each start (20 at once kept a launch waiting 3 s), so the launch does
not wait for the hub to reach the queue:
1. the service records all `count` requests itself, PENDING, in one transaction with the admission
   and quota checks (`QueueManager.submit_many`): all or none, and a refusal leaves nothing;
2. it starts the first server through the hub, and waits only until that spawn claims its record
   (the spawner asks for the grant with the record's key) or the hub refuses it. All the servers
   share the options, so the first one passing the spawner's checks (`parse_request`, the image,
   the hub's limits) means the others pass them too, and a bad request is still refused at once,
   with the spawner's message, leaving nothing behind;
3. it answers with the records, and starts the other servers in the background, all at once.

Each start carries its record's key as the `request_key` option; the spawner's grant request
names it, and the queue gives the spawn that record only if user, server and slots all match it.
A start the hub refuses later (too many spawns at once, the named-server limit) ends its record as
ERROR with the hub's message and removes the server's entry, unless a spawn already claimed the
record (that spawn then answers for it). The Sessions page shows the records coming up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import uuid
from collections.abc import Callable

from fgpu_shared.units import parse_amount, parse_positive_size
from image_catalog.job_options import JobOptionError, check_job, parse_job
from image_catalog.launch_options import (
    LAUNCH_OPTIONS,
    NAME_MAX,
    OptionError,
    check_env,
    check_folders,
    check_name,
    leaves_out_defaults,
    resolve_preset,
    with_defaults,
)
from queue_service.core import end_reasons
from queue_service.core.errors import Refusal
from queue_service.core.status import FINAL, Status
from queue_service.store.accounts import Account
from queue_service.store.images import entry_of

from .hub_client import HubError

log = logging.getLogger(__name__)

#: Longest the launch waits for its first spawn to claim its record; the hub's own answer comes
#: within its slow-spawn timeout (10 s) anyway.
FIRST_CLAIM_TIMEOUT = 15.0
#: The options a launch takes (besides `count`), as in contract 3.
_SLOT_OPTIONS = ("image", "cpu", "mem", "fgpu", "resource_group")


def server_names(count: int, name: str | None = None, prefix: str = "s") -> list[str]:
    """The servers' names: the session's own name (`name-1`, `name-2`... for several), or
    `prefix` (`s`, or `job` for batch jobs), a hyphen and six hex digits each."""
    if name is None:
        return [f"{prefix}-{secrets.token_hex(3)}" for _ in range(count)]
    return [name] if count == 1 else [f"{name}-{i}" for i in range(1, count + 1)]


def with_launch_defaults(
    options: dict, offered: Callable[[], list[dict]], presets: list[dict], limits: dict
) -> dict:
    """`options` with what the launch leaves out filled in as the spawner fills it
    (launch_options.with_defaults). `offered()` reads the store's views of the images the user
    may start, in the catalog's order (hidden ones are not offered), only when something is left
    out: the Sessions dialog names every option; `limits`, one session's."""
    if not leaves_out_defaults(options):
        return options
    images = [entry_of(view) for view in offered() if not view.get("hidden")]
    return with_defaults(options, images, presets, limits)


def with_preset(options: dict, presets: list[dict]) -> dict:
    """`options` with a `preset` replaced by its slots (launch_options.resolve_preset's rule)."""
    try:
        return resolve_preset(options, presets)
    except OptionError as e:
        raise Refusal(str(e)) from None


def launch_extras(options: dict, count: int) -> tuple[str | None, dict]:
    """The launch's session name, and its extras (`env`, its environment variables, and
    `folders`, the storage folders to mount), checked as the spawner checks them: a bad one is
    refused here, before any record exists."""
    try:
        name = check_name(options.get("name"))
        extras = {"env": check_env(options.get("env"))}
        extras["folders"] = list(check_folders(options.get("folders")))
    except OptionError as e:
        raise Refusal(str(e)) from None
    if name is not None and count > 1 and len(f"{name}-{count}") > NAME_MAX:
        raise Refusal(
            f"name {name!r} is too long for {count} sessions: with its number ({name}-{count}) "
            f"it must stay within {NAME_MAX} characters."
        )
    return name, extras


def launch_request(options: dict) -> dict:
    """The launch's options as its records hold them: an image name, cores, bytes, fGPU units and
    a resource group or None. These exact values go to the hub, so the spawner parses the same
    request the queue recorded (`submit` gives a keyed record to that request alone)."""
    unknown = sorted(set(options) - set(LAUNCH_OPTIONS))
    if unknown:
        known = ", ".join((*LAUNCH_OPTIONS, "count"))
        raise Refusal(f"Unknown option(s): {', '.join(unknown)}. Known options: {known}.")
    job = _job(options)
    options = {key: options.get(key) for key in _SLOT_OPTIONS if key in options}
    image = options.get("image")
    if not isinstance(image, str) or not image.strip():
        raise Refusal("A launch names its image (a catalog name).")
    try:
        mem = parse_positive_size(options.get("mem"))
    except ValueError as e:
        raise Refusal(f"mem: {e}.") from None
    group = options.get("resource_group")
    if group is not None and not isinstance(group, str):
        raise Refusal("resource_group must be the name of a resource group.")
    return {
        "image": image.strip(),
        "cpu": _number("cpu", options.get("cpu")),
        "mem": mem,
        "fgpu": _number("fgpu", options.get("fgpu", 0), zero_ok=True),
        "resource_group": (group or "").strip() or None,
        "job": job,
    }


def _job(options: dict) -> str | None:
    """A batch job's canonical JSON (job_options.check_job), None for a session."""
    try:
        return check_job(options)
    except JobOptionError as e:
        raise Refusal(str(e)) from None


def _number(name: str, value: object, zero_ok: bool = False) -> float:
    try:
        return parse_amount(value, zero_ok)
    except ValueError as e:
        raise Refusal(f"{name} {e}.") from None


def hub_options(request: dict, key: str, extras: dict | None = None) -> dict:
    """The body of the hub's start of one launched server: the record's own values and key, and
    the launch's extras that are set (the spawner checks them again)."""
    options = {name: request[name] for name in ("image", "cpu", "mem", "fgpu")}
    if request["resource_group"] is not None:
        options["resource_group"] = request["resource_group"]
    if request.get("job"):
        # The job's checked options: the spawner's check of them makes the very same JSON.
        options.update({"type": "batch", **parse_job(request["job"])})
    options.update({name: value for name, value in (extras or {}).items() if value})
    return {**options, "request_key": key}


class Launcher:
    """Launches for the sessions handler; knows which launched records a spawn has claimed."""

    def __init__(self, hub, manager):
        self.hub = hub
        self.manager = manager
        #: Per launched key whose start is still out: set once a spawn asks for that record.
        self._claims: dict[str, asyncio.Future] = {}
        #: Starts still running after their launch answered; held so that they stay alive.
        self._background: set[asyncio.Task] = set()

    def claimed(self, key: str) -> None:
        """A spawn asked for the grant of record `key` (called by the grants handler)."""
        claim = self._claims.get(key)
        if claim is not None and not claim.done():
            claim.set_result(None)

    async def launch(
        self,
        person: dict,
        request: dict,
        count: int,
        name: str | None = None,
        extras: dict | None = None,
    ) -> list[dict]:
        """Record `count` sessions of `request` for `person`, start the first, answer with the
        records; a refusal (the queue's, or the hub's of the first start) leaves nothing."""
        user, account = person["name"], person.get("account") or Account.of(person).key
        prefix = "job" if request.get("job") else "s"
        starts = [(server, uuid.uuid4().hex) for server in server_names(count, name, prefix)]
        await self.manager.submit_many(
            [
                {**request, "id": key, "user": user, "account": account, "server_name": name}
                for name, key in starts
            ],
            groups=tuple(person.get("groups", [])),
        )
        loop = asyncio.get_running_loop()
        for _, key in starts:
            self._claims[key] = loop.create_future()
        (first, first_key), rest = starts[0], starts[1:]
        try:
            await self._first_start(user, first, first_key, request, extras)
        except Exception:  # the hub's refusal, or no answer at all: nothing stays either way
            for _, key in starts:
                self._claims.pop(key, None)
            await self.manager.withdraw([key for _, key in starts])
            with contextlib.suppress(HubError):
                await self.hub.stop_server(user, first, remove=True)
            raise
        for server, key in rest:
            self._watch(self._start(user, server, key, request, extras), user, server, key)
        return [
            {"server_name": server, "session": await self.manager.get(key)}
            for server, key in starts
        ]

    async def _first_start(
        self, user: str, name: str, key: str, request: dict, extras: dict | None
    ) -> None:
        """Return once the first spawn claims its record (or the hub accepted the start); raise
        the hub's refusal when it comes first."""
        start = self._start(user, name, key, request, extras)
        claim = self._claims[key]
        await asyncio.wait(
            {start, claim}, timeout=FIRST_CLAIM_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
        )
        if start.done() and start.exception() is not None and not claim.done():
            raise start.exception()
        self._watch(start, user, name, key)

    def _start(
        self, user: str, name: str, key: str, request: dict, extras: dict | None
    ) -> asyncio.Task:
        options = hub_options(request, key, extras)
        return asyncio.create_task(self.hub.start_server(user, name, options))

    def _watch(self, start: asyncio.Task, user: str, name: str, key: str) -> None:
        task = asyncio.create_task(self._settle(start, user, name, key))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _settle(self, start: asyncio.Task, user: str, name: str, key: str) -> None:
        """Wait for the hub's answer to a start; a refusal of an unclaimed record ends it."""
        try:
            await start
        except HubError as e:
            if not self._claims[key].done():
                await self._refused(user, name, key, e.message)
        except Exception:
            log.exception("The hub's start of %s/%s failed", user, name)
        finally:
            self._claims.pop(key, None)

    async def _refused(self, user: str, name: str, key: str, message: str) -> None:
        try:
            if (await self.manager.get(key))["status"] in FINAL:
                return  # cancelled meanwhile, or superseded by another start of that server
        except KeyError:
            return
        log.warning("The hub refused to start launched server %s/%s: %s", user, name, message)
        await self.manager.release_where(
            [key],
            Status.ERROR,
            f"The hub did not start the server: {message}",
            end_reason=end_reasons.ERROR,
        )
        with contextlib.suppress(HubError):
            await self.hub.stop_server(user, name, remove=True)
