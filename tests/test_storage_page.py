"""The Storage page in Debian's Chromium, on the shared hub, on pages alone: an instructor makes a
course folder, uploads a small notebook and a file larger than one upload chunk (8 MiB: chunks and
the progress bar), and shares the folder read-only with a group; a student of the group finds it
under "Shared with me", downloads the notebook, has no upload control there, and makes and fills
a folder of their own; the delete dialog says what is inside; the admin's everyone's view, where
the admin hands a folder to another owner; a file sent in parallel chunks, one cut and sent again,
and a failed replacement that leaves the old file whole.
Screenshots go to test-output/browser/storage-*."""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import pytest
import requests
from playwright.sync_api import Page, expect

from queue_service.handlers.folders import CHUNK_BYTES

from .browser import log_in, screenshot
from .harness import QueueUser

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

STORAGE = "/services/queue/storage"
NOTEBOOK = b'{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}\n'


def open_storage(page: Page, hub) -> None:
    """Through the hub's navigation bar, as a student finds it."""
    page.goto(f"{hub.url}/hub/home")
    page.click("#fgpu-nav-storage")
    expect(page.locator("h1", has_text="Storage")).to_be_visible()


def folder_row(page: Page, table: str, name: str):
    return page.locator(f"#fgpu-{table} tr[data-folder='{name}']")


def make_folder(page: Page, name: str) -> None:
    page.fill("#fgpu-create-name", name)
    page.click("#fgpu-create")
    expect(folder_row(page, "mine", name)).to_be_visible()


def folder_id(page: Page) -> str:
    """The open folder's id, from the location's hash (#/ID/path)."""
    return page.evaluate("location.hash").split("/")[1]


def upload(page: Page, *paths: Path) -> None:
    page.set_input_files("#fgpu-upload-input", [str(p) for p in paths])


