"""What one request for a running batch job's log may read, on the real hub, service and engine:
`tail` past its maximum is refused with the limit named, and a log of long lines is answered
with the most of its last lines that fit in the answer's bytes, after a note saying it was cut,
not read whole; a followed long log passes through the service's bounded relay whole and in
order."""

from __future__ import annotations

import pytest

from queue_service.engine.log_reads import READ_MAX
from queue_service.handlers.session_logs import TAIL_MAX

from .harness import wait_until
from .test_batch_jobs_hub import submit

pytestmark = [pytest.mark.docker, pytest.mark.hub]

#: 2,500 lines of 4,000 bytes (10 MB): more than one answer holds, fewer lines than TAIL_MAX.
LONG_LOG = (
    "line=$(printf '%4000s' | tr ' ' x); i=0; "
    'while [ $i -lt 2500 ]; do echo "$i $line"; i=$((i+1)); done; echo written; sleep 600'
)


def test_a_running_jobs_log_is_read_within_its_line_and_byte_limits(gpu_hub, jobs_student):
    job = submit(jobs_student, command=LONG_LOG)
    logs = f"sessions/{job['id']}/logs"
    wait_until(lambda: "written" in jobs_student.call("GET", f"{logs}?tail=1").text, 120, "the log")
    too_many = jobs_student.call("GET", f"{logs}?tail={TAIL_MAX + 1}")
    assert too_many.status_code == 400
    assert str(TAIL_MAX) in too_many.json()["message"]

    answer = jobs_student.call("GET", f"{logs}?tail={TAIL_MAX}")
    assert answer.status_code == 200
    assert len(answer.content) <= READ_MAX + 200
    note, _, rest = answer.text.partition("\n")
    # What the answer held, if not cut: its length in lines and its end say whether the engine
    # answered a short window (seen once, under load) or the log itself was short.
    held = (note, len(rest.splitlines()), len(answer.content), rest[-300:])
    assert note.startswith("[fgpu: only the last") and "~/jobs" in note, held
    lines = rest.splitlines()
    assert lines[-1] == "written"
    shown = int(note.split()[4])
    assert len(lines) == shown and lines[0].startswith(f"{2500 - shown + 1} ")
    # Within its limits the whole tail comes, with no note.
    few = jobs_student.call("GET", f"{logs}?tail=3").text.splitlines()
    assert few[0].startswith("2498 ") and few[-1] == "written"
    assert jobs_student.call("DELETE", f"sessions/{job['id']}").status_code in (200, 202)


def test_a_followed_long_log_comes_whole_and_in_order_through_the_bounded_relay(
    gpu_hub, jobs_student
):
    command = LONG_LOG.replace("sleep 600", "exit 0")
    job = submit(jobs_student, command="sleep 3; " + command)
    jobs_student.wait_for(
        lambda s: any(r["id"] == job["id"] and r["status"] == "RUNNING" for r in s)
    )
    follow = jobs_student.call(
        "GET", f"sessions/{job['id']}/logs?follow=1&tail={TAIL_MAX}", stream=True
    )
    assert follow.status_code == 200
    lines = b"".join(follow.iter_content(chunk_size=64 * 1024)).decode().splitlines()
    numbered = [line.split()[0] for line in lines if line.endswith("x" * 10)]
    assert numbered == [str(n) for n in range(2500)]
    assert "written" in lines
