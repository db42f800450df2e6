"""The seeds' walk-through as a student meets it, as one story in Chromium on the shared GPU hub
(one simulated 8 GiB GPU of 2 fGPU, as in the seed): log in → launch TensorFlow with the CPU and
memory chosen → the list shows that configuration → a notebook kernel reads the container's cgroup
limits → the web terminal prints the framework's version and `ls` shows the notebook's file → a
0.5 fGPU session whose `nvidia-smi` shows its share → 3 × 1 fGPU: two run, one waits → a Stop asks
first → the waiting one runs by itself → the other TensorFlow version and PyTorch print theirs.
At 800 px wide, with the page's console clean throughout (no uncaught error, error or warning).

Each framework image is checked here as the seeds check it (tests/test_frameworks.py holds the
table and the training cells). The terminal and the kernel are reached as JupyterLab reaches them (terminado's and the kernel's
websockets through the hub's proxy, with the student's token); every other step is the page's.
Screenshots go to test-output/browser/seeds-*.png.
"""

from __future__ import annotations

import json
import re
import secrets

import pytest
import requests
from playwright.sync_api import expect

from .browser import (
    SESSIONS_PAGE,
    SPAWN_TIMEOUT_MS,
    end_with_confirmation,
    launch,
    log_in,
    rows,
    screenshot,
    submit_launch,
)
from .harness import QueueUser, in_kernel, in_terminal
from .test_frameworks import FRAMEWORKS, trained_one_epoch
from .test_jupyter_console import EVERY_PAGE, recording

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

GIB = 1024**3
CGROUP_LIMITS = """
from pathlib import Path
cpu = Path("/sys/fs/cgroup/cpu")
quota, period = (int((cpu / f).read_text()) for f in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
memory = int(Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").read_text())
print("cores", quota / period, "memory", memory)
"""


def server_of(student: QueueUser, status: str, image: str) -> str:
    (session,) = [s for s in student.sessions() if s["status"] == status and s["image"] == image]
    return session["server_name"]


def stop_everything(page) -> None:
    """Each session ended from its row, confirmed in the page's dialog, until none is listed."""
    while rows(page).count():
        row = rows(page).first
        session = row.get_attribute("data-session")
        end_with_confirmation(page, row.locator(".fgpu-stop, .fgpu-cancel"))
        gone = page.locator(f'#fgpu-sessions tbody tr[data-session="{session}"]')
        expect(gone).to_have_count(0, timeout=SPAWN_TIMEOUT_MS)


def a_notebook(hub, name: str, server: str, path: str) -> None:
    """What JupyterLab's "New notebook" does: an empty notebook through the contents API."""
    notebook = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    response = requests.put(
        f"{hub.url}/user/{name}/{server}/api/contents/{path}",
        headers={"Authorization": f"token {hub.user_token(name)}"},
        data=json.dumps({"type": "notebook", "content": notebook}),
        timeout=60,
    )
    assert response.status_code in (200, 201), response.text


def prints_its_version_and_trains(hub, name: str, server: str, image: str) -> None:
    """As the seeds check a framework image: its version printed in the web terminal, and a small
    model trained for one epoch on synthetic data in a notebook kernel."""
    module, version, training = FRAMEWORKS[image]
    command = f"python -c 'import {module}; print(\"version\", {module}.__version__)' 2>/dev/null"
    printed = in_terminal(hub, name, command, server)
    assert f"version {version}" in printed.splitlines(), printed
    trained_one_epoch(in_kernel(hub, name, training, server))


