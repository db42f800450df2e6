"""Batch jobs on the Sessions page, in a real browser (Debian's Chromium, driven by Playwright), on
the run's shared GPU hub: the launch dialog's batch mode submits a command job whose log's lines
appear live in the list while it runs, then the job's end is shown with its reason, exit code, the
log's end and where its outputs are; a failing job; bad input refused in the dialog with the
service's message, nothing queued; a log holding HTML shown as text; Cancel asks first. The
Finished tab lists jobs with their end reasons. Screenshots go to test-output/browser/jobs-*.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import Page, expect

from .browser import SESSIONS_PAGE, SPAWN_TIMEOUT_MS, launch, log_in, screenshot
from .harness import QueueUser
from .job_helpers import training_notebook

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

STEP_TWO = re.compile(r"^step two$", re.MULTILINE)
SLOTS = {"image": "python-3.11", "cpu": 0.5, "mem": "256M"}


@pytest.fixture
def student(jobs_student):
    return jobs_student


def open_sessions(page: Page, hub, name: str) -> None:
    log_in(page, hub, name)
    page.goto(f"{hub.url}{SESSIONS_PAGE}")
    expect(page.locator("#fgpu-indicator[data-ready]")).to_be_attached()


def batch_dialog(page: Page, kind: str) -> None:
    """The launch dialog in batch mode, small slots, running a `kind` ("notebook" or "command")."""
    launch(page, "python-3.11", cpu=0.5, mem_gib=0.25, fgpu=0, count=1)
    page.click('label[for="fgpu-launch-type-batch"]')
    expect(page.locator("#fgpu-launch-job")).to_be_visible()
    page.check(f"#fgpu-launch-kind-{kind}")


def job_row(page: Page, status: str | None = None):
    selector = "#fgpu-sessions tbody tr[data-session]" + (
        f'[data-status="{status}"]' if status else ""
    )
    return page.locator(selector, has=page.locator(".fgpu-job-badge"))


def ended_job(page: Page, reason: str):
    return page.locator(f'#fgpu-ended-jobs .fgpu-ended-job[data-end-reason="{reason}"]')


def submit_job(user: QueueUser, **job) -> dict:
    response = user.call("POST", "sessions", json={**SLOTS, "type": "batch", **job})
    assert response.status_code == 201, response.text
    return response.json()["servers"][0]["session"]


def open_log_streams(page: Page) -> set:
    """The page's `logs?follow=1` requests still open, kept up to date as they come and go."""
    streams: set = set()
    page.on("request", lambda r: "follow=1" in r.url and streams.add(r))
    page.on("requestfinished", lambda r: streams.discard(r))
    page.on("requestfailed", lambda r: streams.discard(r))
    return streams


def test_a_command_job_from_the_dialog_shows_its_live_log_and_ends_finished(gpu_hub, page, student):
    streams = open_log_streams(page)
    open_sessions(page, gpu_hub, student.name)
    batch_dialog(page, "notebook")
    dialog = page.locator("#fgpu-launch")
    expect(page.locator("#fgpu-launch-title")).to_have_text("Submit a batch job")
    expect(page.locator("#fgpu-launch-submit")).to_have_text("Submit job")
    expect(dialog).to_contain_text("folders/<name>/")
    note = page.locator("#fgpu-launch-time-limit-note")
    expect(note).to_contain_text("the hub’s default, 1 h")
    # The rule in the words of the service's refusal (image_catalog/job_options.py).
    expect(note).to_contain_text("A job’s time limit is from 1 min to 24 h on this hub.")
    page.fill("#fgpu-launch-notebook", "folders/course/train.ipynb")
    page.fill("#fgpu-launch-parameters", '{"epochs": 3}')
    page.fill("#fgpu-launch-time-limit", "2h")
    screenshot(page, "jobs-dialog-notebook")

    page.check("#fgpu-launch-kind-command")
    expect(page.locator("#fgpu-launch-notebook")).to_be_hidden()
    page.fill("#fgpu-launch-time-limit", "")
    page.fill("#fgpu-launch-command", "echo step one; sleep 6; echo step two")
    screenshot(page, "jobs-dialog-command")
    page.click("#fgpu-launch-submit")
    expect(dialog).to_be_hidden(timeout=SPAWN_TIMEOUT_MS)

    running = job_row(page, "RUNNING")
    expect(running).to_have_count(1, timeout=SPAWN_TIMEOUT_MS)
    expect(running.locator(".fgpu-job-what")).to_have_text(
        "Command: echo step one; sleep 6; echo step two"
    )
    expect(running.locator(".fgpu-ends")).to_contain_text("Ends by")
    expect(running.locator(".fgpu-ends")).to_contain_text("(time limit of 1 h)")
    # No notebook server: no app buttons, a Cancel in their place.
    expect(running.locator(".fgpu-app")).to_have_count(0)
    expect(running.locator(".fgpu-job-cancel")).to_be_visible()
    log = page.locator("#fgpu-sessions pre.fgpu-job-log")
    expect(log).to_contain_text("step one", timeout=30_000)
    # (the command's own line, echoed first, names "step two" too: the output's line is alone)
    expect(log).not_to_contain_text(STEP_TWO)
    expect(page.locator("#fgpu-sessions .fgpu-job-log-path")).to_contain_text("~/jobs/job-")
    assert len(streams) == 1, [r.url for r in streams]
    screenshot(page, "jobs-running-live-log")
    # The same box, live: the next line comes without a reload.
    expect(log).to_contain_text(STEP_TWO, timeout=30_000)

    done = ended_job(page, "finished")
    expect(done).to_have_count(1, timeout=60_000)
    expect(job_row(page)).to_have_count(0)
    expect(done).to_contain_text("Job finished")
    expect(done.locator(".fgpu-exit-code")).to_have_count(0)
    expect(done.locator("pre.fgpu-job-log")).to_contain_text("step two")
    expect(done.locator("pre.fgpu-job-log")).to_contain_text("[fgpu job] exited with code 0")
    expect(done.locator(".fgpu-job-log-path code")).to_contain_text("~/jobs/job-")
    screenshot(page, "jobs-finished")
    # The log's path is a link that opens it, as text.
    with page.context.expect_page() as opened:
        done.locator(".fgpu-job-log-path a").click()
    expect(opened.value.locator("body")).to_contain_text("[fgpu job] exited with code 0")
    opened.value.close()
    # The job's end ended the page's reading of its log: nothing is left open.
    deadline = time.monotonic() + 15
    while streams and time.monotonic() < deadline:
        page.wait_for_timeout(300)
    assert not streams, [r.url for r in streams]


