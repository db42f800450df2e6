"""System-wide Jupyter Server settings for fgpu-hub images.

- TensorBoard behind jupyter-server-proxy: started on demand at `<base_url>tensorboard/` the first
  time someone opens it, reading event files from ~/tensorboard-logs.
- jupyter-resource-usage's CPU and memory against the slice, and the session's own status bar item
  (the fGPU slice and the time left, session-status/) fed through JupyterLab's page config.
"""

import contextlib
import json
import os
from pathlib import Path

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

TENSORBOARD_LOGDIR = Path(os.environ.get("HOME") or Path.home()) / "tensorboard-logs"


def _ensure_logdir():
    # The home directory is usually a volume mounted over the image's /home/jovyan, so the folder
    # cannot be baked into the image; create it at start-up, where students will see it.
    # A read-only home is not fatal: TensorBoard still starts and simply shows no runs.
    with contextlib.suppress(OSError):
        TENSORBOARD_LOGDIR.mkdir(parents=True, exist_ok=True)


def _tensorboard_command(port, base_url):
    _ensure_logdir()
    return [
        "tensorboard",
        "--logdir",
        str(TENSORBOARD_LOGDIR),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        # absolute_url below forwards the full path, so TensorBoard must serve under it.
        "--path_prefix",
        f"{base_url}tensorboard",
    ]


_ensure_logdir()

c.ServerProxy.servers = {
    "tensorboard": {
        "command": _tensorboard_command,
        "absolute_url": True,
        # TensorBoard imports a lot before it listens; the default 5 s is too short.
        "timeout": 90,
        "new_browser_tab": True,
        "launcher_entry": {
            "enabled": True,
            "title": "TensorBoard",
            "icon_path": "/etc/jupyter/tensorboard.svg",
        },
    }
}

# jupyter-resource-usage: JupyterLab's status bar shows CPU and memory against the session's slice
# (CPU_LIMIT and MEM_LIMIT, set by the spawner; the memory limit is read by default).
c.ResourceUseDisplay.track_cpu_percent = True
if os.environ.get("CPU_LIMIT"):
    # jupyter-resource-usage 1.x compares the limit with the CPU use in percent of one core
    # (api.py: `cpu_limit - cpu_percent`), so a limit given in cores (0.5) warned (red) at any
    # use: give it in percent of one core too (0.5 core = 50 %).
    c.ResourceUseDisplay.cpu_limit = float(os.environ["CPU_LIMIT"]) * 100


def _session_page_config():
    """What the status bar's session item shows (session-status/index.js), from the spawner's
    environment; nothing outside a hub session (no FGPU_SESSION_ID)."""
    session_id = os.environ.get("FGPU_SESSION_ID")
    if not session_id:
        return {}
    session = {
        "id": session_id,
        "fgpu": float(os.environ.get("FGPU_FGPU") or 0),
        "cpu": float(os.environ.get("FGPU_CPU") or 0),
        "mem": int(os.environ.get("FGPU_MEM") or 0),
        "sessionsUrl": os.environ.get("JUPYTERHUB_BASE_URL", "/") + "services/queue/sessions",
    }
    return {"fgpuSession": json.dumps(session)}


# JupyterLab merges the server's `page_config_data` setting into every page's config. (A plain
# dict: jupyterhub-singleuser reads this setting before the config is merged.)
c.ServerApp.tornado_settings = {"page_config_data": _session_page_config()}
# Where the queue service tells the session its planned end (fgpu_session_end.py).
c.ServerApp.jpserver_extensions.update({"fgpu_session_end": True})
