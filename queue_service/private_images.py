"""Session → private image: `POST api/sessions/{id}/image` (admins only; DESIGN.md contract 4).

The running container is committed with `docker commit` to `fgpu-private/<user>:<tag>`. The session
keeps running (the engine pauses it for the moment of the commit). The image then enters the catalog
(`ImageStore`) as `<user>-<tag>`, private to the session's owner: only they see it on the form and
may start it. A commit that cannot be registered is removed again, so nothing half-made remains. What was installed into the
system site is kept; the home folder is a volume (fgpu_spawner/storage.py), and a commit leaves
volumes out, so no notebook or `~/.local` package is baked in.

A commit would also copy the container's configuration into the image, the session's environment
(its hub API token among them) and labels included, and the engine offers no way to drop a key.
`commit_config` therefore resets command, user and working folder to the source image's, and
blanks every variable and label that the session added.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re

import docker
import docker.errors
from tornado import web

from image_catalog import CatalogError, CatalogImage, parse_image

from .apihandlers import APIHandler
from .images import CheckResult, ImageError
from .models import Status, utcnow
from .session_containers import running_session_containers

PRIVATE_REPOSITORY = "fgpu-private"
LABEL_OWNER = "fgpu.private-owner"
LABEL_SOURCE_SESSION = "fgpu.private-from-session"
LABEL_SOURCE_IMAGE = "fgpu.private-from-image"
# Docker's tag grammar.
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# One path component of a repository name.
_COMPONENT_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")


class CommitError(Exception):
    """The commit cannot be done: `message` says why, `status` is its HTTP code."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message = message
        self.status = status


# ---------------------------------------------------------------------------------------------
# Pure helpers.
# ---------------------------------------------------------------------------------------------


def check_tag(tag: object) -> str:
    if not isinstance(tag, str) or not _TAG_RE.match(tag):
        raise CommitError(
            "tag must be 1 to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'.",
            400,
        )
    return tag


def user_component(user: str) -> str:
    """The user's name as a repository path component; distinct users stay distinct.

    Most names (`alice`, `student-1a2b`) are used as they are. Any other (upper case, '@', '_',
    separators Docker refuses) becomes `u_` + a hash: no plain name has a '_', so none clashes;
    the image's owner label keeps the real name.
    """
    if _COMPONENT_RE.match(user) and "_" not in user:
        return user
    return "u_" + hashlib.sha256(user.encode()).hexdigest()[:16]


def private_reference(user: str, tag: str) -> str:
    return f"{PRIVATE_REPOSITORY}/{user_component(user)}:{check_tag(tag)}"


def private_entry(user: str, tag: str, reference: str, source: dict | None) -> CatalogImage:
    """The catalog entry of a committed session: the source image's framework, version and
    resources, owned by `user`, offered to nobody else."""
    source = source or {}
    name = f"{user_component(user)}-{tag}".lower()
    origin = source.get("display_name") or source.get("name") or "session"
    try:
        return parse_image(
            {
                "name": name,
                "display_name": f"{origin} ({user}: {tag})",
                "image": reference,
                "framework": source.get("framework") or "",
                "version": source.get("version") or "",
                "description": f"Private image of {user}, committed from a running session.",
                "gpu": bool(source.get("gpu")),
                "resources": source.get("resources"),
                "owner": user,
            }
        )
    except CatalogError as e:
        raise CommitError(f"The image cannot be registered as {name!r}: {e}", 400) from None


def commit_config(image_config: dict, container_config: dict, labels: dict[str, str]) -> dict:
    """The `conf` of a commit: the source image's command, user and folder, the session's own
    variables and labels blanked (the engine merges the container's in), and `labels` added."""
    image_env = image_config.get("Env") or []
    image_keys = {item.split("=", 1)[0] for item in image_env}
    added = [item.split("=", 1)[0] for item in container_config.get("Env") or []]
    image_labels = image_config.get("Labels") or {}
    blanked = {key: "" for key in (container_config.get("Labels") or {}) if key not in image_labels}
    return {
        "Env": [*image_env, *(f"{key}=" for key in added if key not in image_keys)],
        "Labels": {**image_labels, **blanked, **labels},
        "Cmd": image_config.get("Cmd"),
        "Entrypoint": image_config.get("Entrypoint"),
        "User": image_config.get("User") or "",
        "WorkingDir": image_config.get("WorkingDir") or "",
    }


