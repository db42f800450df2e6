"""What a batch job's container runs: the job, its log, and just enough of a server for the hub.

The spawner hands this file's text to the image's own `python3 -c` (job_command), so every image
runs jobs without installing anything, and the job sees the image's Python and packages. It uses
the standard library alone, and nbformat/nbclient (which every Jupyter image has, through
jupyter_server and nbconvert) for a notebook.

- **The job** (`FGPU_JOB`, image_catalog/job_options.py): a `command`, run by `bash -c` in the
  home folder, or a `notebook`, executed top to bottom with its `parameters` injected after the
  cell tagged `parameters`, as papermill does; the executed copy, outputs and all, is written
  next to it or into `output`, also when a cell fails.
- **The log**: everything the job prints, also kept in `~/jobs/<server>-<time>.log`; the container's
  own output is the same, which the queue service follows live and keeps the end of.
- **The exit code** is the job's (a notebook: 0, or 1 when a cell failed), so the service ends
  the job `finished` or `failed` from the engine's record of it, not from anything said here.
  A missing notebook is 2, at once, with `notebook ~/<path> not found` in the log: the queue
  service refuses one at submission where it can see the home (queue_service/job_files.py), so
  this is what a job meets where it could not (a link on the way, a home on another node).
- **For the hub**: it starts a server and waits until its URL answers, so a small HTTP server
  answers there (nothing but a line saying this is a batch job), and the job starts once the
  spawner says the spawn is over: a GET of `{prefix}api` carrying the server's own API token,
  which the spawner sends after the hub's last look (fgpu_spawner/spawner.py, `release_job`).
  Looks without it never start the job: the hub's and the spawner's checks carry no token, and
  anyone who reaches the port could send as many; and it
  reports activity as a notebook server does while the job runs, so the idle culler leaves a
  working job alone.
"""

import contextlib
import hmac
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from datetime import datetime, timezone  # noqa: UP017 (an image's Python may be older than 3.11)
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

ACTIVITY_EVERY = 60.0
#: The longest the job waits for the spawner's word that the spawn is over (_spawn_is_over):
#: past it the job starts anyway (a hub restarting as it spawned the job never sends it).
HUB_LOOK_WAIT = 60.0
_UTC = timezone.utc  # noqa: UP017 (datetime.UTC is Python 3.11's)
LOG_DIR = "jobs"
_child = None
#: Set once the spawner says the spawn is over (the hub has checked the server's URL, the last
#: step of its spawn): a job that ended before would end a spawn still under way, which the hub
#: reports as a failed start.
_spawn_is_over = threading.Event()


def main() -> None:
    job = json.loads(os.environ["FGPU_JOB"])
    home = os.path.expanduser("~")
    os.chdir(home)
    signal.signal(signal.SIGTERM, _stop_child)
    _serve_readiness()
    threading.Thread(target=_report_activity, daemon=True).start()
    stamp = datetime.now(_UTC).strftime("%Y%m%d-%H%M%S")
    server = os.environ.get("JUPYTERHUB_SERVER_NAME") or "job"
    _spawn_is_over.wait(HUB_LOOK_WAIT)
    os.makedirs(os.path.join(home, LOG_DIR), exist_ok=True)
    log_path = os.path.join(home, LOG_DIR, f"{server}-{stamp}.log")
    with open(log_path, "a", encoding="utf-8") as log:
        say = _sayer(log)
        say(f"[fgpu job] started {stamp} UTC; this log is kept in ~/{LOG_DIR}/{server}-{stamp}.log")
        if "command" in job:
            code = _run_command(job["command"], say)
        else:
            code = _run_notebook(job, stamp, say)
        say(f"[fgpu job] exited with code {code}")
    sys.exit(code)


def _sayer(log):
    def say(line: str) -> None:
        for out in (sys.stdout, log):
            out.write(line if line.endswith("\n") else line + "\n")
            out.flush()

    return say


