"""After the whole hub is SIGKILLed mid-queue, the line moves at once, on a
real hub and engine: the waiting request's spawn died with the hub, and the next service issues
it again in its first round rather than after `respawn_grace`, so a release starts it by itself.
The grace is set far beyond the test here (an hour), so only the new rule can start it; the
figure (seconds from the release to RUNNING) is printed for benchmarks/README.md."""

from __future__ import annotations

import secrets
import signal
import time

import pytest

from .harness import QueueUser, containers_with, relaunch, running_hub, wait_until
from .test_queue_service import SESSION, assert_nothing_leaked, by_status

pytestmark = [pytest.mark.docker, pytest.mark.hub]

SIMULATED_GPU = {"FGPU_SIMULATED_GPUS": "1x8GiB", "FGPU_UNITS_PER_GPU": "2"}
HOUR_OF_GRACE = """
c.QueueService.respawn_grace = 3600
"""


def test_after_a_hub_crash_a_release_starts_the_waiting_request_by_itself(tmp_path):
    with running_hub(tmp_path / "hub", env=SIMULATED_GPU, extra_config=HOUR_OF_GRACE) as hub:
        student = QueueUser(hub, f"student-{secrets.token_hex(4)}")
        # Launched with a storage folder and an environment variable, which the spawn issued
        # again after the crash must keep (the hub's saved options: reconciler.respawn_options).
        folder = student.call("POST", "folders", json={"name": "runs"})
        assert folder.status_code == 201, folder.text
        extras = {"folders": ["runs"], "env": {"CRASH_TEST_VAR": "kept"}}
        launched = student.call(
            "POST", "sessions", json={**SESSION, **extras, "fgpu": 1, "count": 3}
        )
        assert launched.status_code == 201, launched.text
        before = student.wait_for(
            lambda s: len(by_status(s, "RUNNING")) == 2 and len(by_status(s, "PENDING")) == 1
        )
        (pending,) = by_status(before, "PENDING")

        # As an OOM kill does: the hub, and with it the service, gone mid-queue.
        hub.process.send_signal(signal.SIGKILL)
        relaunch(hub)
        after = student.wait_for(
            lambda s: (
                {(r["id"], r["status"]) for r in s} == {(r["id"], r["status"]) for r in before}
            )
        )
        # A hub just up still checks its servers (`pending: "check"`), and refuses to stop one
        # meanwhile with a 500 of its own: the student's stop comes once it is done.
        stopping = by_status(after, "RUNNING")[0]
        wait_until(
            lambda: (
                (hub.server_model(student.name, stopping["server_name"]) or {}).get("pending")
                is None
            ),
            60,
            "the relaunched hub's check of the running server",
        )
        released = time.monotonic()
        gone = student.call("DELETE", f"sessions/{stopping['id']}")
        assert gone.status_code == 200, gone.text
        student.wait_for(
            lambda s: pending["id"] in {r["id"] for r in by_status(s, "RUNNING")}, timeout=150
        )
        print(f"the waiting request ran {time.monotonic() - released:.1f} s after the release")
        # The spawn issued again kept the launch's folder and environment variable.
        (container,) = containers_with({"fgpu.session_id": pending["id"]})
        assert "CRASH_TEST_VAR=kept" in container.attrs["Config"]["Env"]
        targets = {m["Destination"] for m in container.attrs["Mounts"]}
        assert "/home/jovyan/folders/runs" in targets, targets
        (record,) = [s for s in student.sessions() if s["id"] == pending["id"]]
        assert [m["name"] for m in record["mounts"]] == ["runs"]

        # Issued again once, and nothing runs twice or unaccounted.
        lost = f"spawn of {student.name}/{pending['server_name']} was lost"
        assert hub.log_text().count(lost) == 1
        assert_nothing_leaked(student)
