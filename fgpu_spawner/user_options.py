"""The spawner's default `apply_user_options` hook: the form's or REST body's options, checked
against the images, presets and limits this user has (request.py), become the spawn's
`ResourceRequest`, its image and its limits."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from image_catalog.job_options import parse_job, start_after_of
from image_catalog.launch_options import gives_no_slots

from .request import InvalidRequest, parse_request
from .spawn_errors import spawn_error

if TYPE_CHECKING:
    from .spawner import FGPUSpawner


def _reads_presets(user_options: object) -> bool:
    """Whether parsing these options reads the user's presets: one is named, or no slot is
    given, so the smallest may be the default (launch_options.with_defaults)."""
    if not isinstance(user_options, dict):
        return False
    return bool(user_options.get("preset")) or gives_no_slots(user_options)


async def apply_resource_options(spawner: FGPUSpawner, user_options: dict) -> None:
    """The default `apply_user_options` hook: validate against the images this user may start,
    then remember the request. An image others may use but this user may not is a 403."""
    catalog = await spawner.user_catalog()
    name = (user_options or {}).get("image") if isinstance(user_options, dict) else None
    if isinstance(name, str) and name.strip() and name not in catalog.names():
        await spawner.refuse_image(name, catalog)
    presets = await spawner.user_presets() if _reads_presets(user_options) else []
    try:
        request = parse_request(
            user_options, spawner.request_limits, catalog, presets, server_name=spawner.name
        )
    except InvalidRequest as e:
        raise spawn_error(str(e), reason="invalid_options") from None
    spawner.resource_request = request
    # The hub reads the start's timeout after this hook: a job may wait in the queue for hours,
    # and a deferred one (`start_after`) first until its time.
    spawner.start_timeout = (
        int(spawner.job_start_timeout + _deferred_for(request.job))  # an Integer trait
        if request.batch
        else spawner._interactive_start_timeout
    )
    spawner.image = request.image
    spawner.cpu_limit = request.cpu
    spawner.mem_limit = request.mem


def _deferred_for(job: str | None) -> int:
    """Whole seconds until a job's `start_after`, rounded up (0 for none, or one that has come)."""
    start_after = start_after_of(parse_job(job))
    if start_after is None:
        return 0
    return max(0, math.ceil((start_after - datetime.now(UTC)).total_seconds()))
