"""A course's material by one link (contract 8), against the real hub, a real session and a real
git server: an instructor makes the link, a student follows it in Chromium, lands in the
notebook pulled into their home and edits it; the instructor pushes a change, the student follows
the link again and has both. Who may make a link, and that a made-up or changed link, a bad
argument, a narrow token or a stranger start nothing."""

from __future__ import annotations

import html
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import nbformat
import pytest
from playwright.sync_api import Page, expect

from fgpu_spawner.network import SESSION_NETWORK

from .browser import SPAWN_TIMEOUT_MS, log_in, screenshot
from .harness import QueueUser
from .test_courses_hub import fresh, make_course
from .test_security_handlers import SESSION, narrow_admin_token

pytestmark = [pytest.mark.docker, pytest.mark.hub]

NOTEBOOK = "week1/intro.ipynb"
#: The notebook's cells. The student edits the first, the instructor then changes the third: the
#: cells between and after keep the two changes apart in the file (the kernel's language_info,
#: which JupyterLab adds on save, is written after the last cell), so git merges them.
WEEK_1 = ("x = 1", "# the setup", "print('week 1')", "# the end")
CORRECTED = ("x = 1", "# the setup", "print('week 1, corrected')", "# the end")
PRESET = {"name": "course small", "cpu": 0.5, "mem": "384M", "fgpu": 0}


def notebook(*sources: str) -> str:
    """A notebook of code cells as Jupyter writes it (nbformat's own layout), so that the
    student's save changes only the lines of the cell they edited."""
    model = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(source, id=f"cell-{i}") for i, source in enumerate(sources)
        ],
        metadata={
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}
        },
    )
    return nbformat.writes(model) + "\n"


def git(cwd: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=Tim", "-c", "user.email=tim@example.edu", *args]
    return subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True).stdout


class GitServer:
    """A bare repository served by `git daemon` on the session network's gateway, where session
    containers reach this machine, and the instructor's clone that pushes to it."""

    def __init__(self, root: Path, gateway: str):
        self.root, self.work = root / "served", root / "work"
        self.root.mkdir()
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", "course.git"], cwd=self.root)
        subprocess.run(["git", "clone", "-q", str(self.root / "course.git"), str(self.work)])
        port = _free_port(gateway)
        self.url = f"git://{gateway}:{port}/course.git"
        self.daemon = subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                f"--base-path={self.root}",
                f"--listen={gateway}",
                f"--port={port}",
                str(self.root),
            ]
        )

    def push(self, files: dict[str, str], message: str) -> None:
        for name, text in files.items():
            path = self.work / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "-m", message)
        git(self.work, "push", "-q", "origin", "main")

    def wait_until_serving(self) -> None:
        for _ in range(100):
            done = subprocess.run(["git", "ls-remote", self.url], capture_output=True)
            if done.returncode == 0:
                return
            time.sleep(0.1)
        raise AssertionError(f"git daemon does not serve {self.url}")

    def close(self) -> None:
        self.daemon.terminate()
        self.daemon.wait(timeout=30)


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def git_server(tmp_path_factory, hub, docker_engine):
    network = docker_engine.networks.get(SESSION_NETWORK)
    gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
    server = GitServer(tmp_path_factory.mktemp("git"), gateway)
    try:
        server.push(
            {NOTEBOOK: notebook(*WEEK_1), "README.md": "Hi\n"},
            "Week 1",
        )
        server.wait_until_serving()
        yield server
    finally:
        server.close()


def link_of(user: QueueUser, course: str, **args) -> dict:
    response = user.call("GET", f"courses/{course}/link?{urlencode(args)}")
    assert response.status_code == 200, response.text
    return response.json()


def saved_notebook(page: Page, session_url: str) -> dict:
    """The notebook as it is in the student's home (the server's contents API, as the student)."""
    answer = page.request.get(f"{session_url}api/contents/course/{NOTEBOOK}")
    assert answer.ok, answer.text()
    return answer.json()["content"]


def sources(model: dict) -> list[str]:
    return [cell["source"] for cell in model["cells"]]


