"""The deployment id: which hub a session container belongs to, when hubs share one engine.

It is kept in the hub's state directory, outside the service's DB, so that a DB that is lost or
replaced by an older copy leaves the hub able to recognise (and adopt) its own containers, and two
hubs started from two directories never touch each other's sessions. The hub's config reads it for
the spawner (which labels containers with it) and for the service (which adopts and stops only
containers that carry it).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

DEPLOYMENT_ID_FILE = "fgpu_deployment_id"


def deployment_id(state_dir: str | os.PathLike = ".") -> str:
    """The id kept in `state_dir`, made on first use. Two processes starting at once agree: the
    file appears whole (written aside, then linked), and the loser reads the winner's."""
    path = Path(state_dir) / DEPLOYMENT_ID_FILE
    if not path.exists():
        draft = path.with_name(f".{DEPLOYMENT_ID_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        draft.write_text(secrets.token_hex(8) + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return _read(path)


def _read(path: Path) -> str:
    text = path.read_text().strip()
    if not text:
        raise ValueError(f"{path} is empty; remove it to make a new deployment id")
    return text
