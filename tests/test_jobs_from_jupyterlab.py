"""A notebook job created from JupyterLab, in Debian's Chromium on the run's shared GPU hub: the file
browser's "Run as a batch job…" (recipes/jupyter-base/session-status) opens the Sessions page in a
new tab with the batch dialog filled in for that notebook, the student submits it there, and it
runs in the queue. The page's `job` argument (sessions.js): only a notebook's path in the home
folder opens the dialog, with the image of the session named by `from`; anything else opens
nothing. Screenshots go to test-output/browser/jobs-from-jupyterlab-*.
"""

from __future__ import annotations

import re
import secrets
from urllib.parse import quote

import pytest
import requests
from playwright.sync_api import Page, expect

from .browser import SESSIONS_PAGE, SPAWN_TIMEOUT_MS, log_in, screenshot
from .harness import QueueUser
from .job_helpers import job_ended, training_notebook

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

SESSIONS = "/services/queue/sessions"
NOTEBOOK = training_notebook()
COPY = re.compile(r"^~/work/train-output-\d{8}-\d{6}\.ipynb$")


@pytest.fixture
def student(jobs_student):
    return jobs_student


def contents(hub, name: str, path: str, method: str = "GET", **kwargs) -> requests.Response:
    """The student's own server's contents API (the home folder), with their token."""
    return requests.request(
        method,
        f"{hub.url}/user/{name}/api/contents/{path}",
        headers={"Authorization": f"token {hub.user_token(name)}"},
        timeout=60,
        **kwargs,
    )


