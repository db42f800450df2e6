"""Quotas from config and from JupyterHub group properties (`fgpu_quota`): parsing and the book."""

from __future__ import annotations

import logging

import pytest

from queue_service.app import QueueService
from queue_service.core import admission, resource_model
from queue_service.quotas import (
    DEFAULT_USER_QUOTA,
    QUOTA_PROPERTY,
    QuotaBook,
    QuotaError,
    active_session_limit,
    parse_quota,
)

GIB = 1024**3


class FakeHub:
    """Stands in for the hub's REST API (HubClient.group), nothing else."""

    def __init__(self, properties: dict[str, dict]):
        self.properties = properties

    async def group(self, name: str) -> dict:
        return {"name": name, "properties": self.properties.get(name, {})}


# -- parse_quota -------------------------------------------------------------------------------


def test_a_full_quota():
    quota = parse_quota(
        {
            "cpu": 8,
            "mem": "16G",
            "fgpu": 2.5,
            "sessions": 4,
            "pending": "3",
            "resource_groups": ["default", "gpu-lab"],
        },
        "group students",
    )
    assert quota == resource_model.Quota(
        max_slots=resource_model.SlotLimits(cpu=8.0, mem=16 * GIB, fgpu=2.5),
        max_sessions=4,
        max_pending=3,
        resource_groups=("default", "gpu-lab"),
    )


def test_no_property_is_no_quota_and_an_empty_one_limits_nothing():
    assert parse_quota(None, "group students") is None
    assert parse_quota({}, "group students") == resource_model.UNLIMITED
    assert parse_quota({"cpu": None, "mem": None}, "x") == resource_model.UNLIMITED


@pytest.mark.parametrize(
    ("mem", "nbytes"),
    [
        ("512M", 512 * 1024**2),
        ("2G", 2 * GIB),
        ("1.5GiB", 3 * GIB // 2),
        ("1GB", GIB),
        ("64k", 64 * 1024),
        (" 3 g ", 3 * GIB),
        (4096, 4096),
        (2 * GIB, 2 * GIB),
    ],
)
def test_memory_sizes_follow_docker(mem, nbytes):
    assert parse_quota({"mem": mem}, "x").max_slots.mem == nbytes


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (["cpu", 2], ["group students", "must be a mapping"]),
        ({"gpus": 1}, ["group students", "unknown quota key(s) gpus"]),
        ({"fgpu": 1, "cores": 2, "disk": 1}, ["unknown quota key(s) cores, disk"]),
        ({"cpu": "lots"}, ["group students", "lots"]),
        ({"fgpu": [1]}, ["group students"]),
        ({"mem": "16 gigs"}, ["group students", "'16 gigs' is not a size", "512M"]),
        ({"mem": 1.5}, ["group students", "not a whole number of bytes"]),
        ({"mem": True}, ["group students", "is not a size"]),
        ({"sessions": "2.5"}, ["group students", "2.5"]),
        ({"pending": "many"}, ["group students", "many"]),
        ({"per_member": {"storage": "1G"}}, ["group students: per_member", "storage"]),
        ({"per_member": 2}, ["group students: per_member", "must be a mapping"]),
        ({"per_member": {"fgpu": -1}}, ["group students: per_member", "-1"]),
    ],
    ids=[
        "list",
        "unknown-key",
        "unknown-keys",
        "cpu-word",
        "fgpu-list",
        "mem-word",
        "mem-fraction",
        "mem-bool",
        "sessions-fraction",
        "pending-word",
        "per-member-storage",
        "per-member-number",
        "per-member-negative",
    ],
)
def test_a_malformed_quota_names_the_group(data, words):
    with pytest.raises(QuotaError) as error:
        parse_quota(data, "group students")
    for word in words:
        assert word in str(error.value), str(error.value)


def test_resource_groups_as_one_string_is_not_split_into_letters():
    try:
        quota = parse_quota({"resource_groups": "gpu-lab"}, "group students")
    except QuotaError:
        return  # refusing it is as good as reading it as one group
    assert quota.resource_groups == ("gpu-lab",)


@pytest.mark.parametrize(
    "data",
    [
        {"cpu": "inf"},
        {"cpu": float("nan")},
        {"fgpu": float("inf")},
        {"fgpu": "nan"},
        {"cpu": -1},
        {"fgpu": -0.5},
        {"mem": -1},
        {"sessions": -1},
        {"pending": -2},
        {"cpu": 10**400},
        {"sessions": float("inf")},
    ],
    ids=lambda data: str(data)[:40],
)
def test_a_limit_that_is_no_amount_is_malformed(data):
    with pytest.raises(QuotaError, match="group students"):
        parse_quota(data, "group students")


async def test_an_infinite_group_quota_does_not_break_admission():
    """What the bug above costs: one group property stops every spawn of the group's members."""
    book = QuotaBook()
    hub = FakeHub({"students": {QUOTA_PROPERTY: {"cpu": "inf"}}})
    await book.refresh({"name": "carol", "groups": ["students"]}, hub)
    request = resource_model.Request("r1", "carol", ("students",), resource_model.Slots(1, GIB, 0))
    node = resource_model.Node("node-1", "default", 4, 8 * GIB)
    assert admission.admission_error(request, [node], book.snapshot()) is None