def test_a_course_folder_shared_read_only_with_a_group(hub, pages, tmp_path):
    teacher = f"teach-{secrets.token_hex(3)}"
    student = f"stud-{secrets.token_hex(3)}"
    hub.create_user(student)
    group = hub.join_group(student, {"fgpu_quota": {"storage": "1G"}})
    course = f"course {secrets.token_hex(2)}"
    notebook = tmp_path / "lab1.ipynb"
    notebook.write_bytes(NOTEBOOK)
    big = tmp_path / "dataset.bin"
    big.write_bytes(secrets.token_bytes(CHUNK_BYTES + 3 * 1024 * 1024))  # two chunks: 8 + 3 MiB

    page = pages()
    log_in(page, hub, teacher)
    open_storage(page, hub)
    expect(page.locator("#fgpu-mine-empty")).to_contain_text("No folders yet")
    expect(page.locator("#fgpu-shared-empty")).to_be_visible()
    expect(page.locator("#fgpu-quota")).to_have_text(
        "No storage quota: your folders may grow as long as the disk has room."
    )
    screenshot(page, "storage-empty")

    # A name with '/' is refused inline, in the API's words.
    page.fill("#fgpu-create-name", "a/b")
    page.click("#fgpu-create")
    expect(page.locator("#fgpu-create-error")).to_be_visible()
    expect(page.locator("#fgpu-create-error")).not_to_be_empty()
    make_folder(page, course)
    expect(page.locator("#fgpu-create-error")).to_be_hidden()

    folder_row(page, "mine", course).locator("[data-action=open]").click()
    expect(page.locator("#fgpu-browser-title")).to_have_text(course)
    expect(page.locator("#fgpu-entries-empty")).to_contain_text("This folder is empty")

    # The big file goes in two chunks; the progress bar shows bytes of the total and a percent.
    page.evaluate(
        """() => { window.fgpuSeen = [];
        new MutationObserver(() => window.fgpuSeen.push(
            document.getElementById('fgpu-upload-text').textContent))
          .observe(document.getElementById('fgpu-upload-text'), {childList: true}); }"""
    )
    upload(page, notebook, big)
    expect(page.locator("#fgpu-upload")).to_be_visible()
    expect(page.locator("#fgpu-upload-cancel")).to_be_visible()
    expect(page.locator("#fgpu-done")).to_contain_text("Uploaded 2 files (11 MiB)", timeout=120_000)
    expect(page.locator("#fgpu-upload")).to_be_hidden()
    seen = page.evaluate("window.fgpuSeen")
    assert any(re.search(r"dataset\.bin \(2 of 2\): 8 MiB of 11 MiB \(\d+%\)", s) for s in seen), (
        seen
    )
    assert any(s.endswith("11 MiB of 11 MiB (100%)") for s in seen), seen
    entries = page.locator("#fgpu-entries tbody tr")
    expect(entries).to_have_count(2)
    expect(page.locator("tr[data-entry='dataset.bin'] .fgpu-size")).to_have_text("11 MiB")

    # A subfolder, listed first.
    page.click("#fgpu-mkdir")
    page.fill("#fgpu-name-input", "solutions")
    page.click("#fgpu-name-submit")
    expect(entries.first).to_have_attribute("data-entry", "solutions")
    screenshot(page, "storage-browser-instructor")

    # Cancel an upload: nothing half-made stays.
    held = []  # the first chunk is held on its way, so that Cancel comes mid-upload
    page.route("**/files/again.bin?offset=*", lambda route: held.append(route))
    upload(page, big.rename(tmp_path / "again.bin"))
    expect(page.locator("#fgpu-upload-text")).to_contain_text("again.bin")
    page.click("#fgpu-upload-cancel")
    page.unroute("**/files/again.bin?offset=*")
    expect(page.locator("#fgpu-done")).to_contain_text("Upload cancelled")
    expect(page.locator("tr[data-entry='again.bin']")).to_have_count(0)

    # Share read-only with the group.
    page.click("#fgpu-back")
    row = folder_row(page, "mine", course)
    expect(row.locator(".fgpu-files")).to_have_text("2")
    expect(row.locator(".fgpu-size")).to_have_text("11 MiB")
    row.locator("[data-action=share]").click()
    page.select_option("#fgpu-share-kind", "group")
    # A group the hub lacks is listed like any other: the page tells a student nothing of who
    # exists (only an admin is told); such a share opens nothing, and Stop sharing removes it.
    ghost = "no-such-group-" + secrets.token_hex(2)
    page.fill("#fgpu-share-name", ghost)
    page.click("#fgpu-share-submit")
    ghost_row = page.locator(f"#fgpu-share-list li[data-share='group {ghost}']")
    expect(ghost_row).to_contain_text("read-only")
    expect(page.locator("#fgpu-share-error")).to_be_hidden()
    ghost_row.locator("[data-action=unshare]").click()
    expect(ghost_row).to_have_count(0)
    page.fill("#fgpu-share-name", group)
    page.click("#fgpu-share-submit")
    expect(page.locator(f"#fgpu-share-list li[data-share='group {group}']")).to_contain_text(
        "read-only"
    )
    screenshot(page, "storage-share-dialog")
    page.click("#fgpu-share-close")
    expect(row.locator(".fgpu-shares")).to_have_text(f"group {group} (read-only)")
    screenshot(page, "storage-instructor")

    # The student: the folder under "Shared with me", read-only.
    other = pages()
    log_in(other, hub, student)
    open_storage(other, hub)
    expect(other.locator("#fgpu-mine-empty")).to_contain_text("No folders yet")
    # The group's storage quota, and how full it is (nothing of the student's yet).
    expect(other.locator(f"#fgpu-quota [data-group='{group}']")).to_have_text(
        f"Group {group}'s folders (all its members'): 0 B of 1 GiB used."
    )
    shared = folder_row(other, "shared", course)
    expect(shared.locator(".fgpu-owner")).to_have_text(teacher)
    expect(shared.locator(".fgpu-access")).to_have_text("read-only")
    expect(shared.locator(".fgpu-size")).to_have_text("11 MiB")
    # An automount folder is marked, and the mark explained.
    make_folder(other, ".local")
    expect(folder_row(other, "mine", ".local")).to_contain_text(
        "automount" + "Mounted in every session at ~/.local."
    )
    screenshot(other, "storage-student")
    shared.locator("[data-action=open]").click()
    expect(other.locator("#fgpu-readonly")).to_be_visible()
    expect(other.locator("#fgpu-write-controls")).to_be_hidden()
    expect(other.locator("#fgpu-entries [data-action=delete]")).to_have_count(0)
    with other.expect_download() as download:
        other.click("tr[data-entry='lab1.ipynb'] [data-action=download]")
    assert Path(download.value.path()).read_bytes() == NOTEBOOK
    assert download.value.suggested_filename == "lab1.ipynb"
    screenshot(other, "storage-student-shared")
    # A subfolder, and the path back to the folder.
    other.click("tr[data-entry='solutions'] a")
    expect(other.locator("#fgpu-breadcrumb")).to_be_visible()
    expect(other.locator("#fgpu-breadcrumb .active")).to_have_text("solutions")
    expect(other.locator("#fgpu-entries-empty")).to_have_text("This subfolder is empty.")
    other.locator("#fgpu-breadcrumb a", has_text=course).click()
    expect(other.locator("tr[data-entry='lab1.ipynb']")).to_be_visible()
    expect(other.locator("#fgpu-breadcrumb")).to_be_hidden()

    # Their own folder, which they write.
    other.click("#fgpu-back")
    make_folder(other, "my work")
    folder_row(other, "mine", "my work").locator("[data-action=open]").click()
    expect(other.locator("#fgpu-write-controls")).to_be_visible()
    upload(other, notebook)
    expect(other.locator("tr[data-entry='lab1.ipynb']")).to_be_visible()
    # A link planted in the folder (from a session, say) is shown as one, never followed.
    mine = folder_id(other)
    (hub.workdir / "fgpu-folders" / mine / "etc").symlink_to("/etc")
    other.reload()
    expect(other.locator("tr[data-entry='etc']")).to_contain_text("etc link (not followed)")
    expect(other.locator("tr[data-entry='etc'] a")).to_have_count(0)
    screenshot(other, "storage-student-own")
    other.click("#fgpu-back")

    # The delete dialog says what is inside, and nothing goes until confirmed.
    page.reload()
    folder_row(page, "mine", course).locator("[data-action=delete]").click()
    dialog = page.locator("#fgpu-confirm")
    expect(dialog).to_contain_text("2 files, 11 MiB will be removed")
    expect(dialog).to_contain_text("kept for 7 days by the admins")
    screenshot(page, "storage-delete-dialog")
    page.click("#fgpu-confirm-keep")
    expect(folder_row(page, "mine", course)).to_be_visible()

    # The admin's everyone's view, with the owner column.
    admin = pages()
    log_in(admin, hub, "admin")
    open_storage(admin, hub)
    admin.check("#fgpu-storage-all")
    everyone = admin.locator(f"#fgpu-all tr[data-owner='{teacher}'][data-folder='{course}']")
    expect(everyone.locator(".fgpu-owner")).to_have_text(teacher)
    expect(admin.locator(f"#fgpu-all tr[data-owner='{student}']")).to_have_count(
        2
    )  # .local, my work
    expect(admin.locator("#fgpu-mine-section")).to_be_hidden()
    screenshot(admin, "storage-admin-everyone")

    # The admin hands the student's folder to the instructor: a name the hub does not know is
    # refused in the dialog, with the API's message, and nothing changes.
    work = admin.locator(f"#fgpu-all tr[data-owner='{student}'][data-folder='my work']")
    work_id = work.get_attribute("data-id")
    work.locator("[data-action=owner]").click()
    expect(admin.locator("#fgpu-name-title")).to_have_text("Change the owner of “my work”")
    nobody = f"nobody-{secrets.token_hex(3)}"
    admin.fill("#fgpu-name-input", nobody)
    admin.click("#fgpu-name-submit")
    expect(admin.locator("#fgpu-name-error")).to_have_text(f"The hub has no user '{nobody}'.")
    expect(admin.locator("#fgpu-name-dialog")).to_be_visible()
    screenshot(admin, "storage-admin-owner-refused")
    admin.fill("#fgpu-name-input", teacher)
    admin.click("#fgpu-name-submit")
    expect(admin.locator("#fgpu-name-dialog")).to_be_hidden()
    given = admin.locator(f"#fgpu-all tr[data-id='{work_id}']")
    expect(given).to_have_attribute("data-owner", teacher)
    expect(given.locator(".fgpu-owner")).to_have_text(teacher)
    expect(admin.locator("#fgpu-done")).to_have_text(
        f"“my work” now belongs to {teacher} (it was {student}'s)."
    )
    screenshot(admin, "storage-admin-owner-changed")
    other.reload()
    expect(folder_row(other, "mine", "my work")).to_have_count(0)

    # The instructor deletes it; the student's list no longer has it.
    folder_row(page, "mine", course).locator("[data-action=delete]").click()
    page.click("#fgpu-confirm-go")
    expect(folder_row(page, "mine", course)).to_have_count(0)
    expect(page.locator("#fgpu-done")).to_contain_text("deleted")
    other.reload()
    expect(other.locator("#fgpu-shared-empty")).to_be_visible()


