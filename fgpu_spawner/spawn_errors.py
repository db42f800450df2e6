"""The errors a spawn ends with, as the spawn form shows them: the message as it is, with the
status the hub answers (400 for the user's options, 503 when the queue service could not
answer, 500 for the site's configuration)."""

from __future__ import annotations

from jupyterhub.spawner import SpawnException

from .queue_client import QueueError


def spawn_error(message: str, reason: str, status_code: int = 400) -> SpawnException:
    """A SpawnException whose message the spawn form shows as it is, without class or reason."""
    error = SpawnException(message, reason=reason, status_code=status_code)
    error.jupyterhub_message = message
    return error


def unavailable(what: str, reason: str, error: QueueError) -> SpawnException:
    """The queue service could not answer (`what` is "The image catalog is"...): its own
    status, or 503 when it failed itself."""
    return spawn_error(
        f"{what} not available: {error.message}",
        reason=reason,
        status_code=503 if error.status >= 500 else error.status,
    )
