"""Batch jobs (`POST api/sessions` with `type: "batch"`) on the real hub, service and engine: a
command job whose log streams while it runs and is kept after, its slice handed to the next job
in the same pass; a failing job, with its exit code and last line; a notebook job with a
parameter, whose executed copy lands next to it in a storage folder; a job past its time limit;
cancels; and the bad input that queues nothing."""

from __future__ import annotations

import json
import os
import secrets
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fgpu_shared.homes import home_volume_name
from queue_service.quotas import DEFAULT_USER_QUOTA

from .harness import TEST_LABEL, QueueUser, containers_with, docker_client, restart, wait_until
from .job_helpers import job_ended, job_record, training_notebook
from .test_queue_service import kill_queue_service
from .test_security_handlers import EVIL, Browser, narrow_admin_token
from .test_usage_hub import held_hours

pytestmark = [pytest.mark.docker, pytest.mark.hub]

SLOTS = {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}
#: The whole of `gpu_hub`'s one GPU: a second such job waits for the first.
WHOLE_GPU = {**SLOTS, "fgpu": 2}
OCTETS = {"Content-Type": "application/octet-stream"}


def submit(user: QueueUser, **job) -> dict:
    response = user.call("POST", "sessions", json={**SLOTS, "type": "batch", **job})
    assert response.status_code == 201, response.text
    (server,) = response.json()["servers"]
    return server["session"]


def ended(user: QueueUser, session_id: str, timeout: float = 120) -> dict:
    return job_ended(user, session_id, timeout)


def moment(text: str) -> datetime:
    return datetime.fromisoformat(text)


@pytest.fixture
def student(jobs_student):
    return jobs_student


def test_a_command_job_streams_its_log_ends_finished_and_its_slice_goes_to_the_next_at_once(
    gpu_hub, student
):
    first = submit(student, command="echo step one; sleep 6; echo step two", **WHOLE_GPU)
    second = submit(student, command="echo second", **WHOLE_GPU)
    assert (first["type"], first["job"]["command"]) == (
        "batch",
        "echo step one; sleep 6; echo step two",
    )
    waiting = job_record(student, second["id"])
    assert (waiting["status"], waiting["position"]) == ("PENDING", 1)
    student.wait_for(lambda s: any(r["id"] == first["id"] and r["status"] == "RUNNING" for r in s))
    follow = student.call("GET", f"sessions/{first['id']}/logs?follow=1", stream=True)
    assert follow.status_code == 200
    assert follow.headers["Content-Type"].startswith("text/plain")
    streamed = b"".join(follow.iter_content(chunk_size=None)).decode()
    assert streamed.index("step one") < streamed.index("step two")
    assert "[fgpu job] exited with code 0" in streamed
    done = ended(student, first["id"])
    assert (done["status"], done["end_reason"], done["exit_code"]) == ("TERMINATED", "finished", 0)
    # Granted in the very pass that ended the first: not on a later round.
    started = wait_until(
        lambda: (r := job_record(student, second["id"]))["scheduled"] and r,
        60,
        "the second's grant",
    )
    assert moment(started["scheduled"]) - moment(done["ended"]) < timedelta(seconds=1)
    kept = student.call("GET", f"sessions/{first['id']}/logs")
    assert kept.status_code == 200
    assert "step two" in kept.text and "~/jobs/job-" in kept.text
    gone = ended(student, second["id"])
    assert gone["end_reason"] == "finished"
    # The hub stopped the ended jobs' servers: no container is left behind.
    wait_until(
        lambda: not containers_with({"fgpu.session_id": first["id"]}), 60, "the container's removal"
    )


def test_a_failing_job_ends_failed_with_its_exit_code_and_last_line(gpu_hub, student):
    job = submit(student, command="echo working; echo 'no data found' >&2; exit 3")
    done = ended(student, job["id"])
    assert (done["end_reason"], done["exit_code"]) == ("failed", 3)
    assert "code 3" in done["reason"] and "no data found" in done["reason"]
    # Its use is filed as it ends, slots × the time it held them, as a session's is.
    hours, filed = held_hours(gpu_hub, job["id"])
    assert filed and hours > 0
    totals = student.call("GET", "usage").json()["totals"]
    assert totals["cpu_hours"] == pytest.approx(SLOTS["cpu"] * hours, rel=1e-6)