# -- QuotaBook ---------------------------------------------------------------------------------


def test_the_default_user_quota_is_config():
    book = QuotaBook(user_default={"fgpu": 2, "mem": "8G", "sessions": 3})
    snapshot = book.snapshot()
    assert snapshot.default_user == resource_model.Quota(
        max_slots=resource_model.SlotLimits(fgpu=2.0, mem=8 * GIB), max_sessions=3
    )
    assert snapshot.for_user("anyone") == snapshot.default_user
    assert snapshot.groups == {}
    assert QuotaBook().snapshot().default_user == resource_model.UNLIMITED


def test_a_malformed_default_user_quota_fails_at_start():
    with pytest.raises(QuotaError, match="default user quota: unknown quota key"):
        QuotaBook(user_default={"gpu": 1})


async def test_refresh_records_groups_and_their_quotas():
    book = QuotaBook(user_default={"fgpu": 2, "cpu": 4})
    hub = FakeHub(
        {
            "students": {QUOTA_PROPERTY: {"fgpu": 1, "resource_groups": ["default"]}},
            "gpu-lab": {QUOTA_PROPERTY: {"fgpu": 4, "mem": "32G"}},
            "everyone": {"colour": "blue"},
        }
    )
    await book.refresh({"name": "carol", "groups": ["students", "everyone"]}, hub)
    await book.refresh({"name": "dave", "groups": ["gpu-lab"]}, hub)

    assert book.groups_of("carol") == ("students", "everyone")
    assert book.groups_of("dave") == ("gpu-lab",)
    assert book.groups_of("nobody") == ()
    snapshot = book.snapshot()
    assert set(snapshot.groups) == {"students", "gpu-lab"}  # "everyone" has no quota
    assert snapshot.groups["students"].resource_groups == ("default",)
    assert snapshot.for_group("everyone") == resource_model.UNLIMITED

    # The tightest of the user's own quota and every group's, field by field.
    assert book.user_limit("carol", book.groups_of("carol")) == {
        "cpu": 4.0,
        "mem": None,
        "fgpu": 1.0,
    }
    assert book.user_limit("dave", ("gpu-lab",)) == {"cpu": 4.0, "mem": 32 * GIB, "fgpu": 2.0}
    assert book.user_limit("erin", ()) == {"cpu": 4.0, "mem": None, "fgpu": 2.0}
    assert QuotaBook().user_limit("erin", ("unknown",)) == {"cpu": None, "mem": None, "fgpu": None}


async def test_refresh_follows_the_admins_edits():
    book = QuotaBook()
    hub = FakeHub({"students": {QUOTA_PROPERTY: {"fgpu": 1}}})
    await book.refresh({"name": "carol", "groups": ["students"]}, hub)
    assert book.user_limit("carol", ("students",))["fgpu"] == 1.0

    hub.properties["students"] = {QUOTA_PROPERTY: {"fgpu": 3}}
    await book.refresh({"name": "carol", "groups": ["students"]}, hub)
    assert book.user_limit("carol", ("students",))["fgpu"] == 3.0

    await book.refresh({"name": "carol", "groups": []}, hub)
    assert book.groups_of("carol") == ()


async def test_a_groups_per_member_quota_holds_each_member_on_their_own():
    book = QuotaBook({"sessions": 3, "fgpu": 4})
    hub = FakeHub(
        {
            "cs101": {QUOTA_PROPERTY: {"fgpu": 20, "per_member": {"fgpu": 2, "sessions": 5}}},
            "lab": {QUOTA_PROPERTY: {"per_member": {"cpu": 1}}},
        }
    )
    await book.refresh({"name": "ann", "groups": ["cs101", "lab"]}, hub)
    await book.refresh({"name": "bob", "groups": []}, hub)
    snapshot = book.snapshot()
    ann = snapshot.for_user("ann")
    # The tightest of the site's per-user quota and each group's per_member.
    assert (ann.max_slots.fgpu, ann.max_slots.cpu, ann.max_sessions, ann.max_pending) == (
        2,
        1,
        3,
        None,
    )
    assert snapshot.for_user("bob") == book.user_default
    assert snapshot.for_group("cs101").max_slots.fgpu == 20  # all members together, as before
    assert book.user_limit("ann", ("cs101", "lab"))["fgpu"] == 2
    # The scheduler's admission holds a member to it.
    request = resource_model.Request("r1", "ann", ("cs101", "lab"), resource_model.Slots(1, GIB, 3))
    node = resource_model.Node("node-1", "default", 4, 8 * GIB)
    refusal = admission.admission_error(request, [node], snapshot)
    assert refusal and "your quota" in refusal and "2 fGPU" in refusal, refusal
    # Removed by the admin: ann is held to the site's quota alone again.
    hub.properties.update(cs101={QUOTA_PROPERTY: {"fgpu": 20}}, lab={})
    await book.refresh({"name": "ann", "groups": ["cs101", "lab"]}, hub)
    assert book.snapshot().for_user("ann") == book.user_default