def test_the_seeds_walkthrough_as_a_student(gpu_hub, pages):
    name = f"seed-{secrets.token_hex(3)}"
    student, page = QueueUser(gpu_hub, name), pages()
    # On a laptop's 800 px, where the sessions are cards (the other page tests use 1,400), with
    # the console watched from the login to the end.
    page.set_viewport_size({"width": 800, "height": 900})
    console = recording(page)

    # Log in: the student lands where the work is.
    log_in(page, gpu_hub, name)
    expect(page).to_have_url(f"{gpu_hub.url}{SESSIONS_PAGE}sessions", timeout=30_000)
    screenshot(page, "seeds-01-sessions")

    # TensorFlow with 1 core and 2 GiB; the list shows that configuration.
    launch(page, "tensorflow-2.17-cpu", cpu=1, mem_gib=2, fgpu=0, count=1)
    screenshot(page, "seeds-02-launch-tensorflow")
    submit_launch(page)
    running = rows(page, "RUNNING")
    expect(running).to_have_count(1, timeout=SPAWN_TIMEOUT_MS)
    expect(running).to_contain_text("tensorflow-2.17-cpu")
    expect(running.locator("td", has_text=re.compile(r"^\s*2 GiB\s*$"))).to_have_count(1)
    expect(running.locator("td", has_text=re.compile(r"^\s*1\s*$"))).not_to_have_count(0)
    screenshot(page, "seeds-03-tensorflow-running")
    server = server_of(student, "RUNNING", "tensorflow-2.17-cpu")

    # A notebook reads the limits the container really has; the terminal sees its file.
    limits = in_kernel(gpu_hub, name, CGROUP_LIMITS, server).split()
    assert limits == ["cores", "1.0", "memory", str(2 * GIB)], limits
    a_notebook(gpu_hub, name, server, "seed.ipynb")
    assert "seed.ipynb" in in_terminal(gpu_hub, name, "ls", server).split()
    prints_its_version_and_trains(gpu_hub, name, server, "tensorflow-2.17-cpu")
    stop_everything(page)

    # 0.5 fGPU (of 2 per GPU: a quarter of the 8 GiB GPU): nvidia-smi shows the share.
    launch(page, "python-3.11", cpu=0.5, mem_gib=1, fgpu=0.5, count=1)
    submit_launch(page)
    expect(rows(page, "RUNNING")).to_have_count(1, timeout=SPAWN_TIMEOUT_MS)
    server = server_of(student, "RUNNING", "python-3.11")
    smi = in_terminal(gpu_hub, name, "nvidia-smi", server)
    assert "SIMULATED" in smi and "2048MiB" in smi.replace(" ", ""), smi
    stop_everything(page)

    # 3 × 1 fGPU on 2 fGPU: two run, one waits; a Stop asks first; the waiting one runs.
    launch(page, "python-3.11", cpu=0.25, mem_gib=0.5, fgpu=1, count=3)
    expect(page.locator("#fgpu-launch-warning")).to_contain_text("1 will wait")
    submit_launch(page)
    expect(rows(page, "RUNNING")).to_have_count(2, timeout=SPAWN_TIMEOUT_MS)
    expect(rows(page, "PENDING")).to_have_count(1)
    screenshot(page, "seeds-04-two-run-one-waits")
    rows(page, "RUNNING").first.locator(".fgpu-stop").click()
    confirm = page.locator("#fgpu-confirm")
    expect(confirm).to_be_visible()
    screenshot(page, "seeds-05-stop-asks-first")
    page.click("#fgpu-confirm-go")
    expect(rows(page, "PENDING")).to_have_count(0, timeout=SPAWN_TIMEOUT_MS)
    expect(rows(page, "RUNNING")).to_have_count(2, timeout=SPAWN_TIMEOUT_MS)
    screenshot(page, "seeds-06-the-waiting-one-runs")
    stop_everything(page)

    # The other TensorFlow version and PyTorch, each printing its own and training.
    for image in ("tensorflow-2.15-cpu", "pytorch-2.13-cpu"):
        launch(page, image, cpu=1, mem_gib=2, fgpu=0, count=1)
        submit_launch(page)
        expect(rows(page, "RUNNING")).to_have_count(1, timeout=SPAWN_TIMEOUT_MS)
        prints_its_version_and_trains(gpu_hub, name, server_of(student, "RUNNING", image), image)
        stop_everything(page)
    screenshot(page, "seeds-07-done")
    assert console.problems(EVERY_PAGE) == []