@pytest.mark.browser
def test_a_student_follows_the_link_edits_and_gets_the_instructors_change(hub, git_server, page):
    teacher, ann = fresh("tim"), fresh("ann")
    course = make_course(hub, teacher, [ann])
    # The course's group has a preset of its own: the link's session takes it.
    group = hub.request("GET", f"groups/{course}").json()
    properties = {**group["properties"], "fgpu_presets": [PRESET]}
    assert hub.request("PUT", f"groups/{course}/properties", json=properties).status_code == 200

    made = link_of(
        QueueUser(hub, teacher),
        course,
        repo=git_server.url,
        branch="main",
        path=NOTEBOOK,
        app="lab",
    )
    assert made["link"].endswith(made["link_path"]) and made["folder"] == "course"
    assert made["link"].startswith(hub.url)
    assert (made["repo"], made["branch"], made["path"], made["app"]) == (
        git_server.url,
        "main",
        NOTEBOOK,
        "lab",
    )

    log_in(page, hub, ann)
    page.goto(made["link"], timeout=SPAWN_TIMEOUT_MS)
    page.wait_for_url(f"**/lab/tree/course/{NOTEBOOK}", timeout=SPAWN_TIMEOUT_MS)
    (session,) = QueueUser(hub, ann).sessions()
    assert (session["cpu"], session["mem"]) == (0.5, 384 * 2**20), session
    session_url = f"{hub.url}/user/{ann}/{session['server_name']}/"
    assert page.url.startswith(session_url)
    first = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    expect(first).to_have_text("x = 1", timeout=SPAWN_TIMEOUT_MS)

    # The student adds a line to the first cell and saves.
    first.click()
    page.keyboard.press("Control+End")
    page.keyboard.type("\nmine = 2")
    expect(first).to_have_text("x = 1mine = 2")  # in the editor before the save is asked
    page.keyboard.press("Control+s")
    # A save is a round trip to the session's server: on two busy cores it can take seconds.
    expect(page.locator(".jp-mod-dirty")).to_have_count(0, timeout=30_000)
    assert sources(saved_notebook(page, session_url))[0] == "x = 1\nmine = 2"

    # The instructor changes the notebook's last cell and adds a file.
    git_server.push(
        {
            NOTEBOOK: notebook(*CORRECTED),
            "week1/data.csv": "a,b\n1,2\n",
        },
        "A correction and the data",
    )
    page.goto(made["link"], timeout=SPAWN_TIMEOUT_MS)
    page.wait_for_url(f"**/lab/tree/course/{NOTEBOOK}", timeout=SPAWN_TIMEOUT_MS)
    expect(page.locator(".jp-Notebook .jp-Cell .cm-content").nth(2)).to_have_text(
        "print('week 1, corrected')", timeout=SPAWN_TIMEOUT_MS
    )
    screenshot(page, "material-link-after-the-instructors-change")
    assert sources(saved_notebook(page, session_url)) == ["x = 1\nmine = 2", *CORRECTED[1:]]
    data = page.request.get(f"{session_url}api/contents/course/week1/data.csv")
    assert data.ok and data.json()["content"] == "a,b\n1,2\n"
    # Still one session: the second click used the running one.
    assert [s["id"] for s in QueueUser(hub, ann).sessions()] == [session["id"]]


@pytest.mark.browser
def test_on_a_full_cluster_the_link_shows_pending_then_opens_the_file(hub, git_server, page):
    teacher, cat, bob = fresh("tim"), fresh("cat"), fresh("bob")
    course = make_course(hub, teacher, [cat])
    free = QueueUser(hub, "admin").call("GET", "resources").json()["free"]["cpu"]
    # Someone else holds a core; the course's preset asks for more than is left.
    holder = QueueUser(hub, bob)
    response = holder.call("POST", "sessions", json={**SESSION, "cpu": 1})
    assert response.status_code == 201, response.text
    held = response.json()["servers"][0]["session"]["id"]
    holder.wait_for(lambda sessions: sessions[0]["status"] in ("SCHEDULED", "RUNNING"))
    preset = {**PRESET, "name": "most of the cluster", "cpu": free - 0.5}
    group = hub.request("GET", f"groups/{course}").json()
    properties = {**group["properties"], "fgpu_presets": [preset]}
    assert hub.request("PUT", f"groups/{course}/properties", json=properties).status_code == 200
    made = link_of(QueueUser(hub, teacher), course, repo=git_server.url, path=NOTEBOOK)

    log_in(page, hub, cat)
    page.goto(made["link"])
    pending = page.locator("#fgpu-material-pending")
    expect(pending).to_contain_text("PENDING")
    expect(page.locator("#fgpu-material")).to_contain_text(course)
    screenshot(page, "material-link-pending")
    (waiting,) = QueueUser(hub, cat).sessions()
    assert (waiting["status"], waiting["cpu"]) == ("PENDING", free - 0.5), waiting

    # The core is given back: the page, looking again, lands in the file.
    assert holder.call("DELETE", f"sessions/{held}").status_code in (200, 202)
    page.wait_for_url(f"**/lab/tree/course/{NOTEBOOK}", timeout=SPAWN_TIMEOUT_MS)
    expect(page.locator(".jp-Notebook .jp-Cell .cm-content").first).to_have_text(
        "x = 1", timeout=SPAWN_TIMEOUT_MS
    )
    assert [s["id"] for s in QueueUser(hub, cat).sessions()] == [waiting["id"]]


