"""What a batch job's container runs (fgpu_spawner/job_runner.py), run for real: the very text the
spawner hands to `python3 -c` (job_runner_source.py), with this host's Python, in a temporary home,
as a subprocess. The test plays the spawner and the hub: it looks at the readiness URL twice, as
they do, and the job starts then; it stands in for the hub's activity API too.

Executing a notebook needs a Jupyter kernel, which the test environment has not (nbformat and
nbclient are there, ipykernel is not): here the runner's notebook parts are tested without one
(parameter injection, the executed copy's path, a missing notebook, a notebook whose kernel is
missing), and a notebook executed with its parameters in tests/test_batch_jobs_hub.py, in an image.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
import pytest

from fgpu_spawner import job_runner
from fgpu_spawner.job_runner_source import job_command, job_runner_text

SERVER = "job-0a1b2c"
PREFIX = f"/user/alice/{SERVER}/"
#: The server's own API token, as the hub gives it to the job's container.
TOKEN = "the-servers-own-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, token: str | None = None) -> tuple[int, str, str]:
    headers = {"Authorization": f"token {token}"} if token else {}
    with urllib.request.urlopen(
        urllib.request.Request(url, headers=headers), timeout=30
    ) as response:
        return response.status, response.headers["Content-Type"], response.read().decode()


class Runner:
    """job_runner.py in a subprocess, its home a temporary folder."""

    def __init__(self, home: Path, job: dict, **env):
        self.home = home
        self.token = env.get("JUPYTERHUB_API_TOKEN", TOKEN)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}{PREFIX}"
        self.process = subprocess.Popen(
            [sys.executable, *job_command()[1:]],
            env={
                "PATH": os.environ["PATH"],
                "HOME": str(home),
                "FGPU_JOB": json.dumps(job),
                "JUPYTERHUB_SERVICE_URL": self.base,
                "JUPYTERHUB_SERVER_NAME": SERVER,
                "JUPYTERHUB_API_TOKEN": TOKEN,
                **env,
            },
            cwd="/",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def wait_ready(self, timeout: float = 60) -> str:
        """The answer at the server's own URL once it answers (not the spawner's check)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return get(self.base)[2]
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.05)

    def looked_at(self) -> None:
        """The spawner's check of `{prefix}api`, then the hub's, then the spawner's word that
        the spawn is over (the server's own token): the job may start."""
        for token in (None, None, self.token):
            status, kind, body = get(self.base + "api", token)
            assert (status, kind, json.loads(body)) == (
                200,
                "application/json",
                {"version": "fgpu-batch-job"},
            )

    def finish(self, timeout: float = 90) -> tuple[int, str, str]:
        out, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, out.decode(), err.decode()

    def logs(self) -> list[Path]:
        return sorted((self.home / "jobs").glob("*.log"))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


@pytest.fixture
def run(tmp_path):
    runners = []

    def start(job: dict, **env) -> Runner:
        runner = Runner(tmp_path / "home", job, **env)
        runners.append(runner)
        return runner

    (tmp_path / "home").mkdir()
    yield start
    for runner in runners:
        runner.stop()


def test_the_spawner_runs_this_files_text_with_the_images_python():
    command = job_command()
    assert command[:2] == ["python3", "-c"]
    assert command[2] == job_runner_text() == Path(job_runner.__file__).read_text()


def test_the_runner_is_written_for_an_images_older_python_too():
    """It runs in the image's Python, which may be older than the hub's: its syntax is 3.8's
    (the grammar only; its imports are the standard library's of 3.7 on, and nbformat/nbclient)."""
    import ast

    ast.parse(job_runner_text(), feature_version=(3, 8))


def test_a_command_runs_in_the_home_once_the_hub_has_looked_its_output_logged_and_its_code_kept(
    run,
):
    runner = run({"command": "pwd; echo out; echo err >&2; exit 3", "time_limit": None})
    page = runner.wait_ready()
    assert page == "This is a batch job: its log is on the hub's Sessions page.\n"
    # Answering, but the hub has not looked yet: nothing has run.
    time.sleep(0.5)
    assert not (runner.home / "jobs").exists()
    assert runner.process.poll() is None

    runner.looked_at()
    code, out, err = runner.finish()

    assert code == 3
    lines = out.splitlines()
    (log,) = runner.logs()
    assert log.name.startswith(f"{SERVER}-") and log.name.endswith(".log")
    stamp = log.name[len(SERVER) + 1 : -len(".log")]
    assert lines == [
        f"[fgpu job] started {stamp} UTC; this log is kept in ~/jobs/{log.name}",
        "[fgpu job] command: pwd; echo out; echo err >&2; exit 3",
        str(runner.home),
        "out",
        "err",  # stderr goes to the log too, in order
        "[fgpu job] exited with code 3",
    ]
    # The log file in ~/jobs is the container's output, line for line.
    assert log.read_text().splitlines() == lines
    assert err == ""


