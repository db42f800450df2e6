"""Session → private image (docs/source/explanation/contracts.md, contract 4): the commit; `handlers/sessions.py` serves it.

The running container is committed with `docker commit` to `fgpu-private/<user>:<tag>`
(engine/container_commits.py). The session keeps running, unpaused. The image
then enters the catalog (`ImageStore`) as `<user>-<tag>`, private to the session's owner: only they
see it on the form and may start it. A commit that cannot be registered is removed again, so
nothing half-made remains. What was installed into the system site is kept; the home folder is a
volume (fgpu_spawner/storage.py), and a commit leaves volumes out, so no notebook or `~/.local`
package is baked in.

A commit would also copy the container's configuration into the image, the session's environment
(its hub API token among them) and labels included, and the engine offers no way to drop a key.
`commit_config` therefore resets command, user and working folder to the source image's, and
blanks every variable and label that the session added.
"""

from __future__ import annotations

import hashlib
import re

from image_catalog import CatalogError, CatalogImage, parse_image
from queue_service.core.errors import Refusal
from queue_service.engine.backend import SessionCommit
from queue_service.engine.errors import EngineRefusal
from queue_service.engine.local_images import resolved_image
from queue_service.engine.registry_images import split_reference
from queue_service.store.images import ImageError

from .image_check import engine_failed

PRIVATE_REPOSITORY = "fgpu-private"
LABEL_OWNER = "fgpu.private-owner"
LABEL_SOURCE_SESSION = "fgpu.private-from-session"
LABEL_SOURCE_IMAGE = "fgpu.private-from-image"
# Docker's tag grammar.
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# One path component of a repository name.
_COMPONENT_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
# Registries the engine puts in front of a name that has none.
_DEFAULT_REGISTRIES = ("docker.io/", "index.docker.io/")


class CommitError(Refusal):
    """The commit cannot be done: `message` says why, `cause` what kind of refusal."""


# ---------------------------------------------------------------------------------------------
# Pure helpers.
# ---------------------------------------------------------------------------------------------


def repository_of(reference: str) -> str:
    """The repository a reference names, as the engine reads it: without tag or digest, and
    without Docker Hub's implicit registry (`docker.io/x/y` and `x/y` are one repository)."""
    name = split_reference(reference)[0]
    for registry in _DEFAULT_REGISTRIES:
        if name.startswith(registry):
            return name[len(registry) :]
    return name


def in_private_repository(reference: str) -> bool:
    return repository_of(reference).startswith(f"{PRIVATE_REPOSITORY}/")


def check_tag(tag: object) -> str:
    if not isinstance(tag, str) or not _TAG_RE.match(tag):
        raise CommitError(
            "tag must be 1 to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'.",
            "invalid",
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
    # The owner's name prefixes the catalog name once: a tag that already starts with it
    # ("stud1-pkgs" by stud1) is not made "stud1-stud1-pkgs".
    prefix = f"{user_component(user)}-"
    named = tag.lower().startswith(prefix.lower())
    name = (tag if named else prefix + tag).lower()
    origin = source.get("display_name") or source.get("name") or "session"
    try:
        return parse_image(
            {
                "name": name,
                "display_name": f"{origin} ({tag})" if named else f"{origin} ({user}: {tag})",
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
        raise CommitError(f"The image cannot be registered as {name!r}: {e}", "invalid") from None


# ---------------------------------------------------------------------------------------------
# On the engine (engine/local_images.py, engine/container_commits.py).
# ---------------------------------------------------------------------------------------------


def private_image_of(client, reference: str) -> str | None:
    """What makes `reference` a private image, checked on what the engine resolves it to (a tag of
    any spelling, an id, a short id): its owner label or a tag in the private repository. None
    for any other image, and for one the engine does not have (the catalog's check refuses that).
    """
    if in_private_repository(reference):
        return f"in the private repository {PRIVATE_REPOSITORY}/"
    try:
        found = resolved_image(client, reference)
    except EngineRefusal as e:
        raise engine_failed(reference, e) from None
    if found is None:
        return None
    labels, tags = found
    owner = labels.get(LABEL_OWNER)
    if owner:
        return f"the private image of {owner}"
    tags = [tag for tag in tags if in_private_repository(tag)]
    return f"the private image {tags[0]}" if tags else None


def refuse_private_image(client, reference: object) -> None:
    """A forbidding `ImageError` when `reference` is a private image, however it is spelled."""
    if not isinstance(reference, str) or not reference:
        return  # not a reference: the catalog says why
    what = private_image_of(client, reference)
    if what:
        raise ImageError(
            f"{reference} is {what}; only admins list or change private images "
            f"({PRIVATE_REPOSITORY}/...).",
            "forbidden",
        )


def session_commit(session_id: str, user: str, tag: str) -> SessionCommit:
    """What the engine saves session `session_id` of `user` as: the user's private image `tag`,
    labelled with its owner and its session (and by the engine, the image it ran)."""
    return SessionCommit(
        reference=private_reference(user, tag),
        labels={LABEL_OWNER: user, LABEL_SOURCE_SESSION: session_id},
        message=f"fGPU hub: session {session_id} of {user}",
        source_label=LABEL_SOURCE_IMAGE,
    )
