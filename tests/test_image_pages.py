"""The Images page in Debian's Chromium: the acceptance walk-through of the catalog, on pages alone.

An instructor logs in, opens Images from the hub's navigation bar, adds an image limited to
`course-a`, and hides and shows it; a course-a student then finds it on the spawn form and starts
it, while a course-b student never sees it. Screenshots go to test-output/browser/images-*.
"""

from __future__ import annotations

import re
import secrets

import pytest
from playwright.sync_api import Page, expect

from .browser import SPAWN_TIMEOUT_MS, log_in, screenshot
from .harness import containers_with

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]
SKLEARN_14 = "fgpu/scikit-learn:1.4.2"


def member_of(hub, group: str, prefix: str) -> str:
    name = f"{prefix}-{secrets.token_hex(4)}"
    hub.create_user(name)
    assert hub.request("POST", f"groups/{group}").status_code in (201, 409)
    response = hub.request("POST", f"groups/{group}/users", json={"users": [name]})
    assert response.status_code == 200, response.text
    return name


def open_images(page: Page, hub) -> None:
    page.goto(f"{hub.url}/hub/home")
    page.click("#fgpu-nav-images")
    expect(page.locator("h1", has_text="Images")).to_be_visible()


def fill_new_image(page: Page, name: str, reference: str, groups: str = "") -> None:
    page.click("#fgpu-image-add")
    page.fill("#fgpu-image-name", name)
    page.fill("#fgpu-image-ref", reference)
    page.fill("#fgpu-image-groups", groups)
    page.click("#fgpu-image-submit")


@pytest.fixture
def image_name(hub):
    name = f"lab-{secrets.token_hex(3)}"
    yield name
    admin = member_of(hub, "instructors", "cleanup")
    token = hub.user_token(admin)
    hub.api.delete(
        f"{hub.url}/services/queue/api/images/{name}",
        headers={"Authorization": f"token {token}"},
        timeout=60,
    )


def test_instructor_adds_an_image_for_course_a_and_a_course_a_student_starts_it(
    hub, pages, image_name
):
    instructor = member_of(hub, "instructors", "teacher")
    ann = member_of(hub, "course-a", "ann")
    bob = member_of(hub, "course-b", "bob")

    page = pages()
    log_in(page, hub, instructor)
    open_images(page, hub)
    fill_new_image(page, image_name, SKLEARN_14, groups="course-a")
    row = page.locator(f"tr[data-image='{image_name}']")
    expect(row).to_be_visible(timeout=120_000)
    expect(row.locator(".fgpu-groups")).to_have_text("course-a")
    expect(row).to_contain_text("✓ starts")
    expect(row).to_contain_text("scikit-learn 1.4.2")  # from the image's labels
    screenshot(page, "images-instructor-added")

    # A second image of the same name is refused in the dialog, and nothing changes.
    fill_new_image(page, image_name, SKLEARN_14)
    expect(page.locator("#fgpu-image-error")).to_contain_text("already in the catalog")
    page.click("#fgpu-image-cancel")
    expect(page.locator(f"tr[data-image='{image_name}']")).to_have_count(1)

    row.locator("[data-action=hide]").click()
    expect(row.locator(".fgpu-visibility")).to_have_text("hidden")
    row.locator("[data-action=show]").click()
    expect(row.locator(".fgpu-visibility")).to_have_text("visible")

    student_b = pages()
    log_in(student_b, hub, bob)
    student_b.goto(f"{hub.url}/hub/spawn")
    expect(student_b.locator("#fgpu-image option[value='python-3.11']")).to_be_attached()
    expect(student_b.locator(f"#fgpu-image option[value='{image_name}']")).to_have_count(0)
    open_images(student_b, hub)
    expect(student_b.locator("#fgpu-image-add")).to_have_count(0)
    expect(student_b.locator("tr[data-image='python-3.11']")).to_be_visible()
    expect(student_b.locator(f"tr[data-image='{image_name}']")).to_have_count(0)

    student_a = pages()
    log_in(student_a, hub, ann)
    student_a.goto(f"{hub.url}/hub/spawn")
    student_a.select_option("#fgpu-image", image_name)
    student_a.fill("#fgpu-mem", "1G")
    try:
        student_a.click("#spawn_form button[type=submit]")
        student_a.wait_for_url(re.compile(rf"/user/{ann}/lab"), timeout=SPAWN_TIMEOUT_MS)
        (container,) = containers_with({"fgpu.user": ann})
        assert container.image.tags == [SKLEARN_14]
        version = container.exec_run(
            ["python3", "-c", "import sklearn; print(sklearn.__version__)"]
        )
        assert version.output.decode().strip() == "1.4.2"
        screenshot(student_a, "images-course-a-student-lab")
    finally:
        hub.stop_server(ann)
    assert containers_with({"fgpu.user": bob}) == []