NOTEBOOK = training_notebook()


def test_a_notebook_job_with_a_parameter_names_its_executed_copy(gpu_hub, page, student):
    folder = student.call("POST", "folders", json={"name": "runs"}).json()
    upload = student.call(
        "PUT",
        f"folders/{folder['id']}/files/train.ipynb",
        data=json.dumps(NOTEBOOK),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert upload.status_code == 201, upload.text
    open_sessions(page, gpu_hub, student.name)
    batch_dialog(page, "notebook")
    runs = page.locator('#fgpu-launch-folder-list [data-folder="runs"] input')
    expect(runs).not_to_be_checked()
    page.fill("#fgpu-launch-notebook", "folders/runs/train.ipynb")
    # The folder the path names is ticked, so that it is mounted.
    expect(runs).to_be_checked()
    page.fill("#fgpu-launch-parameters", '{"epochs": 7}')
    page.click("#fgpu-launch-submit")
    expect(page.locator("#fgpu-launch")).to_be_hidden(timeout=SPAWN_TIMEOUT_MS)

    row = job_row(page)
    expect(row.locator(".fgpu-job-what")).to_have_text(
        "Notebook: folders/runs/train.ipynb with epochs = 7", timeout=30_000
    )
    done = ended_job(page, "finished")
    expect(done).to_have_count(1, timeout=SPAWN_TIMEOUT_MS)
    expect(done.locator("pre.fgpu-job-log")).to_contain_text("trained for 70")
    expect(done.locator(".fgpu-job-copy code")).to_contain_text(
        re.compile(r"^~/folders/runs/train-output-\d{8}-\d{6}\.ipynb$")
    )
    screenshot(page, "jobs-notebook-finished")


def test_a_failing_job_shows_failed_its_exit_code_and_last_line(gpu_hub, page, student):
    submit_job(student, command="echo working; echo 'no data found' >&2; exit 3")
    open_sessions(page, gpu_hub, student.name)
    failed = ended_job(page, "failed")
    expect(failed).to_have_count(1, timeout=SPAWN_TIMEOUT_MS)
    expect(failed.locator(".fgpu-end-label")).to_have_text("Job failed")
    expect(failed.locator(".fgpu-exit-code")).to_have_text("exit code 3")
    expect(failed.locator(".fgpu-end-detail")).to_contain_text("no data found")
    expect(failed.locator("pre.fgpu-job-log")).to_contain_text("working")
    screenshot(page, "jobs-failed")

    page.click("#fgpu-tab-finished")
    row = page.locator('#fgpu-finished tbody tr[data-end-reason="failed"]')
    expect(row).to_have_count(1)
    expect(row.locator(".fgpu-job-badge")).to_have_text("Batch job")
    expect(row.locator(".fgpu-exit-code")).to_have_text("exit code 3")
    expect(row.locator(".fgpu-end-detail")).to_contain_text("The job exited with code 3")
    screenshot(page, "jobs-finished-tab")


def test_a_job_shows_when_its_time_limit_ends_it_and_then_that_it_did(
    gpu_hub, page, student, service_clock
):
    submit_job(student, command="sleep 600", time_limit="1m")
    open_sessions(page, gpu_hub, student.name)
    running = job_row(page, "RUNNING")
    expect(running.locator(".fgpu-ends")).to_contain_text(
        "at the latest (time limit of 1 min)", timeout=SPAWN_TIMEOUT_MS
    )
    try:
        service_clock.move_to(datetime.now(UTC) + timedelta(minutes=2))
        over = ended_job(page, "timeout")
        expect(over).to_have_count(1, timeout=120_000)
    finally:
        service_clock.reset()
    expect(over.locator(".fgpu-end-label")).to_have_text("Job reached its time limit")
    expect(over.locator(".fgpu-end-detail")).to_have_text("The job ran for its time limit of 1 min")
    expect(over.locator(".fgpu-exit-code")).to_have_count(0)


@pytest.mark.parametrize(
    ("kind", "fields", "words"),
    [
        ("command", {}, "either a notebook or a command"),
        (
            "notebook",
            {"notebook": "train.ipynb", "parameters": "{epochs: 3"},
            "parameters are not JSON",
        ),
        (
            "command",
            {"command": "true", "time-limit": "10 s"},
            "a job's time limit is at least 1 min",
        ),
    ],
)
def test_bad_job_input_shows_the_services_message_and_queues_nothing(
    gpu_hub, page, student, kind, fields, words
):
    open_sessions(page, gpu_hub, student.name)
    batch_dialog(page, kind)
    for name, value in fields.items():
        page.fill(f"#fgpu-launch-{name}", value)
    page.click("#fgpu-launch-submit")
    error = page.locator("#fgpu-launch-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text(words)
    expect(page.locator("#fgpu-launch")).to_be_visible()
    expect(page.locator("#fgpu-launch-submit")).to_have_text("Submit job")
    if kind == "notebook":
        screenshot(page, "jobs-dialog-refused")
    assert student.sessions() == []


def test_html_in_a_jobs_log_is_shown_as_text(gpu_hub, page, student):
    alerts: list[str] = []
    page.on("dialog", lambda d: (alerts.append(d.message), d.dismiss()))
    markup = "<img src=x onerror=alert(1)>"
    submit_job(student, command=f"echo '{markup}'; sleep 4; echo '<b>bold</b>'")
    open_sessions(page, gpu_hub, student.name)
    live = page.locator("#fgpu-sessions pre.fgpu-job-log")
    expect(live).to_contain_text(markup, timeout=SPAWN_TIMEOUT_MS)
    done = ended_job(page, "finished")
    expect(done).to_have_count(1, timeout=60_000)
    expect(done.locator("pre.fgpu-job-log")).to_contain_text(markup)
    expect(done.locator("pre.fgpu-job-log")).to_contain_text("<b>bold</b>")
    expect(done.locator(".fgpu-job-what")).to_contain_text(markup)
    assert page.locator("#fgpu-ended-jobs img, #fgpu-sessions img, #fgpu-ended-jobs b").count() == 0
    assert alerts == []


def test_cancel_asks_then_cancels_a_waiting_and_a_running_job(gpu_hub, page, student):
    # The whole GPU each: the second waits for the first.
    first = submit_job(student, command="sleep 600", fgpu=2)
    submit_job(student, command="echo never", fgpu=2)
    open_sessions(page, gpu_hub, student.name)
    expect(job_row(page, "RUNNING")).to_have_count(1, timeout=SPAWN_TIMEOUT_MS)
    waiting = job_row(page, "PENDING")
    expect(waiting.locator(".fgpu-position")).to_have_text("1st in line")
    confirm = page.locator("#fgpu-confirm")

    # Asked, and kept: nothing ends on the press alone.
    job_row(page, "RUNNING").locator(".fgpu-job-cancel").click()
    expect(confirm).to_be_visible()
    expect(confirm).to_contain_text("Cancel job")
    expect(confirm).to_contain_text("Files it has already written stay")
    screenshot(page, "jobs-cancel-question")
    page.click("#fgpu-confirm-keep")
    expect(confirm).to_be_hidden()
    assert [s["status"] for s in student.sessions() if s["id"] == first["id"]] == ["RUNNING"]

    waiting.locator(".fgpu-job-cancel").click()
    expect(confirm).to_contain_text("gives up its place in the queue (1st in line)")
    page.click("#fgpu-confirm-go")
    expect(job_row(page, "PENDING")).to_have_count(0, timeout=30_000)

    job_row(page, "RUNNING").locator(".fgpu-job-cancel").click()
    page.click("#fgpu-confirm-go")
    expect(job_row(page)).to_have_count(0, timeout=60_000)
    expect(ended_job(page, "cancelled")).to_have_count(2, timeout=30_000)
    assert student.sessions() == []


def test_a_job_from_the_dialog_may_start_not_before_a_time_and_waits_until_then(
    gpu_hub, page, student
):
    open_sessions(page, gpu_hub, student.name)
    batch_dialog(page, "command")
    page.fill("#fgpu-launch-command", "echo at night")
    field = page.locator("#fgpu-launch-start-after")
    expect(field).to_have_attribute("type", "datetime-local")
    expect(page.locator("#fgpu-launch-start-after-note")).to_contain_text("at most 7 days ahead")
    # Two hours ahead, to the minute, as the browser's clock reads it (its own time zone).
    local = page.evaluate(
        """() => { const d = new Date(Date.now() + 2 * 3600 * 1000);
                   const two = n => String(n).padStart(2, "0");
                   return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())}` +
                          `T${two(d.getHours())}:${two(d.getMinutes())}`; }"""
    )
    page.fill("#fgpu-launch-start-after", local)
    screenshot(page, "jobs-dialog-start-after")
    page.click("#fgpu-launch-submit")
    expect(page.locator("#fgpu-launch")).to_be_hidden(timeout=SPAWN_TIMEOUT_MS)

    # The service has the browser's time with its offset, as UTC: the same moment.
    (job,) = student.wait_for(lambda s: len(s) == 1)
    expected = page.evaluate(f"() => new Date({local!r}).toISOString()")
    assert datetime.fromisoformat(job["start_after"]) == datetime.fromisoformat(expected)
    assert (job["status"], job["position"]) == ("PENDING", None)
    utc = datetime.fromisoformat(expected)
    assert job["reason"] == f"Waits until {utc:%H:%M} UTC, as asked" or job["reason"].endswith(
        f"{utc:%H:%M} UTC, as asked"
    )
    row = job_row(page, "PENDING")
    expect(row).to_have_count(1, timeout=30_000)
    shown = page.evaluate(
        """iso => new Date(iso).toLocaleString([], { weekday: "short", day: "numeric",
                  month: "short", hour: "2-digit", minute: "2-digit" })""",
        job["start_after"],
    )
    expect(row.locator(".fgpu-position")).to_have_text(
        f"starts {shown} at the earliest, as you asked; until then it holds nothing"
    )
    # The service's reason says the same in UTC: the row shows the reader's clock alone.
    expect(row.locator(".fgpu-reason")).to_have_count(0)
    screenshot(page, "jobs-pending-start-after")


def test_the_dialog_says_what_happens_to_jobs_and_a_job_starts_from_a_jobs_defaults(gpu_hub, page):
    """Jobs wait under their own limit (jobs_waiting_per_user), not the `pending` quota: where
    sessions beyond the pending quota are refused, the same number of jobs all wait, and the
    dialog says so. Switching to a job resets the count and the fGPU a session had."""
    name = f"jobs-{int(time.time() * 1000) % 100000}"
    user = QueueUser(gpu_hub, name)
    gpu_hub.join_group(name, {"fgpu_quota": {"sessions": 1}})
    assert user.call("POST", "sessions", json={**SLOTS, "count": 1}).status_code == 201
    user.wait_for(lambda s: [x["status"] for x in s] == ["RUNNING"], 150)
    open_sessions(page, gpu_hub, name)
    launch(page, "python-3.11", cpu=0.5, mem_gib=0.25, fgpu=1, count=3)
    warning = page.locator("#fgpu-launch-warning")
    expect(warning).to_contain_text("1 will be refused")  # sessions: the pending quota of 2

    page.click('label[for="fgpu-launch-type-batch"]')
    expect(page.locator("#fgpu-launch-count")).to_have_value("1")
    expect(page.locator("#fgpu-launch-fgpu")).to_have_value("0")
    page.check("#fgpu-launch-kind-command")
    page.fill("#fgpu-launch-command", "sleep 60")
    page.fill("#fgpu-launch-count", "3")
    expect(warning).to_contain_text("3 will wait in the queue (PENDING)")
    expect(warning).not_to_contain_text("refused")
    screenshot(page, "jobs-dialog-waiting")
    page.click("#fgpu-launch-submit")
    expect(page.locator("#fgpu-launch")).to_be_hidden(timeout=SPAWN_TIMEOUT_MS)
    waiting = [s for s in user.sessions() if s["type"] == "batch"]
    assert [s["status"] for s in waiting] == ["PENDING"] * 3, waiting
    user.end_all()