def _run_command(command: str, say) -> int:
    global _child
    say(f"[fgpu job] command: {command}")
    shell = "bash" if _on_path("bash") else "sh"
    _child = subprocess.Popen(
        [shell, "-c", command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    for raw in iter(_child.stdout.readline, b""):
        say(raw.decode(errors="replace"))
    return _child.wait()


def _run_notebook(job: dict, stamp: str, say) -> int:
    path = job["notebook"]
    if not os.path.isfile(path):
        say(f"[fgpu job] notebook ~/{path} not found: nothing to run")
        return 2
    import nbformat
    from nbclient.exceptions import CellExecutionError

    warnings.filterwarnings("ignore", module="nbformat")  # a cell id missing: it still runs
    notebook = nbformat.read(path, as_version=4)
    _inject_parameters(notebook, job.get("parameters") or {}, nbformat)
    out_path = _output_path(path, job.get("output") or "", stamp)
    cells = len(notebook.cells)
    client = _live_client(notebook, os.path.dirname(path) or ".", say)
    client.on_cell_executed = lambda cell, cell_index, **_: _say_cell(cell_index, cells, say)
    say(
        f"[fgpu job] notebook: ~/{path} ({cells} cells), parameters: {json.dumps(job.get('parameters') or {})}"
    )
    code = 0
    try:
        client.execute()
    except CellExecutionError as e:
        say(str(e))
        code = 1
    finally:
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        nbformat.write(notebook, out_path)
        say(f"[fgpu job] executed copy: ~/{out_path}")
    return code


def _inject_parameters(notebook, parameters: dict, nbformat) -> None:
    """papermill's way: a cell tagged `injected-parameters` right after the one tagged
    `parameters` (or first), so the notebook's defaults are overridden and still readable."""
    if not parameters:
        return
    lines = ["# Parameters"] + [f"{name} = {value!r}" for name, value in parameters.items()]
    cell = nbformat.v4.new_code_cell("\n".join(lines), metadata={"tags": ["injected-parameters"]})
    tagged = [
        i
        for i, c in enumerate(notebook.cells)
        if "parameters" in c.get("metadata", {}).get("tags", [])
    ]
    notebook.cells.insert(tagged[0] + 1 if tagged else 0, cell)


def _output_path(path: str, output: str, stamp: str) -> str:
    folder, name = os.path.split(path)
    stem = name[: -len(".ipynb")] if name.endswith(".ipynb") else name
    return os.path.join(output or folder, f"{stem}-output-{stamp}.ipynb")


def _live_client(notebook, cwd: str, say):
    """An nbclient client that says each piece of a cell's printed output as the kernel sends
    it (as papermill's `--log-output` does), not when the cell ends: a long training cell's
    progress is in the log while it runs. A Python kernel logs only its errors: its start-up
    warnings (TCP without encryption) are not the notebook's and said nothing to its owner."""
    from nbclient import NotebookClient

    class LiveClient(NotebookClient):
        def output(self, outs, msg, display_id, cell_index):
            if msg["msg_type"] == "stream":
                say(msg["content"].get("text", "").rstrip("\n"))
            return super().output(outs, msg, display_id, cell_index)

    python = notebook.metadata.get("kernelspec", {}).get("language", "python") == "python"
    return LiveClient(
        notebook,
        timeout=None,
        # IPKernelApp's own option: another language's kernel would not know it.
        extra_arguments=["--IPKernelApp.log_level=ERROR"] if python else [],
        resources={"metadata": {"path": cwd}},
    )


def _say_cell(index: int, cells: int, say) -> None:
    say(f"[fgpu job] cell {index + 1}/{cells} done")


def _serve_readiness() -> None:
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL") or "http://0.0.0.0:8888/")
    server = ThreadingHTTPServer((url.hostname or "0.0.0.0", url.port or 8888), _Readiness)
    threading.Thread(target=server.serve_forever, daemon=True).start()


class _Readiness(BaseHTTPRequestHandler):
    #: The hub's proxy routes anyone with access to the server here: an idle connection is
    #: dropped after this many seconds, so that none holds a thread (the job's pids) for long.
    timeout = 5

    def do_GET(self) -> None:
        looked = False
        if self.path.split("?")[0].rstrip("/").endswith("/api"):
            body, kind = b'{"version": "fgpu-batch-job"}', "application/json"
            looked = _from_spawner(self.headers.get("Authorization") or "")
        else:
            body, kind = (
                b"This is a batch job: its log is on the hub's Sessions page.\n",
                "text/plain",
            )
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if looked:
            # Only once the answer is out: a job that ends at once would cut it otherwise.
            _spawn_is_over.set()

    def log_message(self, *args) -> None:
        pass  # the job's log is the job's


def _from_spawner(authorization: str) -> bool:
    """Whether a request carries the server's own API token, which only the hub, its spawner
    and this job hold."""
    token = os.environ.get("JUPYTERHUB_API_TOKEN") or ""
    return bool(token) and hmac.compare_digest(authorization.encode(), f"token {token}".encode())


def _report_activity() -> None:
    url, token = os.environ.get("JUPYTERHUB_ACTIVITY_URL"), os.environ.get("JUPYTERHUB_API_TOKEN")
    if not url or not token:
        return
    server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
    while True:
        now = datetime.now(_UTC).isoformat().replace("+00:00", "Z")
        body = json.dumps({"servers": {server: {"last_activity": now}}, "last_activity": now})
        request = urllib.request.Request(
            url,
            data=body.encode(),
            method="POST",
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        )
        # A hub restarting misses a report; the next comes within a minute.
        with contextlib.suppress(OSError):
            urllib.request.urlopen(request, timeout=10).close()
        time.sleep(ACTIVITY_EVERY)


def _stop_child(signum, frame) -> None:
    """`docker stop` (a cancel, the time limit): the job's whole process group goes too."""
    if _child is not None and _child.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(_child.pid, signal.SIGTERM)
    sys.exit(128 + signum)


def _on_path(program: str) -> bool:
    return any(
        os.access(os.path.join(folder, program), os.X_OK)
        for folder in os.environ.get("PATH", "").split(os.pathsep)
    )


if __name__ == "__main__":
    main()