def test_a_notebook_job_runs_with_its_parameter_and_its_executed_copy_lands_beside_it(
    gpu_hub, student
):
    folder = student.call("POST", "folders", json={"name": "runs"}).json()
    notebook = training_notebook()
    url = f"folders/{folder['id']}/files/train.ipynb"
    assert student.call("PUT", url, data=json.dumps(notebook), headers=OCTETS).status_code == 201
    job = submit(
        student, notebook="folders/runs/train.ipynb", parameters={"epochs": 7}, folders=["runs"]
    )
    done = ended(student, job["id"], timeout=180)
    assert done["end_reason"] == "finished", student.call("GET", f"sessions/{job['id']}/logs").text
    listing = student.call("GET", f"folders/{folder['id']}/files/").json()["entries"]
    (copy,) = [e["name"] for e in listing if e["name"].startswith("train-output-")]
    executed = student.call("GET", f"folders/{folder['id']}/files/{copy}").json()
    # nbformat writes a multi-line text as a list of lines.
    outputs = ["".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", [])]
    assert "trained for 70\n" in outputs
    tags = [cell["metadata"].get("tags", []) for cell in executed["cells"]]
    assert tags[1] == ["injected-parameters"]  # right after the cell tagged `parameters`


def test_a_notebook_jobs_printed_lines_are_in_its_log_while_the_cell_runs(gpu_hub, student):
    """A cell's prints reach the log as the kernel sends them (not when the cell ends), and the
    log holds what the notebook wrote and the runner's own lines, no kernel warning."""
    first = "print('first half', flush=True)\nimport time\ntime.sleep(20)\n"
    folder = student.call("POST", "folders", json={"name": "live"}).json()
    url = f"folders/{folder['id']}/files/train.ipynb"
    body = json.dumps(training_notebook(first))
    assert student.call("PUT", url, data=body, headers=OCTETS).status_code == 201
    job = submit(student, notebook="folders/live/train.ipynb", folders=["live"])

    def log() -> str:
        return student.call("GET", f"sessions/{job['id']}/logs").text

    wait_until(lambda: "first half" in log(), 120, "the cell's first line in the log")
    running = log()
    assert "cell 2/" not in running, running  # the cell that printed it still runs
    done = ended(student, job["id"], timeout=180)
    assert done["end_reason"] == "finished", done["reason"]
    whole = student.call("GET", f"sessions/{job['id']}/logs").text
    assert "trained for 10" in whole and "without encryption" not in whole, whole


def test_a_job_past_its_time_limit_ends_timeout(gpu_hub, student, service_clock):
    job = submit(student, command="sleep 600", time_limit="1m")
    student.wait_for(lambda s: any(r["id"] == job["id"] and r["status"] == "RUNNING" for r in s))
    try:
        service_clock.move_to(datetime.now(UTC) + timedelta(minutes=2))
        done = ended(student, job["id"])
    finally:
        service_clock.reset()
    assert (done["status"], done["end_reason"]) == ("TERMINATED", "timeout")
    assert "time limit of 1 min" in done["reason"]


def test_cancelling_a_waiting_and_a_running_job_ends_both_cancelled(gpu_hub, student):
    running = submit(student, command="sleep 600", **WHOLE_GPU)
    waiting = submit(student, command="echo never", **WHOLE_GPU)
    student.wait_for(
        lambda s: any(r["id"] == running["id"] and r["status"] == "RUNNING" for r in s)
    )
    for job in (waiting, running):
        assert student.call("DELETE", f"sessions/{job['id']}").status_code in (200, 202)
    for job in (waiting, running):
        assert ended(student, job["id"])["end_reason"] == "cancelled"
    assert job_record(student, waiting["id"])["status"] == "CANCELLED"


@pytest.mark.parametrize(
    ("job", "words"),
    [
        ({"notebook": "../other/x.ipynb"}, "may not leave your home folder"),
        ({"notebook": "/etc/x.ipynb"}, "relative to your home folder"),
        ({"notebook": "work/data.csv"}, "not a notebook"),
        ({"command": "   "}, "either a notebook or a command"),
        ({"command": "true", "notebook": "a.ipynb"}, "either a notebook or a command"),
        ({"command": "true", "time_limit": "10y"}, "not a duration"),
        ({"command": "true", "time_limit": 10}, "time_limit 10 s: a job's time limit is at least 1 min."),
        ({"command": "true", "time_limit": "3d"}, "time_limit 72 h: a job's time limit is from 1 min to"),
        ({"notebook": "a.ipynb", "parameters": "{not json"}, "parameters are not JSON"),
        ({"notebook": "a.ipynb", "parameters": {"1x": 1}}, "not a Python variable name"),
        ({"command": "true", "parameters": {"a": 1}}, "a command takes none"),
        ({"type": "nightly", "command": "true"}, "type must be"),
        ({"type": "interactive", "command": "true"}, 'add "type": "batch"'),
        # Looked for before anything is queued: the student's home volume does not even exist.
        ({"notebook": "nope.ipynb"}, "notebook nope.ipynb is not in your home folder."),
        ({"notebook": "folders/runs/x.ipynb"}, "A storage folder appears under ~/folders/ only"),
        ({"command": "true", "start_after": "tomorrow"}, "is not a time"),
        ({"command": "true", "start_after": "2026-11-28T02:00"}, "has no offset"),
        ({"command": "true", "start_after": 1796004000}, "must be an ISO 8601 time"),
        ({"command": "true", "start_after": f"{datetime.now(UTC) - timedelta(minutes=5)}"},
         "in the past"),
        ({"command": "true", "start_after": f"{datetime.now(UTC) + timedelta(days=8)}"},
         "deferred by at most 7 days"),
        ({"start_after": f"{datetime.now(UTC) + timedelta(hours=1)}"}, 'add "type": "batch"'),
    ],
)  # fmt: skip
def test_bad_job_input_is_refused_with_a_message_and_queues_nothing(gpu_hub, student, job, words):
    body = {**SLOTS, "type": "batch", **job}
    if list(job) == ["start_after"]:
        body = {**SLOTS, **job}  # an interactive launch
    response = student.call("POST", "sessions", json=body)
    assert response.status_code == 400, response.text
    assert words in response.json()["message"]
    assert student.sessions() == []
    assert not containers_with({"fgpu.user": student.name})


def test_a_notebook_is_looked_for_in_the_home_and_the_folder_before_anything_is_queued(
    gpu_hub, student
):
    """A missing notebook was queued and failed only once it ran (code 2). It is refused at
    submission now, with nothing queued, whether it is missing from the student's home volume,
    from a storage folder the launch mounts, or from a job started through the hub's own API;
    one that is there runs from the very volume the spawner mounts."""
    home = home_with(student, {"work/train.ipynb": json.dumps(training_notebook())})
    folder = student.call("POST", "folders", json={"name": "runs"}).json()
    refused = [
        ({"notebook": "work/missing.ipynb"}, "notebook work/missing.ipynb is not in your home"),
        ({"notebook": "folders/runs/train.ipynb", "folders": [folder["id"]]}, "storage folder"),
    ]
    for job, words in refused:
        response = student.call("POST", "sessions", json={**SLOTS, "type": "batch", **job})
        assert response.status_code == 400, response.text
        assert words in response.json()["message"], response.text
    body = {**SLOTS, "type": "batch", "notebook": "elsewhere.ipynb"}
    response = gpu_hub.request("POST", f"users/{student.name}/servers/nightly", json=body)
    assert response.status_code == 400, response.text
    assert "notebook elsewhere.ipynb is not in your home folder" in response.text
    assert student.sessions() == []
    assert student.call("GET", "sessions?finished=1").json()["sessions"] == []
    assert not containers_with({"fgpu.user": student.name})

    job = submit(student, notebook="work/train.ipynb", parameters={"epochs": 2})
    done = ended(student, job["id"], timeout=180)
    assert done["end_reason"] == "finished", done["reason"]
    assert [p.name for p in (home / "work").glob("train-output-*.ipynb")]


def home_with(user: QueueUser, files: dict[str, str]) -> Path:
    """The user's home volume, made before their first session as the spawner would make it
    (owned by the session user, with the test run's label: removed with the hub), holding
    `files`."""
    labels = {TEST_LABEL: user.hub.run_id, "fgpu.user": user.name, "fgpu.volume": "home"}
    name = home_volume_name("fgpu-home-{username}", user.name)
    volume = docker_client().volumes.create(name, labels=labels)
    home = Path(volume.attrs["Mountpoint"])
    for name, text in files.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    for path in [home, *home.rglob("*")]:
        os.chown(path, 1000, 100)
    return home


def test_a_jobs_log_is_its_owners_and_an_admins_alone(gpu_hub, student):
    job = submit(student, command="echo private")
    ended(student, job["id"])
    stranger = QueueUser(gpu_hub, f"other-{secrets.token_hex(3)}")
    answer = stranger.call("GET", f"sessions/{job['id']}/logs")
    assert answer.status_code == 404 and "private" not in answer.text
    admin = QueueUser(gpu_hub, "admin")
    assert "private" in admin.call("GET", f"sessions/{job['id']}/logs").text


def test_a_job_that_ends_while_the_service_is_down_ends_finished_when_it_is_back(gpu_hub, student):
    job = submit(student, command="sleep 4; echo done while the service was away", **WHOLE_GPU)
    waiting = submit(student, command="echo next", **WHOLE_GPU)
    student.wait_for(lambda s: any(r["id"] == job["id"] and r["status"] == "RUNNING" for r in s))
    kill_queue_service(gpu_hub, student)
    done = ended(student, job["id"])
    assert (done["end_reason"], done["exit_code"]) == ("finished", 0)
    assert (
        "done while the service was away" in student.call("GET", f"sessions/{job['id']}/logs").text
    )
    assert ended(student, waiting["id"])["end_reason"] == "finished"


def test_a_job_started_through_the_hubs_rest_api_is_the_same_job(gpu_hub, student):
    body = {**SLOTS, "type": "batch", "command": "echo from the hub api", "time_limit": "5m"}
    response = gpu_hub.request("POST", f"users/{student.name}/servers/nightly", json=body)
    assert response.status_code in (201, 202), response.text
    (job,) = student.wait_for(lambda s: len(s) == 1)
    assert (job["type"], job["job"]["command"], job["job"]["time_limit"]) == (
        "batch",
        "echo from the hub api",
        300.0,
    )
    assert ended(student, job["id"])["end_reason"] == "finished"


def test_a_groups_job_time_limit_is_its_members_default_and_maximum(gpu_hub, student):
    gpu_hub.join_group(student.name, {"job_time_limit": {"default": "2m", "max": "5m"}})
    body = {**SLOTS, "type": "batch", "command": "sleep 600", "time_limit": "10m"}
    refused = student.call("POST", "sessions", json=body)
    assert refused.status_code == 400
    assert "a job's time limit is from 1 min to 5 min on this hub" in refused.json()["message"]
    assert student.sessions() == []
    job = submit(student, command="sleep 600")
    (running,) = student.wait_for(lambda s: s and s[0]["status"] == "RUNNING" and s[0]["ends"])
    assert running["ends"]["why"] == "timeout" and running["ends"]["text"] == "time limit of 2 min"
    planned = moment(running["ends"]["at"]) - moment(running["started"])
    assert planned == timedelta(minutes=2)
    assert student.call("DELETE", f"sessions/{job['id']}").status_code in (200, 202)


def test_a_job_running_through_a_hub_restart_goes_on_and_ends_by_itself(gpu_hub, student):
    job = submit(student, command="sleep 20; echo outlived the hub", time_limit="5m")
    student.wait_for(lambda s: any(r["id"] == job["id"] and r["status"] == "RUNNING" for r in s))
    hub_down = datetime.now(UTC)
    restart(gpu_hub)
    done = ended(student, job["id"])
    assert (done["end_reason"], done["exit_code"]) == ("finished", 0)
    assert moment(done["ended"]) > hub_down
    assert "outlived the hub" in student.call("GET", f"sessions/{job['id']}/logs").text
    wait_until(lambda: not containers_with({"fgpu.session_id": job["id"]}), 60, "its removal")


def test_a_cross_site_page_and_a_narrow_token_neither_read_a_jobs_log_nor_submit_one(
    gpu_hub, student
):
    owner = Browser(gpu_hub, student.name)
    body = {**SLOTS, "type": "batch", "command": "echo secret-output"}
    made = owner.own_page_call("POST", "sessions", json=body)
    assert made.status_code == 201, made.text
    (server,) = made.json()["servers"]
    job = ended(student, server["session"]["id"])
    forged = owner.call("POST", "sessions", headers=EVIL, json=body)
    assert forged.status_code == 403, forged.text
    stolen = owner.call(
        "GET", f"sessions/{job['id']}/logs", headers={**EVIL, "Sec-Fetch-Mode": "cors"}
    )
    assert stolen.status_code == 403 and "secret-output" not in stolen.text
    narrow = narrow_admin_token(gpu_hub, ["access:services!service=queue"])
    other = narrow.get(f"{gpu_hub.url}/services/queue/api/sessions/{job['id']}/logs", timeout=60)
    assert other.status_code in (403, 404) and "secret-output" not in other.text
    assert "secret-output" in owner.own_page_call("GET", f"sessions/{job['id']}/logs").text
    assert [s["id"] for s in student.sessions()] == []  # the forged one queued nothing


def test_a_job_deferred_a_few_seconds_waits_holding_nothing_and_starts_by_itself(gpu_hub, student):
    start_after = (datetime.now(UTC) + timedelta(seconds=30)).replace(microsecond=0)
    job = submit(
        student, command="echo started on time", start_after=start_after.isoformat(), **WHOLE_GPU
    )
    assert (job["status"], job["position"]) == ("PENDING", None)
    assert job["start_after"] == start_after.isoformat()
    assert job["reason"] == f"Waits until {start_after:%H:%M} UTC, as asked"
    # A later session asking for the same whole GPU is granted at once: the job holds nothing and
    # is not ahead of it in line.
    response = student.call("POST", "sessions", json={**WHOLE_GPU, "count": 1})
    assert response.status_code == 201, response.text
    (server,) = response.json()["servers"]
    session = server["session"]
    student.wait_for(lambda s: job_record(student, session["id"])["status"] == "RUNNING")
    waiting = job_record(student, job["id"])
    assert (waiting["status"], waiting["position"], waiting["reason"]) == (
        "PENDING",
        None,
        job["reason"],
    )
    # The GPU is free again, and still the job waits for its time.
    assert student.call("DELETE", f"sessions/{session['id']}").status_code in (200, 202)
    student.wait_for(lambda s: all(r["id"] != session["id"] for r in s))
    if datetime.now(UTC) < start_after - timedelta(seconds=3):
        time.sleep(1.5)  # a pass or two (the release's, the reconciler's) with the GPU free
        assert job_record(student, job["id"])["status"] == "PENDING"
    done = ended(student, job["id"], timeout=120)
    assert (done["end_reason"], done["exit_code"]) == ("finished", 0)
    assert moment(done["started"]) >= start_after
    # By itself, at its time: granted then, its container up a few seconds later.
    assert moment(done["started"]) < start_after + timedelta(seconds=30)
    assert "started on time" in student.call("GET", f"sessions/{job['id']}/logs").text


def test_a_student_may_have_three_jobs_waiting_with_a_pending_quota_of_two(gpu_hub, student):
    assert DEFAULT_USER_QUOTA["pending"] == 2
    running = submit(student, command="sleep 600", **WHOLE_GPU)
    student.wait_for(lambda s: job_record(student, running["id"])["status"] == "RUNNING")
    jobs = [submit(student, command=f"echo {i}", **WHOLE_GPU) for i in range(3)]
    waiting = [job_record(student, job["id"]) for job in jobs]
    assert [(w["status"], w["position"]) for w in waiting] == [
        ("PENDING", 1),
        ("PENDING", 2),
        ("PENDING", 3),
    ]
    # The pending quota still bounds the waiting sessions, beside the waiting jobs, and says so.
    for _ in range(2):
        response = student.call("POST", "sessions", json={**WHOLE_GPU, "count": 1})
        assert response.status_code == 201, response.text
    refused = student.call("POST", "sessions", json={**WHOLE_GPU, "count": 1})
    assert refused.status_code == 403, refused.text
    assert "2 pending sessions at a time (its `pending` limit)" in refused.json()["message"]
    # And the jobs' own limit, named, past its 5.
    submit(student, command="echo 3", **WHOLE_GPU)
    submit(student, command="echo 4", **WHOLE_GPU)
    body = {**SLOTS, **WHOLE_GPU, "type": "batch", "command": "echo 5"}
    too_many = student.call("POST", "sessions", json=body)
    assert too_many.status_code == 403, too_many.text
    assert "(jobs_waiting_per_user)" in too_many.json()["message"]
    sessions = student.sessions()
    assert len([s for s in sessions if s["status"] == "PENDING" and s["type"] == "batch"]) == 5
    assert len([s for s in sessions if s["status"] == "PENDING" and s["type"] != "batch"]) == 2