# ---------------------------------------------------------------------------------------------
# I/O: the Docker engine.
# ---------------------------------------------------------------------------------------------


def session_container(client, session_id: str):
    """The running container of a session, found by its label, or a 409."""
    container = running_session_containers(client, session_id).get(session_id)
    if container is not None:
        with contextlib.suppress(docker.errors.NotFound):
            container.reload()  # the listing is sparse; a commit needs the whole config
            return container
    raise CommitError(f"Session {session_id} has no running container to commit.", 409)


def commit_session(client, session_id: str, user: str, tag: str) -> dict:
    """Commit the session's container to the user's private image; its reference and id."""
    reference = private_reference(user, tag)
    container = session_container(client, session_id)
    try:
        client.images.get(reference)
        raise CommitError(f"{reference} already exists; choose another tag.", 409)
    except docker.errors.ImageNotFound:
        pass
    source = client.images.get(container.attrs["Image"])
    labels = {
        LABEL_OWNER: user,
        LABEL_SOURCE_SESSION: session_id,
        LABEL_SOURCE_IMAGE: container.attrs["Config"].get("Image", ""),
    }
    conf = commit_config(source.attrs["Config"], container.attrs["Config"], labels)
    repository, _, tag = reference.rpartition(":")
    result = client.api.commit(
        container.id,
        repository=repository,
        tag=tag,
        message=f"fGPU hub: session {session_id} of {user}",
        author="fgpu-hub",
        conf=conf,
    )
    return {"image": reference, "id": result["Id"], "source_image": labels[LABEL_SOURCE_IMAGE]}


# ---------------------------------------------------------------------------------------------
# API.
# ---------------------------------------------------------------------------------------------


class SessionImageHandler(APIHandler):
    """POST api/sessions/{id}/image with {"tag": ...}: commit a running session (admins) and
    register the image as private to the session's owner."""

    @web.authenticated
    async def post(self, session_id):
        person = await self.person()
        if not person.get("admin"):
            raise web.HTTPError(403, "Only admins may turn a session into an image.")
        try:
            record = self.manager.get(session_id)
        except KeyError:
            raise web.HTTPError(404, "No such session.") from None
        if record["status"] != Status.RUNNING:
            raise web.HTTPError(
                409,
                f"Session {session_id} is {record['status']}; only a running one can be committed.",
            )
        user = record["user"]
        owner_created = await self.from_hub(self.hub.account_created(user))
        try:
            tag = check_tag(self.body().get("tag"))
            entry = private_entry(user, tag, private_reference(user, tag), self._source(record))
            if self._catalog_has(entry.name):
                raise CommitError(f"The catalog already has an image named {entry.name!r}.", 409)
            committed = await asyncio.to_thread(commit_session, self.docker, session_id, user, tag)
        except CommitError as e:
            raise web.HTTPError(e.status, e.message) from None
        check = CheckResult(True, f"committed from running session {session_id}", utcnow())
        try:
            registered = self.settings["images"].add(
                entry, source="private", check=check, owner_created=owner_created
            )
        except ImageError as e:
            await asyncio.to_thread(self.docker.images.remove, committed["id"], force=True)
            raise web.HTTPError(e.status, e.message) from None
        self.write_json(
            {"session": session_id, "user": user, **committed, "catalog": registered}, 201
        )

    def _source(self, record: dict) -> dict | None:
        try:
            return self.settings["images"].get(record["image"])
        except ImageError:
            return None

    def _catalog_has(self, name: str) -> bool:
        try:
            self.settings["images"].get(name)
        except ImageError:
            return False
        return True

    @property
    def docker(self):
        return self.settings["docker_commits"]


def routes(prefix: str) -> list:
    return [(prefix + r"api/sessions/([0-9a-f]+)/image", SessionImageHandler)]
