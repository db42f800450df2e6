"""queue_service/core/scopes.py: the check of the hub's roles against the scopes the service reads."""

from __future__ import annotations

from queue_service.core.scopes import ADMIN_SCOPE, MANAGE_SCOPE, check_roles, is_filtered_form


def test_the_shipped_kind_of_roles_pass():
    roles = [
        {"name": "user", "scopes": ["self", "access:services!service=queue"]},
        {"name": "instructor", "scopes": [MANAGE_SCOPE], "groups": ["instructors"]},
        {"name": "fgpu-spawner", "scopes": ["access:services!service=queue"]},
        # A role that only assigns members (no scopes of its own) is fine too.
        {"name": "admin", "services": ["test-admin"]},
        {"name": "ops", "scopes": [ADMIN_SCOPE, "read:users!group=course-a"]},
    ]
    found = check_roles(roles)
    assert found.refusals == [] and found.warnings == []


def test_a_filtered_catalog_grant_is_refused_naming_role_and_scope():
    roles = [
        {"name": "instructor", "scopes": [MANAGE_SCOPE]},
        {"name": "course-a", "scopes": ["self", "custom:images:manage!group=course-a"]},
        {"name": "alice-only", "scopes": ["custom:images:manage!user=alice"]},
    ]
    found = check_roles(roles)
    assert len(found.refusals) == 2 and found.warnings == []
    first, second = found.refusals
    assert "role 'course-a'" in first and "'custom:images:manage!group=course-a'" in first
    assert "does not limit catalog rights to a group" in first
    assert "role 'alice-only'" in second and "custom:images:manage!user=alice" in second


def test_the_unfiltered_scope_next_to_a_filtered_one_does_not_hide_it():
    found = check_roles([{"name": "both", "scopes": [MANAGE_SCOPE, MANAGE_SCOPE + "!group=x"]}])
    assert len(found.refusals) == 1


def test_a_filtered_admin_scope_is_a_warning_not_a_refusal():
    found = check_roles([{"name": "course-a-tas", "scopes": ["admin:servers!group=course-a"]}])
    assert found.refusals == []
    (warning,) = found.warnings
    assert "role 'course-a-tas'" in warning and "'admin:servers!group=course-a'" in warning
    assert "plain users" in warning


def test_only_a_filter_of_the_scope_itself_counts():
    assert is_filtered_form("custom:images:manage!group=a", MANAGE_SCOPE)
    assert not is_filtered_form(MANAGE_SCOPE, MANAGE_SCOPE)
    assert not is_filtered_form("custom:images:manage_all!group=a", MANAGE_SCOPE)
    assert not is_filtered_form("admin:servers_x!group=a", ADMIN_SCOPE)
    # "admin:server_state" etc. are other scopes, whatever their filter.
    found = check_roles(
        [{"name": "r", "scopes": ["admin:server_state!group=a", "servers!group=a"]}]
    )
    assert found.refusals == [] and found.warnings == []
