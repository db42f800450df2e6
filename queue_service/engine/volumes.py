"""Volumes on the engine the service talks to, as the domain reads them (job_files.py looks for a
batch job's notebook in the home volume's directory)."""

from __future__ import annotations

from collections.abc import Callable

import docker.errors


def inspect_volume_with(engine) -> Callable[[str], dict | None]:
    """The engine's inspect answer of a volume, None when there is none. Raises one of
    errors.ENGINE_ERRORS when the engine does not answer."""

    def inspect(name: str) -> dict | None:
        try:
            return engine.api.inspect_volume(name)
        except docker.errors.NotFound:
            return None

    return inspect
