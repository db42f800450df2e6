"""System-wide Jupyter Server settings for fgpu-hub images: TensorBoard behind jupyter-server-proxy.

TensorBoard is started on demand at `<base_url>tensorboard/` the first time someone opens it, and
reads event files from ~/tensorboard-logs.
"""

import contextlib
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
