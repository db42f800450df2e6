"""The one door every request of the service goes through: `BaseHandler`.

In the order a request meets them:
1. **Body cap.** A body larger than the handler's cap (`MAX_BODY_BYTES`; an upload's chunk is
   larger) is refused with 413 before anything else, the caller's identity included: the body is
   streamed in and counted, never buffered whole. Everything below runs before the handler's
   method (`admit`); for a handler that `streams_body` (an upload's chunk, written to disk as
   it comes), before the first byte of the body is read, in `prepare`.
2. **Authentication**, on the event loop (HubOAuth: the hub's cookie, or a token), from the
   headers, before any body is read: a caller the hub does not know never gets a body larger than
   `MAX_BODY_BYTES` (or one of unknown length) read, but a 401/403 at once. A small body of such
   a caller is read first and refused after (answering before it would reset the proxy's
   kept-alive connection), at most `MAX_ANONYMOUS_BODIES` at once. A cookie alone
   never changes anything: a cookie-authenticated request that needs JupyterHub's XSRF check
   (every state change, and scripted reads) must carry the `_xsrf` token, as the hub's own pages
   do, or it is refused with 403. Token-authenticated calls need no XSRF token: a token cannot be
   forged by another site.
3. **Content type.** A body that is sent must be JSON and say so (415 otherwise), so a plain HTML
   form on another site (`enctype=text/plain`) can never pass for an API call.
4. **Scopes.** Who may do what comes from the scopes the request's token really holds
   (`is_admin`, `holds`), never from the user's admin flag alone.
5. **Errors.** Every refusal (`errors.Refusal`, with its cause), every `HTTPError` and every hub
   failure ends as one JSON shape `{"status", "message"}` for the API, or as the hub's HTML error
   page for pages; `STATUS_OF_CAUSE` is the only place a refusal's cause becomes a status.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, ClassVar, Protocol

from jupyterhub.services.auth import HubOAuthenticated, UserNotAllowed
from tornado import web

from image_catalog.job_options import parse_job
from image_catalog.unicode_text import surrogate_at, surrogate_message
from queue_service import courses
from queue_service.core.errors import Refusal
from queue_service.core.scopes import ADMIN_SCOPE, is_filtered_form
from queue_service.hub_identity_lookups import SharedLookupHubOAuth
from queue_service.store.accounts import Account, account_key

from ..hub_client import HubError

if TYPE_CHECKING:  # the service's parts, as QueueService.init_app puts them in the settings
    from queue_service.automatic_ends import AutomaticEnds
    from queue_service.core.presets import Preset
    from queue_service.engine.backend import EngineBackend
    from queue_service.engine.client import Engine
    from queue_service.engine.node_identity import NodeIdentity
    from queue_service.engine.node_reports import NodeReports
    from queue_service.folders import Folders
    from queue_service.health import HealthMonitor
    from queue_service.hub_client import HubClient
    from queue_service.image_builds import BackgroundBuilds
    from queue_service.job_files import JobFiles
    from queue_service.launches import Launcher
    from queue_service.queue import QueueManager
    from queue_service.quotas import QuotaBook
    from queue_service.store.history import History
    from queue_service.store.images import ImageStore
    from queue_service.store.ssh_keys import SSHKeyStore
    from queue_service.store.usage import UsageBook
    from queue_service.store.utilization import UtilizationLog

#: Largest request body any handler takes. The biggest real one, a catalog entry, is a few KiB.
MAX_BODY_BYTES = 64 * 1024

#: A streamed body is handed to its sink in pieces of about this size (one thread hop each).
STREAM_PIECE_BYTES = 1024 * 1024

#: Streamed bodies being undone (`BaseHandler._abandon_sink`).
_abandoning: set[asyncio.Future] = set()

#: Small bodies of callers the hub did not recognise, read at once; more are refused unread.
MAX_ANONYMOUS_BODIES = 64
_anonymous_bodies = 0

#: The one table from a refusal's cause to its HTTP status.
STATUS_OF_CAUSE = {
    "invalid": 400,
    "capacity": 400,
    "forbidden": 403,
    "quota": 403,
    "full": 507,
    "not_found": 404,
    "conflict": 409,
    "engine": 502,
    "unavailable": 503,
}

_BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")
_BODY_TYPE_NAMES = {
    "application/json": "JSON (application/json)",
    "application/octet-stream": "the file's bytes (application/octet-stream)",
    "text/csv": "CSV text (text/csv)",
}
_HTTP_METHODS = ("get", "head", "post", "put", "patch", "delete")


def _admitted(method):
    """`method`, run only once `BaseHandler.admit` let the request in."""

    @functools.wraps(method)
    async def run(self, *args, **kwargs):
        if self._finished:
            return  # answered while the body came in (too large)
        await self.admit()
        result = method(self, *args, **kwargs)
        if inspect.isawaitable(result):
            await result

    run.admitted = True
    return run


def scope_holds(scopes, scope: str) -> bool:
    """Whether `scopes` hold `scope` itself, not only a filtered part of it (`scope!group=x`)."""
    return scope in scopes


def filtered_grant(scopes, scope: str) -> str | None:
    """A filtered form of `scope` among `scopes` (e.g. `custom:images:manage!group=a`), if any."""
    return next((s for s in scopes if is_filtered_form(s, scope)), None)


@web.stream_request_body
class BaseHandler(HubOAuthenticated, web.RequestHandler):
    """Authentication, XSRF, the body cap, scopes and error mapping for every handler."""

    #: One question to the hub per token at a time (hub_identity_lookups.py).
    hub_auth_class = SharedLookupHubOAuth
    #: API handlers answer errors in JSON; pages show the hub's error page.
    json_errors = True
    #: The query-string parameters the handler reads, each with what it holds ("flag", "whole",
    #: "number", "date", "moment", "choice" or "text"). Values are parsed by query_args.py; the
    #: API's fuzz test (tests/test_security_query_args.py) walks these over the route table.
    query_arguments: ClassVar[dict[str, str]] = {}
    #: The largest body the handler takes (an upload's handler takes its chunks).
    max_body_bytes: ClassVar[int] = MAX_BODY_BYTES

    # -- the service's parts, from the application's settings (QueueService.init_app) ---------

    @property
    def manager(self) -> QueueManager:
        return self.settings["manager"]

    @property
    def hub(self) -> HubClient:
        return self.settings["hub_client"]

    @property
    def history(self) -> History:
        return self.settings["history"]

    @property
    def launcher(self) -> Launcher:
        return self.settings["launcher"]

    @property
    def automatic_ends(self) -> AutomaticEnds:
        return self.settings["automatic_ends"]

    @property
    def quotas(self) -> QuotaBook:
        return self.settings["quotas"]

    @property
    def usage(self) -> UsageBook:
        return self.settings["usage"]

    @property
    def utilization(self) -> UtilizationLog:
        return self.settings["utilization"]

    @property
    def folders(self) -> Folders:
        return self.settings["folders"]

    @property
    def images(self) -> ImageStore:
        return self.settings["images"]

    @property
    def image_builds(self) -> BackgroundBuilds:
        return self.settings["image_builds"]

    @property
    def look_at_engine_images(self) -> Callable[[], None]:
        """Blocking: note again which catalog images the sessions' engine can run."""
        return self.settings["look_at_engine_images"]

    @property
    def docker(self) -> Engine:
        return self.settings["docker"]

    @property
    def engine_backend(self) -> EngineBackend:
        return self.settings["engine_backend"]

    @property
    def spawner_service(self) -> str:
        """The hub service whose token the spawner presents."""
        return self.settings["spawner_service"]

    @property
    def agent_service(self) -> str:
        """The hub service whose token the node agents present."""
        return self.settings["agent_service"]

    @property
    def site_presets(self) -> tuple[Preset, ...]:
        return self.settings["site_presets"]

    @property
    def session_limits(self) -> dict:
        return self.settings["session_limits"]

    @property
    def ssh_keys(self) -> SSHKeyStore:
        return self.settings["ssh_keys"]

    @property
    def job_files(self) -> JobFiles | None:
        """Where a batch job's notebook is looked for (job_files.py); None where the app was
        built without it."""
        return self.settings.get("job_files")

    @property
    def job_rules(self):
        """Batch jobs' site rules (jobs.JobRules); None where the app was built without them."""
        return self.settings.get("job_rules")

    @property
    def node_reports(self) -> NodeReports:
        return self.settings["node_reports"]

    @property
    def node_identity(self) -> NodeIdentity:
        return self.settings["node_identity"]

    @property
    def rotate_node_key(self) -> Callable[[str], Awaitable]:
        return self.settings["rotate_node_key"]

    @property
    def node_agent_registry(self) -> str:
        """The site's registry (host:port) private images are pushed to; "" when none is."""
        return self.settings["node_agent_registry"]

    @property
    def health(self) -> HealthMonitor:
        return self.settings["health"]

    @property
    def end_notice_key(self) -> Callable[[str], str]:
        """Session id → its end-notice key (session_end_notice.py), for the spawner alone."""
        return self.settings["end_notice_key"]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in _HTTP_METHODS:
            method = cls.__dict__.get(name)
            if method is not None and not hasattr(method, "admitted"):
                setattr(cls, name, _admitted(method))

    async def prepare(self):
        self._chunks: list[bytes] = []
        self._received = 0
        self._refused_after_body: web.HTTPError | Refusal | None = None
        self._authenticated = self._counted_anonymous = False
        self._sink: BodySink | None = None
        self._pending = bytearray()
        self._sink_busy: asyncio.Future | None = None
        self._streaming = self.streams_body()
        self._refuse_large_body()
        if self.request.method in _BODY_METHODS and self._has_body():
            await self._authenticate_before_body()
            if self._streaming:
                await self._open_sink()

    async def _open_sink(self) -> None:
        """Admit the request and let the handler say where its body goes, before any of it is
        read. A refusal is kept for the handler's method and the body read past unwritten:
        answered now, the engine would reset the proxy's kept-alive connection to us."""
        try:
            await self.admit()
            self._sink = await self.open_body()
        except (web.HTTPError, Refusal) as e:
            self._refused_after_body = e

    def streams_body(self) -> bool:
        """Whether this request's body goes, as it comes, where the handler says (`open_body`:
        an upload's chunk to disk) instead of being kept in memory. The request is admitted
        (authentication, XSRF, content type) and the handler's own checks made before a byte of
        it is read; a refusal then is answered once the body has gone by, unkept, unwritten."""
        return False

    async def open_body(self) -> BodySink:
        """Where a streamed body goes (handlers that `streams_body`), once admitted."""
        raise NotImplementedError

    async def body_in(self) -> BodySink | None:
        """The sink, with every byte of the body written to it, now the handler's to finish
        (None when the body was empty)."""
        await self._write_pending()
        sink, self._sink = self._sink, None
        return sink

    async def _authenticate_before_body(self) -> None:
        """Who sends a body, known from the headers. A refusal answered now leaves the body
        unread, and the engine then resets the proxy's kept-alive connection to us: so a small
        body is read first (a few at once), a large one or one of unknown length never."""
        global _anonymous_bodies
        try:
            await self._authenticate()
            refusal = None if self._hub_auth_user_cache else _anonymous()
        except web.HTTPError as e:
            refusal = e
        self._authenticated = True
        if refusal is None:
            return
        if not self._small_body() or _anonymous_bodies >= MAX_ANONYMOUS_BODIES:
            raise refusal
        _anonymous_bodies += 1
        self._counted_anonymous = True
        self._refused_after_body = refusal

    def on_finish(self) -> None:
        self._forget_anonymous_body()
        self._abandon_sink()

    def on_connection_close(self) -> None:
        self._forget_anonymous_body()
        self._abandon_sink()
        super().on_connection_close()

    def _abandon_sink(self) -> None:
        """A streamed body that did not come whole (cut, too large, refused while it came):
        the handler's sink undoes what it wrote, after a write under way."""
        sink, self._sink = getattr(self, "_sink", None), None
        if sink is None:
            return
        busy = self._sink_busy

        async def abandon():
            if busy is not None:
                await asyncio.wait([busy])
            await asyncio.to_thread(sink.abandon)

        task = asyncio.ensure_future(abandon())
        _abandoning.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(_abandoning.discard)

    def _forget_anonymous_body(self) -> None:
        global _anonymous_bodies
        if getattr(self, "_counted_anonymous", False):
            self._counted_anonymous = False
            _anonymous_bodies -= 1

    async def admit(self) -> None:
        """Everything checked once the body is in (each handler method runs after it)."""
        self._forget_anonymous_body()
        if self._refused_after_body is not None:
            raise self._refused_after_body
        if not self._authenticated:
            await self._authenticate()
        self._refuse_non_json_body()

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        """Keep the body while it is small, or hand it on to a streaming handler's sink; past
        the cap (a chunked body has no length to check first) answer 413 at once and let the
        rest go by unkept."""
        self._received += len(chunk)
        if self._received > self.max_body_bytes:
            if not self._finished:
                self._chunks.clear()
                self._refuse_mid_body(_too_large(self.max_body_bytes))
            return None
        if not self._streaming:
            self._chunks.append(chunk)
        elif self._sink is not None:  # else refused: the body goes by unwritten
            if not self._pending and len(chunk) >= STREAM_PIECE_BYTES:
                return self._write_pending(chunk)  # whole pieces go as they are: no copy
            self._pending += chunk
            if len(self._pending) >= STREAM_PIECE_BYTES:
                return self._write_pending()
        return None

    async def _write_pending(self, piece: bytes = b"") -> None:
        if not piece:
            piece, self._pending = bytes(self._pending), bytearray()
        if self._sink is None or not piece:
            return
        self._sink_busy = asyncio.ensure_future(asyncio.to_thread(self._sink.write, piece))
        try:
            await self._sink_busy
        except Refusal as e:  # the sink's own limit (an upload past the quota's room)
            self._refuse_mid_body(e)

    def _refuse_mid_body(self, error: web.HTTPError | Refusal) -> None:
        self._pending.clear()
        if self._finished:
            return
        status = error.status_code if isinstance(error, web.HTTPError) else 500
        self.send_error(status, exc_info=(type(error), error, None))

    def _refuse_large_body(self) -> None:
        length = self.request.headers.get("Content-Length", "0")
        if not length.isdigit():
            raise web.HTTPError(400, "Content-Length is not a number.")
        if int(length) > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)

    def _has_body(self) -> bool:
        headers = self.request.headers
        return headers.get("Content-Length", "0") != "0" or "Transfer-Encoding" in headers

    def _small_body(self) -> bool:
        """A body of a known length no larger than any handler's usual cap."""
        headers = self.request.headers
        length = headers.get("Content-Length", "0")
        return "Transfer-Encoding" not in headers and int(length) <= MAX_BODY_BYTES

    def _refuse_non_json_body(self) -> None:
        headers = self.request.headers
        if self.request.method in _BODY_METHODS and self._has_body():
            kind = headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
            if kind not in self.body_types():
                wanted = " or ".join(_BODY_TYPE_NAMES[t] for t in self.body_types())
                raise web.HTTPError(415, f"Send the request body as {wanted}.")

    def body_types(self) -> tuple[str, ...]:
        """The content types a body of this request may have: JSON, but for an upload's bytes.
        Never one a plain HTML form on another site can send (form-encoded, multipart, text)."""
        return ("application/json",)

    async def _authenticate(self) -> None:
        """Identify the caller on the event loop. HubAuth's synchronous path (tornado's
        get_current_user) hands every lookup to a helper thread and blocks on it, even when its
        cache answers: under polling that hand-off cost a tenth of the service's time (P4)."""
        self._refuse_cookie_without_xsrf()
        try:
            model = await self.hub_auth.get_user(self, sync=False)
            self._hub_auth_user_cache = self.check_hub_user(model) if model else None
        except UserNotAllowed as e:
            self._hub_auth_user_cache = None
            kind, name = e.model.get("kind", "user"), e.model.get("name")
            raise web.HTTPError(403, f"The {kind} {name} may not use this service.") from None

    def _refuse_cookie_without_xsrf(self) -> None:
        """A request that only a cookie could authenticate, and that JupyterHub's rules say must
        prove it comes from our own pages, is refused outright. (HubOAuth alone would quietly
        treat it as logged out, which reads as 401 and hides the attack from the logs.)"""
        if self.hub_auth.get_token(self, in_cookie=False) or not self.hub_auth._get_token_cookie(
            self
        ):
            return
        # Raises 403 when the token is missing or wrong, and passes requests that need none.
        self.check_xsrf_cookie()

    def get_login_url(self):
        if self.json_errors:
            raise web.HTTPError(401, "Log in to the hub first.")
        return super().get_login_url()

    # -- the caller ---------------------------------------------------------------------------

    def identity(self) -> dict:
        """Who the hub says is calling (a user or a service), with the scopes its token holds."""
        identity = self.get_current_user()
        if not identity:
            raise web.HTTPError(401, "Log in to the hub first.")
        return identity

    def holds(self, scope: str) -> bool:
        return scope_holds(self.identity().get("scopes", []), scope)

    def is_admin(self) -> bool:
        """Admin powers come from the token's scopes: see `scopes.ADMIN_SCOPE`."""
        return self.holds(ADMIN_SCOPE)

    def require_admin(self, what: str) -> None:
        if not self.is_admin():
            raise web.HTTPError(403, f"{what} needs the {ADMIN_SCOPE} scope (hub admins).")

    async def person(self) -> dict:
        """The calling user as the hub has them (groups included); `admin` says whether this
        request holds admin powers, whatever the account's flag."""
        identity = self.identity()
        if identity.get("kind") != "user":
            raise web.HTTPError(403, "Only users have sessions.")
        # Cached per token, never per name alone: the hub reuses a deleted token's id.
        token = self.hub_auth.get_token(self) or ""
        key = hashlib.sha256(token.encode()).hexdigest()
        model = await self.from_hub(self.hub.user_of_token(identity["name"], key))
        return {**model, "admin": self.is_admin()}

    async def own_session(self, session_id: str) -> dict:
        """The session, if it is the caller's or the caller is an admin; else 404."""
        person = await self.person()
        record = await session_or_none(self.manager, session_id)
        if record is None or (record["user"] != person["name"] and not person["admin"]):
            # The same answer as for a missing session: others' session ids are not revealed.
            raise web.HTTPError(404, "No such session.")
        return record

    async def session_in_reach(self, session_id: str) -> tuple[dict, dict]:
        """The caller and the session, if the caller may act on it (courses.may_act_on: its
        owner, an admin, or an instructor of a course its owner is in); else 404."""
        person = await self.person()
        record = await session_or_none(self.manager, session_id)
        if record is None or not await self.from_hub(
            courses.may_act_on(self.hub, person, record["user"])
        ):
            raise web.HTTPError(404, "No such session.")
        return person, record

    async def account_of(self, name: str) -> Account:
        """The hub account that has `name` this moment: asked, never cached, since a user deleted
        and created again a moment ago is another account (accounts.py)."""
        created = await self.from_hub(self.hub.account_created(name))
        if created is None:  # deleted since its token was checked: no account's rows are its own
            raise web.HTTPError(403, f"The hub has no user {name!r} any more.")
        return Account(name, account_key(created))

    async def from_hub(self, awaitable):
        """Await a call to the hub; its refusal keeps its 4xx, and a hub that fails or is away
        answers 502, with the hub's message either way."""
        try:
            return await awaitable
        except HubError as e:
            raise web.HTTPError(e.status if e.status < 500 else 502, e.message) from None

    async def refresh_quotas(self, user: dict) -> None:
        await self.from_hub(self.quotas.refresh(user, self.hub))

    async def check_notebook(self, account: Account, job: str | None, mounts: list[dict]) -> None:
        """Refuse a batch job whose notebook is not where it will run (job_files.py): in a
        storage folder of `mounts`, or in the account's home. Checked before anything is queued;
        what the service cannot see goes through."""
        notebook = (parse_job(job) or {}).get("notebook")
        if not notebook or self.job_files is None:
            return
        refusal = await asyncio.to_thread(
            self.job_files.notebook_refusal, account, notebook, mounts
        )
        if refusal is not None:
            raise refusal

    # -- input and output -----------------------------------------------------------------------

    def raw_body(self) -> bytes:
        """The body as it came (a signature covers these very bytes)."""
        return b"".join(self._chunks)

    def body(self) -> dict:
        try:
            data = json.loads(self.raw_body() or b"{}")
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python goes
            raise web.HTTPError(400, "The request body is not valid JSON.") from None
        if not isinstance(data, dict):
            raise web.HTTPError(400, "The request body must be a JSON object.")
        bad = surrogate_at(data)
        if bad is not None:  # refused here, once: no file name, row or command can hold it
            raise web.HTTPError(400, surrogate_message(bad))
        return data

    def write_json(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, default=str))

    def log_exception(self, typ, value, tb):
        if isinstance(value, Refusal):
            return  # an answer, not a fault
        super().log_exception(typ, value, tb)

    def send_error(self, status_code: int = 500, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, Refusal):
            status_code = STATUS_OF_CAUSE[exc.cause]
            kwargs["reason"] = None
        super().send_error(status_code, **kwargs)

    def write_error(self, status_code, **kwargs):
        message = error_message(self._reason, kwargs.get("exc_info", (None, None))[1])
        if self.json_errors:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"status": status_code, "message": message}))
        else:
            self.write_error_page(status_code, message)

    def write_error_page(self, status_code: int, message: str) -> None:
        raise NotImplementedError  # pages (handlers/pages.py) draw the hub's error page


class BodySink(Protocol):
    """Where a streamed body goes (`BaseHandler.open_body`); each called in a helper thread."""

    def write(self, data: bytes) -> None:
        """Take the next piece; a `Refusal` stops the body (answered, then `abandon`)."""

    def abandon(self) -> None:
        """The body did not come whole: undo what the writes did."""


async def session_or_none(manager, session_id: str) -> dict | None:
    try:
        return await manager.get(session_id)
    except KeyError:
        return None


def _anonymous() -> web.HTTPError:
    return web.HTTPError(401, "Log in to the hub first.")


def _too_large(limit: int) -> web.HTTPError:
    return web.HTTPError(413, f"The request body is larger than {limit} bytes.")


def error_message(reason: str, exc) -> str:
    """The message a person sees for an error: the refusal's or HTTPError's own, else the reason."""
    if isinstance(exc, Refusal):
        return exc.message
    if isinstance(exc, web.HTTPError) and exc.log_message:
        return exc.log_message % exc.args if exc.args else exc.log_message
    return reason
