"""The base handler's pure parts: the cause → status table and the scope checks."""

from __future__ import annotations

from typing import get_args

from queue_service.core.admission import RefusalCause
from queue_service.core.errors import Cause
from queue_service.handlers.base import STATUS_OF_CAUSE, filtered_grant, scope_holds


def test_every_cause_has_one_status_and_only_refusals_are_there():
    assert set(STATUS_OF_CAUSE) == set(get_args(Cause))
    assert all(400 <= status < 600 for status in STATUS_OF_CAUSE.values())


def test_the_schedulers_refusals_are_causes_the_table_knows():
    assert set(get_args(RefusalCause)) <= set(STATUS_OF_CAUSE)


def test_only_the_scope_itself_counts_not_a_filtered_part():
    scopes = ["access:services!service=queue", "custom:images:manage!group=course-a"]
    assert not scope_holds(scopes, "custom:images:manage")
    assert filtered_grant(scopes, "custom:images:manage") == "custom:images:manage!group=course-a"
    assert scope_holds(["admin:servers"], "admin:servers")
    assert filtered_grant(["admin:servers"], "admin:servers") is None
    # A longer scope that merely starts the same way is not a filter of it.
    assert filtered_grant(["admin:servers_x"], "admin:servers") is None
