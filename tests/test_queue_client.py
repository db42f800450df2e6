"""The spawner's reading of the service's records: one typed object, checked at the client."""

from __future__ import annotations

import pytest
from jupyterhub.spawner import SpawnException

from fgpu_spawner import FGPUSpawner
from fgpu_spawner.grant import Grant
from fgpu_spawner.queue_client import QueueError, QueueRecord

SCHEDULED = {
    "id": "ab" * 16,
    "status": "SCHEDULED",
    "version": "SCHEDULED|None|",
    "cpu": 1.0,
    "fgpu": 1.5,
    "position": None,
    "reason": "",
    "grant": {"session_id": "ab" * 16, "node": "n1", "gpus": {"GPU-a": 1.0, "GPU-b": 0.5}},
    "gpu_memory": {"GPU-a": 8 << 30, "GPU-b": 8 << 30},
    "gpu_order": ["GPU-a", "GPU-b"],
    "image_ref": "fgpu/jupyter-base:py3.11",
}


def test_a_scheduled_record_carries_its_grant():
    record = QueueRecord.from_json(SCHEDULED)
    assert record.grant == Grant("ab" * 16, "n1", {"GPU-a": 1.0, "GPU-b": 0.5})
    assert record.gpu_order == ("GPU-a", "GPU-b") and record.gpu_memory["GPU-b"] == 8 << 30
    assert record.image_ref == "fgpu/jupyter-base:py3.11"


def test_a_pending_record_has_no_grant_and_says_where_it_waits():
    pending = {**SCHEDULED, "status": "PENDING", "grant": None, "position": 2, "reason": "busy"}
    record = QueueRecord.from_json(pending)
    assert (record.grant, record.position, record.reason) == (None, 2, "busy")


@pytest.mark.parametrize(
    "broken",
    [{"status": "PENDING"}, {**SCHEDULED, "grant": {"gpus": {}}}, {**SCHEDULED, "fgpu": "lots"}],
)
def test_a_record_that_cannot_be_read_is_a_clear_error(broken):
    with pytest.raises(QueueError) as error:
        QueueRecord.from_json(broken)
    assert error.value.status == 502 and "cannot be read" in error.value.message


def test_there_is_no_spawning_without_the_queue():
    with pytest.raises(SpawnException) as refused:
        FGPUSpawner(queue_url="").queue  # noqa: B018 (the property is what is tested)
    assert "No queue service is configured" in str(refused.value)
