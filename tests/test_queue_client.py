"""The spawner's reading of the service's records: one typed object, checked at the client."""

from __future__ import annotations

import asyncio
import json
import resource
import time

import pytest
from jupyterhub.spawner import SpawnException
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from fgpu_spawner import FGPUSpawner
from fgpu_spawner.grant import Grant
from fgpu_spawner.queue_client import QueueClient, QueueError, QueueRecord
from fgpu_spawner.request import ResourceRequest

SCHEDULED = {
    "id": "ab" * 16,
    "status": "SCHEDULED",
    "version": "SCHEDULED|None|",
    "cpu": 1.0,
    "fgpu": 1.5,
    "position": None,
    "reason": "",
    "grant": {"session_id": "ab" * 16, "node": "n1", "gpus": {"GPU-a": 1.0, "GPU-b": 0.5}},
    "gpu_memory": {"GPU-a": 8 << 30, "GPU-b": 8 << 30},
    "gpu_order": ["GPU-a", "GPU-b"],
    "image_ref": "fgpu/jupyter-base:py3.11",
}


def test_a_scheduled_record_carries_its_grant():
    record = QueueRecord.from_json(SCHEDULED)
    assert record.grant == Grant("ab" * 16, "n1", {"GPU-a": 1.0, "GPU-b": 0.5})
    assert record.gpu_order == ("GPU-a", "GPU-b") and record.gpu_memory["GPU-b"] == 8 << 30
    assert record.image_ref == "fgpu/jupyter-base:py3.11"


def test_a_pending_record_has_no_grant_and_says_where_it_waits():
    pending = {**SCHEDULED, "status": "PENDING", "grant": None, "position": 2, "reason": "busy"}
    record = QueueRecord.from_json(pending)
    assert (record.grant, record.position, record.reason) == (None, 2, "busy")


@pytest.mark.parametrize(
    "broken",
    [{"status": "PENDING"}, {**SCHEDULED, "grant": {"gpus": {}}}, {**SCHEDULED, "fgpu": "lots"}],
)
def test_a_record_that_cannot_be_read_is_a_clear_error(broken):
    with pytest.raises(QueueError) as error:
        QueueRecord.from_json(broken)
    assert error.value.status == 502 and "cannot be read" in error.value.message


def test_there_is_no_spawning_without_the_queue():
    with pytest.raises(SpawnException) as refused:
        FGPUSpawner(queue_url="").queue  # noqa: B018 (the property is what is tested)
    assert "No queue service is configured" in str(refused.value)


class HeldQueue:
    """A real HTTP server in the test's loop that holds every long-poll until told, as the
    service does for spawns that wait in line, and answers catalog reads at once."""

    def __init__(self):
        self.held = 0
        self.grant_requests: list[str] = []
        self.releases: list[str] = []
        self.release = asyncio.Event()
        queue = self

        class Hold(web.RequestHandler):
            async def get(self, session_id):
                queue.held += 1
                await queue.release.wait()
                self.write({"id": session_id, "status": "PENDING", "version": "moved"})

            def delete(self, session_id):
                queue.releases.append(session_id)
                self.write({"id": session_id, "status": "CANCELLED", "version": "ended"})

        class Grants(web.RequestHandler):
            def post(self):
                key = json.loads(self.request.body)["id"]
                queue.grant_requests.append(key)
                self.set_status(201)
                self.write({"id": key, "status": "PENDING", "version": "PENDING|1|"})

        class Images(web.RequestHandler):
            def get(self):
                self.write({"images": [{"name": "python-3.11"}]})

        app = web.Application(
            [(r"/api/grants/(\w+)", Hold), (r"/api/grants", Grants), (r"/api/images", Images)]
        )
        sock, self.port = bind_unused_port()
        self.server = HTTPServer(app)
        self.server.add_sockets([sock])


