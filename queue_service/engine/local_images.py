"""Images on the engine the service talks to: what a reference resolves to, and removing one.

Blocking docker-py calls; callers run them in a thread. A failed call raises `EngineRefusal`
(errors.py), so that the catalog (image_check.py, private_images.py) words its refusals without
naming docker-py.
"""

from __future__ import annotations

import docker.errors

from .errors import EngineRefusal


class ImageAbsent(LookupError):
    """The engine has no image of that reference."""


def image_labels(client, reference: str) -> dict[str, str]:
    """The labels of the image `reference` names; ImageAbsent when the engine does not have it."""
    try:
        image = client.images.get(reference)
    except docker.errors.ImageNotFound:
        raise ImageAbsent(reference) from None
    except docker.errors.APIError as e:
        raise EngineRefusal(e) from e
    return image.labels or {}


def resolved_image(client, reference: str) -> tuple[dict[str, str], list[str]] | None:
    """The labels and tags of the image the engine resolves `reference` to (a tag of any
    spelling, an id, a short id); None when it has none, or `reference` is no reference at all."""
    try:
        image = client.images.get(reference)
    except docker.errors.APIError as e:
        if e.is_client_error():  # not there, or not a reference at all
            return None
        raise EngineRefusal(e) from e
    return image.labels or {}, image.tags


def has_image(client, reference: str) -> bool:
    """Whether the engine holds an image of that reference."""
    try:
        client.images.get(reference)
    except docker.errors.ImageNotFound:
        return False
    return True


def remove_image(client, image_id: str) -> None:
    """Remove an image, even one a stopped container was made from."""
    client.images.remove(image_id, force=True)