def test_a_command_that_succeeds_exits_0_and_a_second_job_gets_its_own_log(run):
    first = run({"command": "echo one", "time_limit": 600.0})
    first.wait_ready()
    first.looked_at()
    assert first.finish()[0] == 0
    time.sleep(1.1)  # the log's name has the second it started
    second = run({"command": "echo two", "time_limit": 600.0})
    second.wait_ready()
    second.looked_at()
    code, out, _ = second.finish()
    assert code == 0
    assert out.splitlines()[-2:] == ["two", "[fgpu job] exited with code 0"]
    assert len(second.logs()) == 2


def test_looks_without_the_servers_token_never_start_the_job(run):
    """The hub's and the spawner's checks, and anyone else who reaches the port (any number of
    looks, a wrong token) never start the job: only the server's own token does."""
    runner = run({"command": "echo ran"})
    runner.wait_ready()
    for _ in range(3):
        get(runner.base + "api")
        get(runner.base + "api?token=x")
        get(runner.base + "api", "not-the-token")
        get(runner.base)
        get(runner.base + "lab", TOKEN)  # the token, but not at `{prefix}api`
    time.sleep(0.5)
    assert not (runner.home / "jobs").exists()
    assert runner.process.poll() is None
    get(runner.base + "api/", TOKEN)  # the spawner's word that the spawn is over
    assert runner.finish()[0] == 0