def test_the_page_refuses_a_logged_out_visitor_and_is_in_the_nav(hub, page):
    anonymous = requests.get(f"{hub.url}{STORAGE}", allow_redirects=False, timeout=30)
    assert anonymous.status_code == 302
    page.goto(f"{hub.url}{STORAGE}")
    expect(page).to_have_url(re.compile(r"/hub/login"))
    expect(page.locator("#username_input")).to_be_visible()

    name = f"nav-{secrets.token_hex(3)}"
    QueueUser(hub, name)
    log_in(page, hub, name)
    page.goto(f"{hub.url}/hub/home")
    nav = page.locator("#fgpu-nav-storage")
    expect(nav).to_have_attribute("href", STORAGE)
    # Next to Sessions, in the order of the bar.
    order = page.eval_on_selector_all(
        ".navbar-nav a[id^=fgpu-nav-]", "links => links.map(a => a.id)"
    )
    assert order[order.index("fgpu-nav-sessions") + 1] == "fgpu-nav-storage", order


def test_a_full_storage_quota_says_what_it_stops(hub, page):
    name = f"full-{secrets.token_hex(3)}"
    hub.create_user(name)
    group = hub.join_group(name, {"fgpu_quota": {"storage": "8K"}})
    owner = QueueUser(hub, name)
    made = owner.call("POST", "folders", json={"name": "results"})
    assert made.status_code == 201, made.text
    url = f"folders/{made.json()['id']}/files/run.log?offset=0"
    octets = {"Content-Type": "application/octet-stream"}
    put = owner.call("PUT", url, data=b"x" * 8192, headers=octets)
    assert put.status_code == 201, put.text
    log_in(page, hub, name)
    open_storage(page, hub)
    line = page.locator(f"#fgpu-quota [data-group='{group}']")
    expect(line).to_have_text(
        re.compile(rf"^Group {group}'s folders \(all its members'\): .* of 8 KiB used \(full\)\.$")
    )
    expect(line).to_have_class(re.compile("text-danger"))
    expect(page.locator("#fgpu-quota")).to_contain_text(
        "Full: uploads and new folders are refused, and your own folders are mounted read-only in"
        " the sessions you launch next, until you remove files."
    )
    # And so it is: a new folder is refused, in the service's words.
    page.fill("#fgpu-create-name", "more")
    page.click("#fgpu-create")
    expect(page.locator("#fgpu-create-error")).to_have_text(
        re.compile(rf"^The folders of group {group} hold .+ of its storage quota of 8 KiB; remove")
    )
    screenshot(page, "storage-quota-full")