async def test_every_spawn_slot_holds_its_long_poll_and_a_catalog_read_still_answers():
    """2,000 students waiting: a hub with 2,100 spawn slots (FGPU_CLASS_SIZE=1000) holds one
    long-poll per waiting spawn, and a spawn starting meanwhile still reads the catalog. With
    the client's former fixed 2,048 requests, the polls past it and the read waited in tornado's
    queue, which fails a request after 20 s."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # both ends of 2,100 connections
    slots, queue = 2100, HeldQueue()
    client = QueueClient(f"http://127.0.0.1:{queue.port}", "token", spawn_slots=slots)
    polls = [
        asyncio.create_task(client.wait(QueueRecord(id=f"{n:032x}", status="PENDING")))
        for n in range(slots)
    ]
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while queue.held < slots and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        assert queue.held == slots, f"only {queue.held} of {slots} long-polls reached the service"
        images = await asyncio.wait_for(client.images_for("alice"), 10)
        assert images == [{"name": "python-3.11"}]
    finally:
        queue.release.set()
        answers = await asyncio.gather(*polls, return_exceptions=True)
        queue.server.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert all(record.version == "moved" for record in answers)


async def test_a_catalog_read_outlasts_a_stall_of_the_hubs_event_loop():
    """A burst of spawns holds the hub's loop for longer than the client's timeout (JupyterHub's
    work for each start); every spawn of the burst then failed its catalog read with 503 "The
    queue service is not answering (Timeout while connecting)". The read is made again."""
    queue = HeldQueue()
    client = QueueClient(f"http://127.0.0.1:{queue.port}", "token", timeout=1)
    read = asyncio.create_task(client.images_for("alice"))
    await asyncio.sleep(0)  # the read is on its way
    time.sleep(1.5)  # the loop is held: as a burst of spawn starts holds the hub's
    try:
        assert await asyncio.wait_for(read, 10) == [{"name": "python-3.11"}]
    finally:
        queue.server.stop()


async def test_a_grant_request_outlasts_a_stall_with_its_own_key():
    """A request that timed out (a long line made its answer late, or the hub's loop was held) is
    made again with the same key, which the service answers with the same record: 159 of 2,000
    spawns in pending_spawns failed with 503 "Timeout during request" before."""
    queue = HeldQueue()
    client = QueueClient(f"http://127.0.0.1:{queue.port}", "token", timeout=1)
    request = ResourceRequest(image="img", image_name="python-3.11", cpu=0.5, mem=2**28, fgpu=1)
    asked = asyncio.create_task(client.request_grant("alice", "s1", request, key="cd" * 16))
    await asyncio.sleep(0)
    time.sleep(1.5)  # the loop is held
    try:
        record = await asyncio.wait_for(asked, 10)
    finally:
        queue.server.stop()
    assert (record.id, record.status) == ("cd" * 16, "PENDING")
    assert set(queue.grant_requests) == {"cd" * 16}


async def test_a_release_outlasts_a_stall_of_the_hubs_event_loop():
    """A storm of stops holds the hub's loop past the timeout: 1,630 of 2,000 cancels in
    pending_spawns lost their release ("Timeout during request"), and the requests, left waiting
    with no spawn, were issued again. A release is made again (it changes nothing twice)."""
    queue = HeldQueue()
    client = QueueClient(f"http://127.0.0.1:{queue.port}", "token", timeout=1)
    released = asyncio.create_task(client.release("ef" * 16, "alice", "s1"))
    await asyncio.sleep(0)
    time.sleep(1.5)  # the loop is held
    try:
        answer = await asyncio.wait_for(released, 10)
    finally:
        queue.server.stop()
    assert answer["status"] == "CANCELLED"
    assert set(queue.releases) == {"ef" * 16}


async def test_the_spawn_form_reads_one_users_folders_by_name():
    asked = []

    class Folders(web.RequestHandler):
        def get(self):
            asked.append((self.get_argument("user"), self.request.headers["Authorization"]))
            self.write({"folders": [{"id": "a" * 32, "name": "data"}]})

    sock, port = bind_unused_port()
    server = HTTPServer(web.Application([(r"/api/folders", Folders)]))
    server.add_sockets([sock])
    try:
        client = QueueClient(f"http://127.0.0.1:{port}", "secret")
        assert await client.folders_for("ann b") == [{"id": "a" * 32, "name": "data"}]
    finally:
        server.stop()
    assert asked == [("ann b", "token secret")]
