"""A stop that interrupts a spawn waiting in the queue: a real hub, the real service, simulated GPUs.

JupyterHub interrupts a pending spawn by cancelling it, waits one second, and stops the server only
if the spawn has ended by then; otherwise it answers 500 and, once the spawn does end, keeps a
server that never ran as if it were ready. Found by `benchmarks/swarm_spawn.py --stop-together`
(60 servers stopped at once, 40 answered 500 and 20 stayed listed as running).
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time

import pytest

from .harness import QueueUser
from .swarm_lab import wait_for
from .test_queue_service import queue_service_pid

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "256M", "fgpu": 1}


def test_a_stop_while_the_spawn_waits_ends_it_even_when_the_queue_is_slow_to_answer(one_gpu_hub):
    hub = one_gpu_hub
    holder, waiter = (f"student-{secrets.token_hex(4)}" for _ in range(2))
    assert hub.start_server(holder, SESSION).status_code in (201, 202)
    hub.wait_ready(holder)
    assert hub.start_server(waiter, SESSION).status_code == 202
    admin = QueueUser(hub, "admin")
    wait_for(
        lambda: any(s["user"] == waiter and s["status"] == "PENDING" for s in admin.sessions()),
        timeout=30,
        what="the second request waiting for the GPU",
    )

    # The service answers nothing for 3 s, as a busy one answers late: the spawn's giving back of
    # its place in line outlasts the hub's one second.
    service = queue_service_pid(hub)
    os.kill(service, signal.SIGSTOP)
    threading.Timer(3, os.kill, (service, signal.SIGCONT)).start()
    try:
        stopped = hub.request("DELETE", f"users/{waiter}/servers/")
    finally:
        time.sleep(3.5)
        os.kill(service, signal.SIGCONT)
    assert stopped.status_code in (202, 204), stopped.text
    wait_for(
        lambda: (waiter, "") not in hub.active_servers(),
        timeout=60,
        what="the hub letting the interrupted server go",
    )
    wait_for(
        lambda: all(s["user"] != waiter for s in admin.sessions()),
        timeout=60,
        what="the waiting request ended",
    )
    # The slice was never the waiter's: the holder still runs, and the next request waits as before.
    assert hub.server_model(holder)["ready"]
    hub.stop_server(holder)
