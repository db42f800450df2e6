"""A shared hub whose leftover servers will not stop is replaced, and the test that left them fails
with why (tests/shared_hub.py): on a real hub, made to stop answering as a hung one does."""

from __future__ import annotations

import os
import secrets
import signal
import threading

import pytest
import requests

from .harness import TEST_LABEL, containers_with, running_hub
from .shared_hub import SharedHub
from .test_storage import start_session


@pytest.mark.docker
@pytest.mark.hub
def test_a_hub_that_cannot_stop_a_tests_servers_is_replaced_and_that_test_fails(
    tmp_path_factory, docker_engine
):
    shared = SharedHub("test-hub", lambda: running_hub(tmp_path_factory.mktemp("shared")))
    try:
        shared.marker = "kept"  # what a fixture sets on the hub is set on its replacement too
        old_url, old_run = shared.url, shared.run_id
        user = f"student-{secrets.token_hex(4)}"
        start_session(shared, user)
        shared.end_servers({(user, "")}, "the test s")  # servers that stop: nothing more
        assert shared.replaced == 0 and shared.active_servers() == set()
        start_session(shared, user)
        # The hub stops answering (as one stuck on its engine calls did); it is let go again
        # once its stop request has timed out, so that it can be shut down in an orderly way.
        os.kill(shared.process.pid, signal.SIGSTOP)
        threading.Timer(8, os.kill, (shared.process.pid, signal.SIGCONT)).start()
        with pytest.raises(pytest.fail.Exception) as failed:
            shared.end_servers({(user, "")}, "the test t", request_timeout=3)
        message = str(failed.value)
        assert "the test t left servers on the shared hub test-hub" in message
        assert "was replaced by a fresh one" in message and "Timeout" in message
        assert shared.replaced == 1 and shared.marker == "kept"
        assert shared.url != old_url and shared.active_servers() == set()
        assert requests.get(f"{shared.url}/hub/api/", timeout=10).status_code == 200
        assert containers_with({TEST_LABEL: old_run}) == []  # the old hub's session went too
    finally:
        shared.close()
