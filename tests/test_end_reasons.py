"""The end codes and their labels (queue_service/core/end_reasons.py)."""

from __future__ import annotations

from queue_service.core import end_reasons
from queue_service.core.status import FINAL, Status


def test_every_code_the_issue_names_has_a_label():
    wanted = {
        "user", "admin", "instructor", "idle", "lifetime", "reclaimed", "lost", "error", "pending_timeout",
        "cancelled", "superseded", "hub_stopped", "finished", "failed", "timeout",
    }  # fmt: skip
    assert set(end_reasons.LABELS) == wanted
    assert all(label and label[0].isupper() for label in end_reasons.LABELS.values())
    # Codes fit the column (String(32)).
    assert max(map(len, end_reasons.LABELS)) <= 32


def test_each_final_status_has_a_default_code():
    assert {status: end_reasons.default_for(status) for status in FINAL} == {
        Status.TERMINATED: "user",
        Status.CANCELLED: "cancelled",
        Status.ERROR: "error",
        Status.PENDING_TIMEOUT: "pending_timeout",
    }


def test_labels_of_unknown_and_missing_codes():
    assert end_reasons.label("reclaimed") == "Reclaimed for the queue"
    assert end_reasons.label("from-a-newer-version") == "from-a-newer-version"
    assert end_reasons.label(None) == ""
    assert end_reasons.is_code("idle") and not end_reasons.is_code("bored")
    assert not end_reasons.is_code(None)
