"""queue_service/queue_pass.py's own helpers, pure: no DB, no hub. The pass itself is tested
through the queue manager that runs it (tests/test_queue.py: the incremental pass against the
reference over random changes, and every outcome a request can have)."""

from __future__ import annotations

from queue_service.queue_pass import withheld_note


def test_withheld_nodes_are_named_a_few_at_a_time():
    assert withheld_note({}) == ""
    many = withheld_note({f"n{i}": ["icc"] for i in range(5)})
    assert many.startswith("nodes n0, n1, n2 and 2 more take no sessions")
