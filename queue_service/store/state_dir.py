"""What the hub keeps in its state directory (the directory it is started from), and where its two
databases are.

One list serves the config, the backup and the checks, so that a new state file is backed up and
checked the day it is added. The database URLs are read from the environment in one place: the
shipped config, ``fgpu-hub backup``/``restore`` and ``fgpu-hub doctor`` all call these functions,
and a service manager sets the variables once (for example in the systemd unit's environment file).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

HUB_DB_ENV = "FGPU_HUB_DB_URL"
QUEUE_DB_ENV = "FGPU_QUEUE_DB_URL"
#: JupyterHub's own default, and the queue service's: files in the state directory.
DEFAULT_HUB_DB_URL = "sqlite:///jupyterhub.sqlite"
DEFAULT_QUEUE_DB_URL = "sqlite:///fgpu_queue.sqlite"
#: The PostgreSQL driver installed with the hub (psycopg 3); SQLAlchemy's default for a bare
#: ``postgresql://`` is psycopg2, which is not.
POSTGRES_DRIVER = "postgresql+psycopg"


def hub_db_url(environ: Mapping[str, str] = os.environ) -> str:
    """The hub's database (JupyterHub.db_url): FGPU_HUB_DB_URL, or SQLite in the state directory."""
    return with_driver(environ.get(HUB_DB_ENV) or DEFAULT_HUB_DB_URL)


def queue_db_url(environ: Mapping[str, str] = os.environ) -> str:
    """The queue service's database (QueueService.db_url): FGPU_QUEUE_DB_URL, or SQLite in the
    state directory."""
    return with_driver(environ.get(QUEUE_DB_ENV) or DEFAULT_QUEUE_DB_URL)


def db_url_problem(db_url: str, variable: str) -> str | None:
    """What is wrong with `db_url` (read from `variable`), in one line, or None: a SQLite or
    PostgreSQL URL, with a database named."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(db_url)
    except ArgumentError:
        return f"{variable} is not a database URL (e.g. postgresql://user:password@host/db)"
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        return f"{variable} names a {url.get_backend_name()} database: SQLite or PostgreSQL only"
    if not url.database:
        return f"{variable} names no database (e.g. postgresql://user:password@host/db)"
    return None


def with_driver(db_url: str) -> str:
    """`db_url` as SQLAlchemy reads it with the installed drivers: a libpq-style
    ``postgresql://`` (or ``postgres://``) URL gets psycopg 3; any other URL is kept as it is."""
    scheme, sep, rest = db_url.partition("://")
    if sep and scheme in ("postgresql", "postgres"):
        return f"{POSTGRES_DRIVER}://{rest}"
    return db_url


@dataclass(frozen=True)
class StateFile:
    name: str
    what: str
    #: Readable by its owner alone, in the state directory and in a backup.
    secret: bool


#: The small files beside the databases. Without the secrets every login and every session's
#: token is void after a restore; without the deployment id the service no longer recognises (and
#: so cannot adopt) its own running containers.
STATE_FILES = (
    StateFile("jupyterhub_cookie_secret", "the hub's cookie secret", secret=True),
    StateFile("fgpu_queue_cookie_secret", "the queue service's cookie secret", secret=True),
    StateFile("fgpu_node_agent_token", "the node agents' token", secret=True),
    StateFile("fgpu_deployment_id", "which containers are this hub's", secret=False),
    StateFile("fgpu_ssh_host_key", "the SSH service's host key", secret=True),
)


FOLDERS_ROOT_ENV = "FGPU_FOLDERS_ROOT"
#: QueueService.folders_root's default: in the state directory.
DEFAULT_FOLDERS_ROOT = "fgpu-folders"


def folders_root(environ: Mapping[str, str] = os.environ) -> str:
    """Where the storage folders' files are (QueueService.folders_root): FGPU_FOLDERS_ROOT, else
    `.folders` on the Swarm shared storage (so every node binds the same directory), else
    `fgpu-folders` in the state directory. The config and `fgpu-hub backup`/`restore` read it here,
    so the backup reads the folders where the service writes them."""
    if environ.get(FOLDERS_ROOT_ENV):
        return environ[FOLDERS_ROOT_ENV]
    if environ.get("FGPU_SWARM_HOME_ROOT"):
        return os.path.join(environ["FGPU_SWARM_HOME_ROOT"], ".folders")
    return DEFAULT_FOLDERS_ROOT