def test_a_notebook_job_created_from_the_jupyterlab_file_browser_runs_in_the_queue(
    gpu_hub, pages, student
):
    started = gpu_hub.start_server(
        student.name, {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}
    )
    assert started.status_code in (201, 202), started.text
    gpu_hub.wait_ready(student.name)
    (session,) = student.sessions()
    assert contents(gpu_hub, student.name, "work", "PUT", json={"type": "directory"}).ok
    put = contents(
        gpu_hub,
        student.name,
        "work/train.ipynb",
        "PUT",
        json={"type": "notebook", "format": "json", "content": NOTEBOOK},
    )
    assert put.status_code == 201, put.text

    page = pages()
    log_in(page, gpu_hub, student.name)  # lands on the Sessions page: the service's login too
    page.goto(f"{gpu_hub.url}/user/{student.name}/lab/tree/work", timeout=SPAWN_TIMEOUT_MS)
    item = page.locator(".jp-DirListing-item", has_text="train.ipynb")
    expect(item).to_be_visible(timeout=60_000)
    item.click(button="right")
    entry = page.locator(".lm-Menu-item", has_text="Run as a batch job…")
    expect(entry).to_be_visible()
    screenshot(page, "jobs-from-jupyterlab-menu")
    with page.context.expect_page() as opened:
        entry.click()

    sessions = opened.value
    sessions.wait_for_load_state()
    dialog = sessions.locator("#fgpu-launch")
    expect(dialog).to_be_visible()
    # A reload does not open the dialog again: the arguments are gone from the address.
    expect(sessions).to_have_url(re.compile(rf"{SESSIONS}$"))
    expect(sessions.locator("#fgpu-launch-title")).to_have_text("Submit a batch job")
    expect(sessions.locator("#fgpu-launch-type-batch")).to_be_checked()
    expect(sessions.locator("#fgpu-launch-kind-notebook")).to_be_checked()
    expect(sessions.locator("#fgpu-launch-notebook")).to_have_value("work/train.ipynb")
    expect(sessions.locator("#fgpu-launch-image")).to_have_value(session["image"])
    expect(sessions.locator("#fgpu-launch-submit")).to_have_text("Submit job")
    expect(sessions.locator("#fgpu-launch-submit")).to_be_focused()
    expect(sessions.locator("#fgpu-launch-from")).to_have_text(
        "From JupyterLab: run work/train.ipynb with the image and resources of your default "
        "session. Check them and the time limit below, then press Submit job."
    )
    # The session's slice (0.5 cores, 512 MiB), not the dialog's defaults (1 core, 2 GiB).
    expect(sessions.locator("#fgpu-launch-cpu-value")).to_have_text("0.5 cores")
    expect(sessions.locator("#fgpu-launch-mem-value")).to_have_text("512 MiB")
    screenshot(sessions, "jobs-from-jupyterlab-dialog")
    sessions.locator("#fgpu-launch-count").scroll_into_view_if_needed()
    screenshot(sessions, "jobs-from-jupyterlab-resources")
    sessions.click("#fgpu-launch-submit")
    expect(dialog).to_be_hidden(timeout=SPAWN_TIMEOUT_MS)

    (job,) = [s for s in student.sessions() if s["type"] == "batch"]
    assert job["job"]["notebook"] == "work/train.ipynb", job
    ended = job_ended(student, job["id"], timeout=SPAWN_TIMEOUT_MS / 1000)
    assert ended["end_reason"] == "finished", ended
    card = sessions.locator('#fgpu-ended-jobs .fgpu-ended-job[data-end-reason="finished"]')
    expect(card).to_have_count(1, timeout=30_000)
    expect(card.locator("pre.fgpu-job-log")).to_contain_text("trained for 10")
    copy = card.locator(".fgpu-job-copy code")
    expect(copy).to_have_text(COPY)
    # The executed copy is in the home folder, which the session sees as the job did.
    written = contents(gpu_hub, student.name, copy.inner_text().removeprefix("~/"))
    assert written.status_code == 200, written.text
    outputs = [o for cell in written.json()["content"]["cells"] for o in cell.get("outputs", [])]
    assert any("trained for 10" in "".join(o.get("text", "")) for o in outputs), outputs
    sessions.reload()
    expect(sessions.locator("#fgpu-indicator[data-ready]")).to_be_attached()
    expect(dialog).to_be_hidden()

    # The File menu's item, for the notebook open in the main area: none with the Launcher.
    in_file_menu = page.locator(".lm-Menu-item", has_text="Run Notebook as a Batch Job…")
    page.click('.lm-MenuBar-itemLabel:text-is("File")')
    expect(in_file_menu).to_have_class(re.compile(r"lm-mod-disabled"))
    page.keyboard.press("Escape")
    # The executed copy sorts just before train.ipynb: once the listing shows it, the rows stay
    # put, and the double click cannot land on the copy's row as it moves in.
    copy_name = copy.inner_text().rsplit("/", 1)[-1]
    listed = page.locator(".jp-DirListing-item", has_text=copy_name)
    expect(listed).to_be_visible(timeout=60_000)
    item.dblclick()
    expect(page.locator(".jp-NotebookPanel")).to_be_visible(timeout=60_000)
    page.click('.lm-MenuBar-itemLabel:text-is("File")')
    expect(in_file_menu).not_to_have_class(re.compile(r"lm-mod-disabled"))
    with page.context.expect_page() as again:
        in_file_menu.click()
    expect(again.value.locator("#fgpu-launch-notebook")).to_have_value("work/train.ipynb")


def open_with(page: Page, hub, query: str) -> None:
    page.goto(f"{hub.url}{SESSIONS}?{query}")
    expect(page.locator("#fgpu-indicator[data-ready]")).to_be_attached()