def test_only_the_courses_instructors_and_admins_make_a_link(hub, git_server):
    teacher, ann, other_teacher, bob = fresh("tim"), fresh("ann"), fresh("oli"), fresh("bob")
    course = make_course(hub, teacher, [ann])
    make_course(hub, other_teacher, [bob])
    args = {"repo": git_server.url, "path": NOTEBOOK}
    assert link_of(QueueUser(hub, "admin"), course, **args)["course"] == course
    query = urlencode(args)
    assert QueueUser(hub, ann).call("GET", f"courses/{course}/link?{query}").status_code == 403
    for stranger in (bob, other_teacher, fresh("eve")):
        response = QueueUser(hub, stranger).call("GET", f"courses/{course}/link?{query}")
        assert response.status_code == 404, response.text
    narrow = narrow_admin_token(hub, ["access:services!service=queue"])
    response = narrow.get(f"{hub.url}/services/queue/api/courses/{course}/link?{query}", timeout=60)
    assert response.status_code == 404, response.text


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"repo": "file:///etc/course.git"}, "http://, https://, git://"),
        ({"repo": "https://host/" + "c" * 600}, "longer than 500"),
        ({"branch": "--upload-pack=x"}, "branch must be"),
        ({"path": "../../.bashrc"}, "may not contain .."),
        ({"path": "/etc/passwd"}, "relative"),
        ({"app": "vscode"}, "app must be one of lab, notebook"),
    ],
)
def test_a_bad_link_is_a_400_saying_why(hub, args, says):
    teacher = fresh("tim")
    course = make_course(hub, teacher)
    query = urlencode({"repo": "https://git.example.edu/course.git", **args})
    response = QueueUser(hub, teacher).call("GET", f"courses/{course}/link?{query}")
    assert response.status_code == 400, response.text
    assert says in response.json()["message"]


def open_page(user: QueueUser, path: str):
    return user.http.get(f"{user.hub.url}{path}", allow_redirects=False, timeout=120)


def test_a_made_up_or_changed_link_and_a_stranger_start_nothing(hub, git_server):
    teacher, ann, bob = fresh("tim"), fresh("ann"), fresh("bob")
    course = make_course(hub, teacher, [ann])
    path = link_of(QueueUser(hub, teacher), course, repo=git_server.url, path=NOTEBOOK)["link_path"]
    url = urlsplit(path)
    args = {k: v[0] for k, v in parse_qs(url.query).items()}
    student = QueueUser(hub, ann)
    for changed in (
        {**args, "repo": "git://evil.example/course.git"},
        {**args, "path": "README.md"},
        {**args, "sig": "0" * 32},
        {k: v for k, v in args.items() if k != "sig"},
    ):
        response = open_page(student, f"{url.path}?{urlencode(changed)}")
        assert response.status_code == 403, response.text
        assert "not made by the course's instructors" in html.unescape(response.text)
    response = open_page(student, f"{url.path}?{urlencode({**args, 'app': 'x'})}")
    assert response.status_code == 400, response.text
    # Someone outside the course: no such course, whatever the link.
    assert open_page(QueueUser(hub, bob), path).status_code == 404
    assert student.sessions() == [] and QueueUser(hub, bob).sessions() == []
