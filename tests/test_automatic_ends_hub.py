"""Automatic ends against the real hub, queue service, idle culler and containers.

The hubs run the shipped config with one simulated GPU of 1 fGPU, a culler round every 2 s and a
warning lead of 25 s. The culler's test has a hub of its own with a short idle timeout (20 s): an
idle session is culled, its record ends `idle` and the request waiting for its slice runs. The
other tests share a hub whose idle timeout (60 s) outlasts their sessions: a group's
`max_session_lifetime` of 30 s is warned on the Sessions page (Chromium; screenshots in
test-output/browser/ends-*), in the session's home and its terminal, and ends the session with
reason `lifetime`; a malformed value is logged and ignored; a GPU-aware idle policy keeps an idle
session while nobody waits and reclaims it for a waiting request. The culler never takes one of
their sessions first.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from contextlib import contextmanager
from datetime import datetime

import pytest
import requests
import websocket
from playwright.sync_api import expect

from .browser import SESSIONS_PAGE, log_in, rows, screenshot
from .harness import QueueUser, containers_with, running_hub, wait_until

pytestmark = [pytest.mark.hub, pytest.mark.docker]

#: The shared hub's idle timeout: longer than any of its sessions lives.
IDLE_TIMEOUT = 60
#: The culler test's hub: a session idle this long is culled, the wait the test cannot avoid.
CULLER_TIMEOUT = 20
LIFETIME = 30
WARNING_LEAD = 25
SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}


@contextmanager
def hub_with_idle_timeout(workdir, idle_timeout: int):
    env = {
        "FGPU_SIMULATED_GPUS": "1x8GiB",
        "FGPU_UNITS_PER_GPU": "1",
        "FGPU_IDLE_TIMEOUT": str(idle_timeout),
        "FGPU_IDLE_CULL_EVERY": "2",
        "FGPU_END_WARNING": str(WARNING_LEAD),
    }
    # The sessions send the hub no activity reports of their own: the hub's last_activity is
    # then what the hub and the spawner stamp, as for an image without JupyterHub's extension.
    extra = """