def test_the_image_is_that_of_the_session_the_notebook_came_from(gpu_hub, page, student):
    """A session on another image than the dialog's first (a job, which starts at once and needs
    no server to answer): the dialog picks its image, and ticks the storage folder of the path."""
    response = student.call(
        "POST",
        "sessions",
        json={"image": "scikit-learn-1.5", "cpu": 0.5, "mem": "256M", "type": "batch",
              "command": "sleep 600"},
    )  # fmt: skip
    assert response.status_code == 201, response.text
    other = response.json()["servers"][0]["session"]
    assert student.call("POST", "folders", json={"name": "course"}).status_code == 201
    log_in(page, gpu_hub, student.name)
    open_with(page, gpu_hub, f"job={quote('folders/course/a b.ipynb')}&from={other['id']}&x=1")
    expect(page.locator("#fgpu-launch")).to_be_visible()
    expect(page.locator("#fgpu-launch-notebook")).to_have_value("folders/course/a b.ipynb")
    expect(page.locator("#fgpu-launch-image")).to_have_value("scikit-learn-1.5")
    # The storage folder the path names is ticked, so that the job mounts it.
    expect(page.locator('#fgpu-launch-folder-list [data-folder="course"] input')).to_be_checked()
    expect(page.locator("#fgpu-launch-from")).to_contain_text(
        f"with the image and resources of your session \u201c{other['server_name']}\u201d."
    )
    expect(page.locator("#fgpu-launch-mem-value")).to_have_text("256 MiB")
    # Other arguments stay in the address; only the job's are taken off.
    expect(page).to_have_url(re.compile(rf"{SESSIONS}\?x=1$"))
    page.click("#fgpu-launch-cancel")
    # The dialog's first image when `from` names no session of this user.
    open_with(page, gpu_hub, "job=train.ipynb&from=0123456789abcdef0123456789abcdef")
    expect(page.locator("#fgpu-launch-notebook")).to_have_value("train.ipynb")
    first = page.locator("#fgpu-launch-image option").first.get_attribute("value")
    assert first != "scikit-learn-1.5"
    expect(page.locator("#fgpu-launch-image")).to_have_value(first)
    expect(page.locator("#fgpu-launch-from")).to_have_text(
        "From JupyterLab: run train.ipynb. Check the image and resources and the time limit "
        "below, then press Submit job."
    )
    # Opened by hand, the dialog has no such note.
    page.click("#fgpu-launch-cancel")
    page.click("#fgpu-start")
    expect(page.locator("#fgpu-launch")).to_be_visible()
    expect(page.locator("#fgpu-launch-from")).to_be_hidden()


@pytest.mark.parametrize(
    "job", ["../x.ipynb", "/etc/passwd", "x.py", "work/../../x.ipynb", "", "a\\b.ipynb"]
)
def test_a_job_argument_that_is_not_a_notebook_in_the_home_opens_nothing(
    gpu_hub, page, student, job
):
    log_in(page, gpu_hub, student.name)
    open_with(page, gpu_hub, f"job={quote(job)}")
    page.wait_for_timeout(500)
    expect(page.locator("#fgpu-launch")).to_be_hidden()
    expect(page.locator("#fgpu-error")).to_be_hidden()
    expect(page).to_have_url(re.compile(rf"{SESSIONS}$"))
    # The dialog opened by hand is the usual one, with nothing of the argument in it.
    page.click("#fgpu-start")
    expect(page.locator("#fgpu-launch-title")).to_have_text("Start a session")
    expect(page.locator("#fgpu-launch-notebook")).to_have_value("")
    assert SESSIONS_PAGE in page.url


def test_a_link_to_a_notebook_in_a_folder_shared_with_you_says_whose_it_is(gpu_hub, page, student):
    """Anyone may share a folder with anyone: a link to a notebook in it never ticks that folder
    for the student, and the note names its owner."""
    owner = QueueUser(gpu_hub, f"sharer-{secrets.token_hex(3)}")
    made = owner.call("POST", "folders", json={"name": "handout"})
    assert made.status_code == 201, made.text
    shared = owner.call(
        "POST",
        f"folders/{made.json()['id']}/shares",
        json={"user": student.name, "permission": "ro"},
    )
    assert shared.status_code == 201, shared.text
    log_in(page, gpu_hub, student.name)
    open_with(page, gpu_hub, f"job={quote('folders/handout/x.ipynb')}")
    expect(page.locator("#fgpu-launch")).to_be_visible()
    expect(page.locator("#fgpu-launch-notebook")).to_have_value("folders/handout/x.ipynb")
    note = page.locator("#fgpu-launch-from")
    expect(note).to_contain_text(f"This notebook is {owner.name}\u2019s, in their folder")
    expect(note).to_contain_text(f"tick it only if you trust {owner.name}.")
    box = page.locator('#fgpu-launch-folder-list [data-folder="handout"] input')
    expect(box).to_be_attached()
    expect(box).not_to_be_checked()
    screenshot(page, "jobs-from-jupyterlab-shared-folder")
