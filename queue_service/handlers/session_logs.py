"""`GET api/sessions/{id}/logs`: a batch job's log, as text (docs/source/howto/batch-jobs.md).

- while the job runs, its container's output (`?tail=` lines, 200 by default); with `follow=1`,
  the answer goes on as the job writes, and ends when the job does. On a Swarm, the output of
  the job's service, which the manager gathers from the job's node; a followed one ends once
  the job's record has ended (the manager's stream would wait on for another task);
- once it has ended, the end of its log that the service kept (job_ends.py); the whole log is in
  the owner's `~/jobs` folder;
- while it waits, nothing: it has not run yet.

Its owner and admins may read it; anyone else is told there is no such session, as for the
session itself. A job's output is the user's data: plain text, never a page of this site.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from tornado import web
from tornado.iostream import StreamClosedError

from queue_service.core import query_args
from queue_service.core.status import FINAL
from queue_service.engine.job_services import chunks_of

from .base import BaseHandler

TAIL_DEFAULT = 200
#: Lines one request may ask for; the answer is also cut to log_reads.READ_MAX bytes.
TAIL_MAX = 5_000
#: Chunks a followed log holds for a slow reader before it stops reading the engine's stream.
FOLLOW_BUFFERED = 16
#: On a Swarm, how often a followed log looks whether its job has ended, and how long it still
#: passes output on after (the manager's stream brings the node's last lines a moment later).
ENDED_EVERY = 1.0
LAST_LINES_WAIT = 2.0
#: Followed logs at once, service-wide, and per user: each holds a thread of its own for as long
#: as its job runs, in a pool apart from the one spawns, job ends and folders use.
FOLLOWS_MAX = 32
FOLLOWS_PER_USER = 4
_follow_threads = ThreadPoolExecutor(FOLLOWS_MAX, thread_name_prefix="fgpu-log-follow")
_follows: Counter = Counter()
#: Reads of a running job's log (up to a few times READ_MAX each) in a pool of their own, so
#: that slow ones never hold up spawns, job ends and folders in the shared one.
_read_threads = ThreadPoolExecutor(4, thread_name_prefix="fgpu-log-read")


class SessionLogsHandler(BaseHandler):
    query_arguments = {"follow": "flag", "tail": "whole"}

    @web.authenticated
    async def get(self, session_id):
        record = await self.own_session(session_id)
        if record["type"] != "batch":
            raise web.HTTPError(
                400, "Only a batch job has a log here; a session's output is in its terminal."
            )
        follow = query_args.flag(self.get_argument("follow", ""), "follow", False)
        tail = query_args.whole(self.get_argument("tail", ""), "tail", TAIL_DEFAULT, 0, TAIL_MAX)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Cache-Control", "no-store")
        if record["status"] in FINAL:
            self.finish(await self.manager.job_log(session_id))
            return
        backend = self.engine_backend
        if record["status"] == "PENDING":
            self.finish("")  # waiting in the queue: nothing has run yet
        elif follow:
            await self._follow_held(record["user"], session_id, tail)
        else:
            loop = asyncio.get_running_loop()
            text = await loop.run_in_executor(_read_threads, backend.job_log, session_id, tail)
            self.finish(text or "")

    async def _follow_held(self, user: str, session_id: str, tail: int) -> None:
        """Follow within the caps (429 past them), counted while the answer goes on."""
        if sum(_follows.values()) >= FOLLOWS_MAX or _follows[user] >= FOLLOWS_PER_USER:
            raise web.HTTPError(
                429,
                "Too many job logs are followed at once; read it without follow=1, or close "
                "another page that follows one.",
            )
        _follows[user] += 1
        try:
            backend = self.engine_backend
            stream = await asyncio.to_thread(backend.follow_job_log, session_id, tail)
            if stream is None:
                self.finish("")
            else:
                self._stream = stream
                await self._follow(stream, session_id, backend.follow_ends_by_itself)
        finally:
            _follows[user] -= 1

    def on_connection_close(self) -> None:
        """The reader left: its followed stream closes now, not at the job's next line."""
        stream = getattr(self, "_stream", None)
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()

    async def _follow(self, stream, session_id: str, ends_by_itself: bool) -> None:
        """Pass the job's output on as it comes, until it exits or the reader leaves."""
        # A bounded queue: the reading thread waits while the reader is slow, so a long log is
        # never held in memory, only a few chunks of it.
        chunks: asyncio.Queue = asyncio.Queue(FOLLOW_BUFFERED)
        loop = asyncio.get_running_loop()

        def put(chunk: bytes | None) -> None:
            asyncio.run_coroutine_threadsafe(chunks.put(chunk), loop).result()

        def pump() -> None:
            try:
                for chunk in chunks_of(stream):
                    put(chunk)
            finally:
                put(None)

        reading = loop.run_in_executor(_follow_threads, pump)
        ending = (
            None
            if ends_by_itself
            else asyncio.ensure_future(self._close_at_end(stream, session_id))
        )
        ended = False
        try:
            while (chunk := await chunks.get()) is not None:
                self.write(chunk)
                await self.flush()
            ended = True
        except StreamClosedError:
            pass  # the reader left
        finally:
            if ending is not None:
                ending.cancel()
            with contextlib.suppress(Exception):
                stream.close()
            if not ended:  # a pump waiting on a full queue takes its last chunks, then ends
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(_drain(chunks), 5)
            await asyncio.wait({reading}, timeout=1)
        with contextlib.suppress(StreamClosedError):
            self.finish()

    async def _close_at_end(self, stream, session_id: str) -> None:
        """Close the stream once the job's record has ended (a Swarm's does not end itself)."""
        while True:
            await asyncio.sleep(ENDED_EVERY)
            try:
                status = (await self.manager.get(session_id))["status"]
            except KeyError:
                break
            if status in FINAL:
                break
        await asyncio.sleep(LAST_LINES_WAIT)
        await asyncio.to_thread(stream.close)


async def _drain(chunks: asyncio.Queue) -> None:
    while await chunks.get() is not None:
        pass


def routes(prefix: str) -> list:
    return [(prefix + r"api/sessions/([0-9a-f]+)/logs", SessionLogsHandler)]
