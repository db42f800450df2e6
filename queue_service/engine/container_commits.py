"""A running session's container committed to an image on the engine the service talks to (one
host; in Swarm mode the session's node agent commits it, node_commits.py). What the image is
called, and which of the session's settings it keeps, is the domain's (private_images.py).

The container is not paused (`pause=False`). A pause froze the container's cgroup for the copy,
and a `docker exec` that entered it meanwhile (the service's own end warnings, or an admin's) left
`runc init` stuck in the freezer: the session stayed frozen for good and every engine call about
it hung (docs/source/howto/logs-and-health.md, "A container that does not answer"). The price is
consistency: a file written during the copy may be caught half-written, which the Save dialog
says (finish installs first); the engine's tar refuses a file that changes size mid-copy, so such
a commit fails whole and is tried again (`COMMIT_ATTEMPTS`), then given up (`ChangedWhileCopied`).

Blocking docker-py calls, for as long as a commit takes: the service runs them on an executor of
its own, so that the reconciler and other engine calls go on.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import docker.errors

from queue_service.core.errors import Refusal

from .container_calls import ContainerLocks
from .local_images import has_image
from .registry_images import split_reference
from .session_containers import running_session_containers

#: Commits tried before a session that keeps changing files during the copy is given up.
COMMIT_ATTEMPTS = 3


@dataclass(frozen=True)
class CommitSource:
    """What a commit reads of a session's container: its id, its image's id, the reference it
    was started from, and its whole configuration (`Config`: environment, labels, command...)."""

    id: str
    image_id: str
    image: str
    config: dict


class ChangedWhileCopied(Exception):
    """Every try met a file that changed size during the copy."""


def running_container(client, session_id: str) -> CommitSource | None:
    """The running container of a session, found by its label; None when it has none."""
    container = running_session_containers(client, session_id).get(session_id)
    if container is not None:
        with contextlib.suppress(docker.errors.NotFound):
            container.reload()  # the listing is sparse; a commit needs the whole config
            config = container.attrs["Config"]
            return CommitSource(
                container.id, container.attrs["Image"], config.get("Image", ""), config
            )
    return None


def image_config(client, image_id: str) -> dict:
    """The configuration (`Config`) of an image the engine holds."""
    return client.images.get(image_id).attrs["Config"]


def commit_unpaused(
    client,
    source: CommitSource,
    session_id: str,
    reference: tuple[str, str],
    message: str,
    conf: dict,
    locks: ContainerLocks,
) -> str:
    """Commit the session's container as `reference` (repository, tag) with `conf`; the image's
    id. `locks` keeps the service's own execs out of the container for the time of the copy."""
    repository, tag = reference
    with locks.committing(session_id):
        for _ in range(COMMIT_ATTEMPTS):
            try:
                return client.api.commit(
                    source.id,
                    repository=repository,
                    tag=tag,
                    message=message,
                    author="fgpu-hub",
                    conf=conf,
                    pause=False,
                )["Id"]
            except docker.errors.APIError as e:
                if not _changed_while_copied(e):
                    raise
        raise ChangedWhileCopied()


def _changed_while_copied(error: docker.errors.APIError) -> bool:
    """The engine's tar met a file that changed size ("Error processing tar file ... unexpected
    EOF"): nothing is wrong but the moment."""
    return "tar file" in str(error.explanation or error)


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


def commit_container(client, session_id: str, commit, locks: ContainerLocks) -> dict:
    """Commit the session's container to `commit.reference` (backend.SessionCommit); its
    reference, id and source image.

    The session keeps running, unpaused, and the service's own execs wait for the copy (`locks`,
    container_calls.ContainerLocks): see above. A session that keeps changing files while it is
    copied is refused with a message; nothing is registered. This blocks for as long as the
    commit takes.
    """
    reference = commit.reference
    source = running_container(client, session_id)
    if source is None:
        raise Refusal(f"Session {session_id} has no running container to commit.", "conflict")
    if has_image(client, reference):
        raise Refusal(f"{reference} already exists; choose another tag.", "conflict")
    labels = {**commit.labels, commit.source_label: source.image}
    conf = commit_config(image_config(client, source.image_id), source.config, labels)
    try:
        image_id = commit_unpaused(
            client, source, session_id, split_reference(reference), commit.message, conf, locks
        )
    except ChangedWhileCopied:
        raise Refusal(
            f"The session kept changing files while it was copied ({COMMIT_ATTEMPTS} tries). Let"
            " running installs or writes finish, then save again.",
            "conflict",
        ) from None
    return {"image": reference, "id": image_id, "source_image": source.image}