c.Spawner.environment = {"JUPYTERHUB_ACTIVITY_INTERVAL": "0"}
c.QueueService.ends_interval = 1
"""
    with running_hub(workdir, env=env, extra_config=extra) as hub:
        yield hub


@pytest.fixture(scope="module")
def ends_hub(tmp_path_factory, docker_engine):
    with hub_with_idle_timeout(tmp_path_factory.mktemp("ends-hub"), IDLE_TIMEOUT) as hub:
        yield hub


@pytest.fixture
def culler_hub(tmp_path, docker_engine):
    """The culler test's own hub, stopped after it: its short timeout would cull other tests'."""
    with hub_with_idle_timeout(tmp_path / "culler-hub", CULLER_TIMEOUT) as hub:
        yield hub


def record(hub, session_id: str) -> dict:
    """The service's record, active or ended, as the spawner reads it (api/grants)."""
    response = requests.get(
        f"{hub.url}/services/queue/api/grants/{session_id}",
        headers={"Authorization": f"token {hub.spawner_token}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()


def start_running(hub, user: QueueUser, options: dict, server: str = "") -> dict:
    response = hub.start_server(user.name, options, server=server)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(user.name, server)
    (session,) = user.wait_for(lambda s: [x["status"] for x in s] == ["RUNNING"])
    return session


def test_the_culler_stops_an_idle_session_its_record_ends_idle_and_the_waiting_request_runs(
    culler_hub,
):
    suffix = secrets.token_hex(3)  # container names are the engine's: other runs share it
    idle, waiting = (
        QueueUser(culler_hub, f"idler-{suffix}"),
        QueueUser(culler_hub, f"waiter-{suffix}"),
    )
    held = start_running(culler_hub, idle, {**SESSION, "fgpu": 1})
    response = culler_hub.start_server(waiting.name, {**SESSION, "fgpu": 1})
    assert response.status_code == 202, response.text
    (pending,) = waiting.wait_for(lambda s: [x["status"] for x in s] == ["PENDING"])
    # The page says when the culler may take it: the hub's last activity + the timeout.
    ends = idle.sessions()[0]["ends"]
    assert ends["why"] == "idle" and ends["text"] == "idle: no activity for 20 s", ends

    ended = wait_until(
        lambda: (r := record(culler_hub, held["id"]))["status"] == "TERMINATED" and r,
        CULLER_TIMEOUT + 60,
        "the idle session culled",
        interval=0.5,
    )
    assert ended["reason"] == "idle: no activity for 20 s, stopped by the idle culler"
    granted = wait_until(
        lambda: record(culler_hub, pending["id"])["status"] in ("SCHEDULED", "RUNNING"),
        30,
        "the waiting request granted",
    )
    assert granted
    culler_hub.wait_ready(waiting.name)
    # It waited about as long as the timeout: its idle time counts from its start, not from its
    # request, or the culler would stop it on arrival.
    (running,) = waiting.wait_for(lambda s: [x["status"] for x in s] == ["RUNNING"])
    started = datetime.fromisoformat(running["started"]).timestamp()

    def idle_end_counts_from_the_start() -> bool:
        (session,) = waiting.sessions() or [{"status": "gone: culled on arrival", "ends": None}]
        assert session["status"] == "RUNNING", session
        ends = session["ends"]
        return ends is not None and datetime.fromisoformat(ends["at"]).timestamp() >= (
            started + CULLER_TIMEOUT - 1
        )

    wait_until(idle_end_counts_from_the_start, 10, "the new session's idle end after its start")
    assert culler_hub.server_model(waiting.name)["ready"]
    assert culler_hub.server_model(idle.name) is None
    assert containers_with({"fgpu.session_id": held["id"]}) == []
    assert f"Culling server {idle.name} (inactive for" in culler_hub.log_text()

    # The figure for the notes: from the culler's decision (its log line) and from the record's
    # end to the waiting request's grant (the same pass).
    culled = culler_log_time(culler_hub.log_text(), idle.name)
    times, grant = culler_hub.stored_times(held["id"]), culler_hub.stored_times(pending["id"])
    print(
        f"FIGURE cull->grant: {grant['scheduled_at'] - culled:.3f} s from the culler's log line;"
        f" {grant['scheduled_at'] - times['ended']:.3f} s from the record's end"
    )
    assert 0 <= grant["scheduled_at"] - times["ended"] < 1


def culler_log_time(log: str, name: str) -> float:
    """When the culler logged its decision about `name` (its log time, local, millisecond)."""
    match = re.search(
        r"\[I (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) IdleCuller .*Culling server "
        + re.escape(name)
        + " ",
        log,
    )
    assert match, "no culler log line"
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()


def open_terminal(hub, user: QueueUser) -> websocket.WebSocket:
    """A Jupyter terminal of the user's session, as JupyterLab opens one."""
    base = f"{hub.url}/user/{user.name}"
    response = user.http.post(f"{base}/api/terminals", timeout=60)
    assert response.status_code == 200, response.text
    name = response.json()["name"]
    token = user.http.headers["Authorization"]
    url = f"ws://127.0.0.1:{hub.url.rsplit(':', 1)[1]}/user/{user.name}/terminals/websocket/{name}"
    return websocket.create_connection(url, header=[f"Authorization: {token}"], timeout=60)


def terminal_output_until(terminal: websocket.WebSocket, text: str, timeout: float) -> str:
    seen, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline and text not in seen:
        try:
            message = json.loads(terminal.recv())
        except websocket.WebSocketException:  # the session ended
            break
        if message[0] == "stdout":
            seen += message[1]
    assert text in seen, f"not in the terminal: {text!r}; it showed {seen!r}"
    return seen


def test_a_lifetime_end_is_warned_on_the_page_and_in_the_session_then_ends_it(ends_hub, pages):
    student = QueueUser(ends_hub, f"life-{secrets.token_hex(3)}")
    group = ends_hub.join_group(student.name, {"max_session_lifetime": f"{LIFETIME}s"})
    session = start_running(ends_hub, student, {**SESSION, "fgpu": 0})
    terminal = open_terminal(ends_hub, student)

    page = pages()
    log_in(page, ends_hub, student.name)
    page.goto(ends_hub.url + SESSIONS_PAGE)
    soon = rows(page, "RUNNING").locator(".fgpu-ends-soon")
    expect(soon).to_contain_text(f"maximum lifetime of {LIFETIME} s ({group})", timeout=30_000)
    expect(soon).to_contain_text("Ends at")
    screenshot(page, "ends-lifetime-warning")

    shown = terminal_output_until(terminal, "fGPU hub: this session ends at", 30)
    assert f"reaches the maximum lifetime of {LIFETIME} s ({group})" in shown
    (container,) = containers_with({"fgpu.session_id": session["id"]})
    note = container.exec_run(["cat", "/home/jovyan/FGPU-WARNING.txt"])
    assert note.exit_code == 0 and b"Save your work now" in note.output, note.output

    ended = wait_until(
        lambda: (r := record(ends_hub, session["id"]))["status"] == "TERMINATED" and r,
        LIFETIME + 30,
        "the session ended at its lifetime",
        interval=0.5,
    )
    assert ended["reason"] == f"lifetime: reached the maximum of {LIFETIME} s (group {group})"
    wait_until(lambda: ends_hub.server_model(student.name) is None, 30, "the hub's server gone")
    expect(rows(page)).to_have_count(0, timeout=30_000)
    screenshot(page, "ends-lifetime-ended")


def test_a_malformed_lifetime_is_logged_and_ignored(ends_hub):
    student = QueueUser(ends_hub, f"bad-{secrets.token_hex(3)}")
    group = ends_hub.join_group(student.name, {"max_session_lifetime": "forever"})
    session = start_running(ends_hub, student, {**SESSION, "fgpu": 0})
    wait_until(
        lambda: (
            f"group {group}: max_session_lifetime 'forever' is not a duration"
            in ends_hub.log_text()
        ),
        30,
        "the malformed value logged",
    )
    # The round that logged it plans the session's end when it is done: the view has none before.
    (view,) = wait_until(
        lambda: (views := student.sessions()) and views[0]["ends"] and views,
        10,
        "the session's planned end",
    )
    # Only the idle end is planned; the session runs on.
    assert view["status"] == "RUNNING" and view["ends"]["why"] == "idle", view
    assert record(ends_hub, session["id"])["status"] == "RUNNING"


def test_an_idle_gpu_session_is_kept_while_nobody_waits_then_reclaimed_for_a_waiting_request(
    ends_hub, pages
):
    suffix = secrets.token_hex(3)
    holder, waiting = QueueUser(ends_hub, f"holder-{suffix}"), QueueUser(ends_hub, f"next-{suffix}")
    policy = {"fgpu_timeout": "10s", "cpu_percent": 50, "reclaim": "when_waiting"}
    group = ends_hub.join_group(holder.name, {"idle_policy": policy})
    page = pages()
    log_in(page, ends_hub, holder.name)
    held = start_running(ends_hub, holder, {**SESSION, "fgpu": 1})

    # Idle past its 10 s, and kept: nobody waits for a GPU slice.
    wait_until(
        lambda: (holder.sessions()[0]["ends"] or {}).get("kept_idle"), 30, "the session kept idle"
    )
    assert record(ends_hub, held["id"])["status"] == "RUNNING"
    page.goto(ends_hub.url + SESSIONS_PAGE)
    line = rows(page, "RUNNING").locator(".fgpu-ends")
    expect(line).to_contain_text("Idle: kept while nobody waits for its resources")
    screenshot(page, "ends-idle-kept")

    response = ends_hub.start_server(waiting.name, {**SESSION, "fgpu": 1})
    assert response.status_code == 202, response.text
    (pending,) = waiting.wait_for(lambda s: [x["status"] for x in s] == ["PENDING"])
    ends = wait_until(
        lambda: (e := holder.sessions()[0]["ends"]) and e["why"] == "reclaimed" and e,
        15,
        "the reclaim announced",
    )
    assert ends["warning"] and ends["text"] == "idle for 10 s while a request waits for its slice"
    soon = rows(page, "RUNNING").locator(".fgpu-ends-soon")
    expect(soon).to_contain_text("Ends at")
    expect(soon).to_contain_text("idle for 10 s while a request waits for its slice")
    screenshot(page, "ends-reclaim-warning")
    (container,) = containers_with({"fgpu.session_id": held["id"]})
    note = wait_until(
        lambda: (
            (n := container.exec_run(["cat", "/home/jovyan/FGPU-WARNING.txt"])).exit_code == 0
            and n.output.decode()
        ),
        10,
        "the warning in the session's home",
    )
    assert "another student waits for its resources" in note

    ended = wait_until(
        lambda: (r := record(ends_hub, held["id"]))["status"] == "TERMINATED" and r,
        WARNING_LEAD + 20,
        "the session reclaimed",
        interval=0.5,
    )
    assert ended["reason"] == (
        f"reclaimed for the queue: idle for 10 s while a request waited (group {group})"
    )
    ends_hub.wait_ready(waiting.name)
    times, grant = ends_hub.stored_times(held["id"]), ends_hub.stored_times(pending["id"])
    print(f"FIGURE reclaim->grant: {grant['scheduled_at'] - times['ended']:.3f} s (record end)")
    assert 0 <= grant["scheduled_at"] - times["ended"] < 1
