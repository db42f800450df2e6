"""The errors a spawn ends with (fgpu_spawner/spawn_errors.py): the message the form shows as it
is, and the status the hub answers."""

from __future__ import annotations

from fgpu_spawner.queue_client import QueueError
from fgpu_spawner.spawn_errors import spawn_error, unavailable


def test_a_spawn_error_shows_its_message_as_it_is_with_its_status():
    error = spawn_error("Pick an image first.", reason="invalid_options")
    assert error.jupyterhub_message == "Pick an image first."
    assert error.status_code == 400 and error.reason == "invalid_options"
    assert spawn_error("x", reason="config", status_code=500).status_code == 500


def test_an_unanswered_read_is_the_services_own_status_or_503_when_it_failed_itself():
    refused = unavailable("The image catalog is", "catalog", QueueError("no such group", 404))
    assert refused.status_code == 404
    assert refused.jupyterhub_message == "The image catalog is not available: no such group"
    failed = unavailable("The presets are", "presets", QueueError("database is locked", 500))
    assert failed.status_code == 503 and failed.reason == "presets"