@pytest.mark.parametrize(
    "bad",
    [{"fgpus": 1}, {"fgpu": "one"}, {"mem": "lots"}, "fgpu=1", [1]],
    ids=["unknown-key", "bad-number", "bad-size", "string", "list"],
)
async def test_a_malformed_group_quota_is_logged_and_ignored(bad, caplog):
    log = logging.getLogger("fgpu-test-quotas")
    book = QuotaBook(user_default={"fgpu": 2}, log=log)
    hub = FakeHub(
        {"students": {QUOTA_PROPERTY: {"fgpu": 1}}, "typo": {QUOTA_PROPERTY: bad}},
    )

    with caplog.at_level(logging.ERROR, logger="fgpu-test-quotas"):
        await book.refresh({"name": "carol", "groups": ["students", "typo"]}, hub)

    (message,) = [r.getMessage() for r in caplog.records if r.name == "fgpu-test-quotas"]
    assert message.startswith("Ignoring a malformed quota: group typo:"), message
    assert book.groups_of("carol") == ("students", "typo")
    assert set(book.snapshot().groups) == {"students"}
    assert book.user_limit("carol", ("students", "typo"))["fgpu"] == 1.0


async def test_a_malformed_group_quota_without_a_log_is_still_ignored():
    book = QuotaBook()
    await book.refresh(
        {"name": "carol", "groups": ["typo"]}, FakeHub({"typo": {QUOTA_PROPERTY: 7}})
    )
    assert book.snapshot().groups == {}
    assert book.user_limit("carol", ("typo",)) == {"cpu": None, "mem": None, "fgpu": None}


async def test_a_quota_that_turns_malformed_no_longer_counts():
    book = QuotaBook()
    hub = FakeHub({"students": {QUOTA_PROPERTY: {"fgpu": 1}}})
    await book.refresh({"name": "carol", "groups": ["students"]}, hub)
    hub.properties["students"] = {QUOTA_PROPERTY: {"fgpu": "1 GPU"}}
    await book.refresh({"name": "carol", "groups": ["students"]}, hub)
    assert "students" not in book.snapshot().groups


async def test_the_book_reads_group_budgets_and_members_next_to_the_quota(caplog):
    class HubWithMembers(FakeHub):
        async def group(self, name: str) -> dict:
            return {**await super().group(name), "users": ["carol", "dave"]}

    quota = {"fgpu": 2, "fgpu_hours_per_week": 20, "cpu_hours_per_day": 48}
    hub = HubWithMembers({"students": {QUOTA_PROPERTY: quota}, "typo": {QUOTA_PROPERTY: {}}})
    book = QuotaBook(log=logging.getLogger("test-budgets"))
    await book.refresh({"name": "carol", "groups": ["students"]}, hub)
    # The budget keys leave the quota as it was.
    assert book.snapshot().for_group("students").max_slots.fgpu == 2.0
    assert [(b.figure, b.period, b.limit) for b in book.budgets_of("students")] == [
        ("cpu_hours", "day", 48.0),
        ("fgpu_hours", "week", 20.0),
    ]
    assert book.members_of("students") == ("carol", "dave")

    hub.properties["typo"] = {QUOTA_PROPERTY: {"fgpu_hours_per_week": "lots"}}
    with caplog.at_level(logging.ERROR, logger="test-budgets"):
        await book.refresh({"name": "dave", "groups": ["typo"]}, hub)
    assert book.budgets_of("typo") == ()
    assert "Ignoring a malformed budget: group typo: fgpu_hours_per_week" in caplog.text


# -- the default per-user quota ----------------------------------------------------------------


def test_the_service_gives_every_user_a_quota_by_default():
    assert (
        QueueService().user_quota == DEFAULT_USER_QUOTA == {"sessions": 3, "pending": 2, "fgpu": 4}
    )
    default = QuotaBook(QueueService().user_quota).snapshot().for_user("anyone")
    assert (default.max_sessions, default.max_pending, default.max_slots.fgpu) == (3, 2, 4.0)


@pytest.mark.parametrize(
    ("quota", "limit"),
    [
        ({"sessions": 3, "pending": 2}, 5),
        ({"sessions": "4", "pending": 0, "fgpu": 2}, 4),
        ({"sessions": None, "pending": 2}, 0),
        ({"sessions": 3}, 0),
        ({}, 0),
    ],
)
def test_the_active_session_limit_is_running_plus_waiting(quota, limit):
    assert active_session_limit(quota) == limit


def test_the_active_session_limit_of_a_malformed_quota_is_a_clear_error():
    with pytest.raises(QuotaError, match="user quota: .*'many'"):
        active_session_limit({"sessions": 3, "pending": "many"})
