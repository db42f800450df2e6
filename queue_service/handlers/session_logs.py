"""`GET api/sessions/{id}/logs`: a batch job's log, as text (docs/source/howto/batch-jobs.md).

- while the job runs, its container's output (`?tail=` lines, 200 by default); with `follow=1`,
  the answer goes on as the job writes, and ends when the job does;
- once it has ended, the end of its log that the service kept (job_ends.py); the whole log is in
  the owner's `~/jobs` folder;
- while it waits, nothing: it has not run yet.

Its owner and admins may read it; anyone else is told there is no such session, as for the
session itself. A job's output is the user's data: plain text, never a page of this site.
"""

from __future__ import annotations

import asyncio
import contextlib

from tornado import web
from tornado.iostream import StreamClosedError

from queue_service.core import query_args
from queue_service.core.status import FINAL
from queue_service.engine import job_containers

from .base import BaseHandler

TAIL_DEFAULT = 200
TAIL_MAX = 10_000


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
        container = await self._container(session_id, record)
        if container is None:
            self.finish("")  # waiting in the queue: nothing has run yet
        elif follow:
            await self._follow(container, tail)
        else:
            text = await asyncio.to_thread(job_containers.log_tail, self.docker, container, tail)
            self.finish(text)

    async def _container(self, session_id: str, record: dict):
        if record["status"] == "PENDING":
            return None
        if not self.engine_backend.sessions_here:
            raise web.HTTPError(
                501, "A running job's log is read on its own node; see ~/jobs in its home."
            )
        return await asyncio.to_thread(job_containers.job_container, self.docker, session_id)

    async def _follow(self, container, tail: int) -> None:
        """Pass the container's output on as it comes, until it exits or the reader leaves."""
        stream = await asyncio.to_thread(job_containers.follow_log, self.docker, container, tail)
        chunks: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def pump() -> None:
            try:
                for chunk in stream:
                    loop.call_soon_threadsafe(chunks.put_nowait, chunk)
            finally:
                loop.call_soon_threadsafe(chunks.put_nowait, None)

        reading = loop.run_in_executor(None, pump)
        try:
            while (chunk := await chunks.get()) is not None:
                self.write(chunk)
                await self.flush()
        except StreamClosedError:
            pass  # the reader left
        finally:
            with contextlib.suppress(Exception):
                stream.close()
            await asyncio.wait({reading}, timeout=5)
        with contextlib.suppress(StreamClosedError):
            self.finish()


def routes(prefix: str) -> list:
    return [(prefix + r"api/sessions/([0-9a-f]+)/logs", SessionLogsHandler)]