def test_sigterm_stops_the_whole_process_group_of_the_job(run):
    """`docker stop` (a cancel, a time limit) sends SIGTERM to the runner: the command and what it
    started go too, and the runner exits 128 + 15."""
    runner = run({"command": "sleep 300 & echo $! > bg.pid; echo started; sleep 301"})
    runner.wait_ready()
    runner.looked_at()
    pid_file = runner.home / "bg.pid"
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.05)
    background = int(pid_file.read_text())
    assert alive(background)

    runner.process.send_signal(signal.SIGTERM)
    code, out, _ = runner.finish()

    assert code == 128 + signal.SIGTERM
    assert "started" in out
    assert "[fgpu job] exited" not in out  # stopped, not ended by itself
    deadline = time.monotonic() + 30
    while alive(background):
        assert time.monotonic() < deadline, "the job's background process outlived the stop"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent (this test's runner is not an init)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    state = next(line for line in status.splitlines() if line.startswith("State:"))
    return "Z" not in state.split()[1]


def test_a_running_job_reports_activity_to_the_hub(run):
    """As a notebook server does: the idle culler leaves a working job alone."""
    reports = []

    class Hub(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            reports.append((self.path, self.headers["Authorization"], json.loads(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    hub = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{hub.server_address[1]}/hub/api/users/alice/activity"
        runner = run(
            {"command": "sleep 2"},
            JUPYTERHUB_ACTIVITY_URL=url,
            JUPYTERHUB_API_TOKEN="secret",
        )
        runner.wait_ready()
        deadline = time.monotonic() + 30
        while not reports:
            assert time.monotonic() < deadline, "no activity reported"
            time.sleep(0.05)
        runner.looked_at()
        assert runner.finish()[0] == 0
    finally:
        hub.shutdown()
        hub.server_close()
    path, authorization, body = reports[0]
    assert (path, authorization) == ("/hub/api/users/alice/activity", "token secret")
    now = body["last_activity"]
    assert body == {"servers": {SERVER: {"last_activity": now}}, "last_activity": now}
    assert now.endswith("Z")


def test_a_missing_notebook_ends_the_job_with_code_2_and_says_so(run):
    runner = run({"notebook": "work/gone.ipynb", "parameters": {}, "output": ""})
    runner.wait_ready()
    runner.looked_at()
    code, out, _ = runner.finish()
    assert code == 2
    assert out.splitlines()[-2:] == [
        "[fgpu job] notebook ~/work/gone.ipynb not found: nothing to run",
        "[fgpu job] exited with code 2",
    ]


def test_a_notebook_whose_kernel_is_missing_fails_and_its_copy_is_still_written(run):
    """The image has no kernel for the notebook (here: the test environment has no ipykernel):
    the job fails, and the copy is written all the same."""
    with contextlib.suppress(ImportError):
        import ipykernel  # noqa: F401

        pytest.fail("ipykernel is installed here: execute a real notebook in this test instead")
    runner = run({"notebook": "work/a.ipynb", "parameters": {"n": 2}, "output": "out"})
    runner_home = runner.home
    work = runner_home / "work"
    work.mkdir()
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("print(1)")],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    nbformat.write(notebook, work / "a.ipynb")
    runner.wait_ready()
    runner.looked_at()
    code, out, err = runner.finish(timeout=180)
    assert code != 0
    # Its cells counted with the one injected.
    assert '[fgpu job] notebook: ~/work/a.ipynb (2 cells), parameters: {"n": 2}' in out
    (copy,) = (runner_home / "out").glob("a-output-*.ipynb")
    # Not a cell's failure: the error is on stderr (the container's output), not in ~/jobs's log.
    assert out.splitlines()[-1] == f"[fgpu job] executed copy: ~/out/{copy.name}"
    assert "exited with code" not in out
    written = nbformat.read(copy, as_version=4)
    assert [c.metadata.get("tags") for c in written.cells] == [["injected-parameters"], None]
    assert "kernel" in err.lower()


# --- the runner's notebook helpers, in process ----------------------------------------------------


def notebook_of(*cells) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=list(cells))


def test_parameters_are_injected_right_after_the_cell_tagged_parameters():
    notebook = notebook_of(
        nbformat.v4.new_code_cell("import math"),
        nbformat.v4.new_code_cell("epochs = 1\nlr = 0.1", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("print(epochs * lr)"),
    )
    job_runner._inject_parameters(notebook, {"epochs": 3, "name": "run 'a'", "on": True}, nbformat)
    sources = [cell.source for cell in notebook.cells]
    assert sources[1:3] == [
        "epochs = 1\nlr = 0.1",
        "# Parameters\nepochs = 3\nname = \"run 'a'\"\non = True",
    ]
    assert notebook.cells[2].metadata["tags"] == ["injected-parameters"]
    assert notebook.cells[2].cell_type == "code"
    nbformat.validate(notebook)
    # The injected cell is Python that sets the values given.
    scope: dict = {}
    exec(notebook.cells[2].source, scope)
    assert (scope["epochs"], scope["name"], scope["on"]) == (3, "run 'a'", True)


def test_json_values_become_python_values_none_lists_and_objects_included():
    notebook = notebook_of(nbformat.v4.new_code_cell("x = 1"))
    parameters = {"x": None, "layers": [64, 32], "opts": {"a": 1.5, "b": False}}
    job_runner._inject_parameters(notebook, parameters, nbformat)
    scope: dict = {}
    exec(notebook.cells[0].source, scope)
    assert {k: scope[k] for k in parameters} == parameters


def test_without_a_parameters_cell_they_go_first_and_without_parameters_nothing_is_added():
    notebook = notebook_of(nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_code_cell("x"))
    job_runner._inject_parameters(notebook, {}, nbformat)
    assert len(notebook.cells) == 2
    job_runner._inject_parameters(notebook, {"x": 1}, nbformat)
    assert [c.cell_type for c in notebook.cells] == ["code", "markdown", "code"]
    assert notebook.cells[0].source == "# Parameters\nx = 1"


def test_only_the_first_cell_tagged_parameters_counts():
    tagged = {"tags": ["setup", "parameters"]}
    notebook = notebook_of(
        nbformat.v4.new_code_cell("a = 1", metadata=tagged),
        nbformat.v4.new_code_cell("b = 2", metadata={"tags": ["parameters"]}),
    )
    job_runner._inject_parameters(notebook, {"a": 5}, nbformat)
    assert [c.source for c in notebook.cells] == ["a = 1", "# Parameters\na = 5", "b = 2"]


@pytest.mark.parametrize(
    "path, output, expected",
    [
        ("train.ipynb", "", "train-output-20261127-020304.ipynb"),
        ("work/x/train.ipynb", "", "work/x/train-output-20261127-020304.ipynb"),
        ("work/train.ipynb", "results", "results/train-output-20261127-020304.ipynb"),
        ("folders/course/train.ipynb", "out/runs", "out/runs/train-output-20261127-020304.ipynb"),
    ],
)
def test_the_executed_copy_goes_next_to_the_notebook_or_into_output(path, output, expected):
    assert job_runner._output_path(path, output, "20261127-020304") == expected


def test_the_readiness_answers_only_get_and_counts_only_api_paths(tmp_path, monkeypatch):
    """The handler in process: `{prefix}api` (with or without a slash or a query) is the hub's
    look, and with the server's token the spawner's release; anything else is the plain page."""
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", TOKEN)
    job_runner._spawn_is_over.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), job_runner._Readiness)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}{PREFIX}"
    try:
        assert get(base + "api/")[1] == "application/json"
        assert get(base + "apis", TOKEN)[1] == "text/plain"
        assert get(base + "api?x=1")[1] == "application/json"
        assert not job_runner._spawn_is_over.is_set()
        assert get(base + "api?x=1", TOKEN)[1] == "application/json"
        # Set just after the answer is written: a moment after the client has it.
        assert job_runner._spawn_is_over.wait(10)
        request = urllib.request.Request(base + "api", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 501
    finally:
        server.shutdown()
        server.server_close()
        job_runner._spawn_is_over.clear()


def test_a_job_that_ends_at_once_still_answers_the_hubs_look_in_full(run):
    """The hub's look at `{prefix}api` is the last step of its spawn: a cut answer (the runner
    exiting while it writes it) is a failed start to the hub. A job that has nothing to run ends
    within microseconds of that look; its answer must be whole all the same."""
    for _ in range(20):
        runner = run({"notebook": "gone.ipynb", "parameters": {}, "output": ""})
        runner.wait_ready()
        runner.looked_at()
        assert runner.finish()[0] == 2