def test_a_file_goes_in_parallel_chunks_and_a_cut_chunk_is_sent_again(hub, page, tmp_path):
    """Three chunks, the last two at once; the first try of one is cut (as a site's proxy cuts a
    long request) and sent again. A failed upload leaves a file it replaces whole, and no part
    file."""
    name = f"par-{secrets.token_hex(3)}"
    owner = QueueUser(hub, name)
    made = owner.call("POST", "folders", json={"name": "data"})
    assert made.status_code == 201, made.text
    folder = made.json()
    big = tmp_path / "big.bin"
    data = secrets.token_bytes(2 * CHUNK_BYTES + 5)
    big.write_bytes(data)
    log_in(page, hub, name)
    open_storage(page, hub)
    folder_row(page, "mine", "data").locator("[data-action=open]").click()
    sent = []

    def cut_once(route):
        sent.append(route.request.url)
        if sent.count(route.request.url) == 1:
            route.abort("connectionreset")
        else:
            route.continue_()

    page.route(f"**/files/big.bin?offset={CHUNK_BYTES}&upload=*", cut_once)
    upload(page, big)
    expect(page.locator("#fgpu-done")).to_contain_text("Uploaded big.bin", timeout=120_000)
    assert len(sent) == 2  # cut, then sent again
    url = f"folders/{folder['id']}/files/big.bin"
    assert owner.call("GET", url).content == data
    listing = owner.call("GET", f"folders/{folder['id']}/files/").json()["entries"]
    assert [e["name"] for e in listing] == ["big.bin"]

    # Replaced, but a chunk refused: the old file stays whole, the part file goes.
    page.unroute(f"**/files/big.bin?offset={CHUNK_BYTES}&upload=*")
    page.route(
        f"**/files/big.bin?offset={2 * CHUNK_BYTES}&upload=*",
        lambda route: route.fulfill(
            status=403, content_type="application/json", body='{"message": "refused here"}'
        ),
    )
    big.write_bytes(secrets.token_bytes(len(data)))
    upload(page, big)
    page.click("#fgpu-confirm-go")  # "Replace big.bin?"
    expect(page.locator("#fgpu-error")).to_contain_text(
        "Upload failed: refused here", timeout=60_000
    )
    assert owner.call("GET", url).content == data

    def only_the_file():
        entries = owner.call("GET", f"folders/{folder['id']}/files/").json()["entries"]
        return [e["name"] for e in entries] == ["big.bin"]

    # The part file is gone before the folder is listed again, and the reload keeps the error.
    expect(page.locator("#fgpu-upload")).to_be_hidden()
    assert only_the_file()
    page.wait_for_load_state("networkidle")
    expect(page.locator("#fgpu-entries tr[data-entry]")).to_have_count(1)
    expect(page.locator("#fgpu-error")).to_have_text(
        "Upload failed: refused here The “big.bin” already there is unchanged."
    )
    screenshot(page, "storage-upload-refused-halfway")
