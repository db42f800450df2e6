"""queue_service.store.images: the catalog in the service's DB, on SQLite and a real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from image_catalog import load_catalog, parse_image
from image_catalog.catalog import parse_catalog
from queue_service.store.db import alembic_config, open_database
from queue_service.store.db_upgrade import BackupSettings
from queue_service.store.images import CheckResult, ImageError, ImageStore
from queue_service.store.models import Base

PASSED = CheckResult(True, "jupyterhub-singleuser 5.3.0", datetime(2026, 11, 22, tzinfo=UTC))


@pytest.fixture
def store(db_url):
    db = open_database(db_url)
    yield ImageStore(db)
    db.kw["bind"].dispose()


def image(name="torch-2", **fields):
    return parse_image({"name": name, "image": f"fgpu/{name}:1", **fields})


def test_migration_creates_the_catalog_tables(store):
    tables = set(inspect(store.db.kw["bind"]).get_table_names())
    assert {"sessions", "images", "image_seeds", "alembic_version"} <= tables


def test_add_get_update_delete_round_trip(store):
    added = store.add(
        image(groups=["course-a"], resources={"min": {"cpu": 1, "mem": "1G"}}), check=PASSED
    )
    assert added["groups"] == ["course-a"]
    assert added["resources"]["min"] == {"cpu": 1.0, "mem": 1024**3}
    assert added["check"] == {
        "ok": True,
        "message": "jupyterhub-singleuser 5.3.0",
        "checked_at": "2026-11-22T00:00:00+00:00",
    }
    updated = store.update(image(hidden=True, description="old", groups=[]))
    assert updated["hidden"] is True and updated["groups"] == []
    assert updated["check"]["ok"] is True, "an edit keeps the last check"
    assert store.delete("torch-2")["name"] == "torch-2"
    assert store.all() == []
    with pytest.raises(ImageError) as missing:
        store.get("torch-2")
    assert missing.value.cause == "not_found"


def test_an_image_is_pinned_to_its_first_digest_until_checked_or_repointed(store):
    store.add(image("a"))
    store.add(image("b"))
    assert store.pin_digests({"fgpu/a:1": "sha256:aa"}) == []
    assert store.get("a")["digest"] == "sha256:aa" and store.get("b")["digest"] is None
    # The tag moved: reported, and the pin holds (across a restart of the store too).
    assert store.pin_digests({"fgpu/a:1": "sha256:zz", "fgpu/b:1": "sha256:bb"}) == ["fgpu/a:1"]
    assert ImageStore(store.db).get("a")["digest"] == "sha256:aa"
    assert store.get("b")["digest"] == "sha256:bb"
    # An admin's check, or another reference, pins again at the next look.
    store.record_check("a", PASSED)
    store.update(image("b", image="fgpu/b:2"))
    assert store.get("a")["digest"] is None and store.get("b")["digest"] is None
    store.pin_digests({"fgpu/a:1": "sha256:zz"})
    assert store.get("a")["digest"] == "sha256:zz"


def test_a_duplicate_name_is_409_and_leaves_the_first(store):
    store.add(image(description="first"))
    with pytest.raises(ImageError) as duplicate:
        store.add(image(description="second"))
    assert (
        duplicate.value.cause == "conflict" and "already in the catalog" in duplicate.value.message
    )
    assert [e["description"] for e in store.all()] == ["first"]


def test_visibility_follows_groups_hidden_and_owner(store):
    store.add(image("open"))
    store.add(image("course-a-only", groups=["course-a"]))
    store.add(image("hidden", hidden=True))
    store.add(image("mine", owner="ann"))
    names = lambda user, groups, admin=False: [  # noqa: E731
        e["name"] for e in store.visible_to(user, groups, admin)
    ]
    assert names("ann", ("course-a",)) == ["open", "course-a-only", "mine"]
    assert names("bob", ("course-b",)) == ["open"]
    assert names("root", (), admin=True) == ["open", "course-a-only"]
    assert [e["name"] for e in store.manageable_by("teacher", admin=False)] == [
        "open",
        "course-a-only",
        "hidden",
    ]
    assert len(store.manageable_by("root", admin=True)) == 4


def test_admit_refuses_with_the_right_cause_and_reason(store):
    store.add(image("big", groups=["course-a"], resources={"min": {"cpu": 2}, "max": {"fgpu": 1}}))
    store.add(image("hidden", hidden=True))
    store.add(image("mine", owner="ann"))
    assert store.admit("big", "ann", ("course-a",), size=(2, 1024**3, 1))["image"] == "fgpu/big:1"
    cases = [
        (("nope", "ann", ("course-a",)), None, "invalid", "Unknown image 'nope'"),
        (("big", "bob", ("course-b",)), None, "forbidden", "only for the group(s) course-a"),
        (("hidden", "ann", ()), None, "forbidden", "hidden"),
        (("mine", "bob", ()), None, "forbidden", "private to another user"),
        (("big", "ann", ("course-a",)), (1, 1024**3, 0), "invalid", "needs at least 2 CPU cores"),
        (("big", "ann", ("course-a",)), (2, 1024**3, 2), "invalid", "allows at most 1 fGPU"),
    ]
    for args, size, cause, fragment in cases:
        with pytest.raises(ImageError) as refused:
            store.admit(*args, size=size)
        assert (refused.value.cause, fragment in refused.value.message) == (cause, True), args


ANN_FIRST = "2026-01-05T09:00:00.250000Z"  # as the hub's user model has `created`
ANN_AGAIN = "2026-03-01T12:30:00.000007Z"  # ann deleted, and a new ann created


def test_a_private_image_belongs_to_its_owners_account_not_to_the_name(store):
    store.add(image("mine", owner="ann"), owner_created=ANN_FIRST)
    store.add(image("named", owner="ann"))  # given to the name alone (as before accounts)
    assert store.get("mine")["owner_created"] == "2026-01-05T09:00:00.250000+00:00"
    names = lambda created, admin=False: [  # noqa: E731
        e["name"] for e in store.visible_to("ann", (), admin, created=created)
    ]
    assert names(ANN_FIRST) == ["mine", "named"]
    assert names(ANN_AGAIN) == ["named"]
    assert names(None) == ["named"], "an unknown account is not the owner"
    assert names(ANN_AGAIN, admin=True) == ["named"]
    with pytest.raises(ImageError) as refused:
        store.admit_options({"name": "ann", "created": ANN_AGAIN}, {"image": "mine"})
    assert (
        refused.value.cause == "forbidden" and "earlier account named ann" in refused.value.message
    )
    assert store.admit_options({"name": "ann", "created": ANN_FIRST}, {"image": "mine"})
    # Admins still manage it, and hand it over to the new account.
    assert "mine" in [e["name"] for e in store.manageable_by("root", admin=True)]
    store.update(image("mine", owner="ann", description="kept"))
    assert store.get("mine")["owner_created"].startswith("2026-01-05"), "an edit keeps the owner"
    store.update(image("mine", owner="ann"), owner_created=ANN_AGAIN)
    assert names(ANN_AGAIN) == ["mine", "named"]
    store.update(image("mine"))
    assert store.get("mine")["owner_created"] is None, "a shared image has no owner account"


def catalog(**first_fields):
    return parse_catalog(
        {
            "images": [
                {"name": "py", "image": "fgpu/py:1", "description": "Python", **first_fields},
                {"name": "sk", "image": "fgpu/sk:1"},
            ]
        }
    )


def test_seeding_adds_once_and_keeps_instructor_edits_and_deletions(store):
    assert store.seed(catalog()) == {"added": ["py", "sk"], "updated": []}
    assert store.seed(catalog()) == {"added": [], "updated": []}
    assert store.get("py")["source"] == "seed"
    # An instructor restricts py and deletes sk; the site then edits the file.
    store.update(
        parse_image(
            {"name": "py", "image": "fgpu/py:1", "description": "Python", "groups": ["course-a"]}
        )
    )
    store.delete("sk")
    result = store.seed(catalog(description="Python 3.12", image="fgpu/py:2"))
    assert result == {"added": [], "updated": ["py"]}
    py = store.get("py")
    assert (py["description"], py["image"], py["groups"]) == (
        "Python 3.12",
        "fgpu/py:2",
        ["course-a"],
    ), "the file's changes land, the instructor's restriction stays"
    with pytest.raises(ImageError):
        store.get("sk")


def test_seeding_does_not_overwrite_a_field_the_instructor_changed(store):
    store.seed(catalog())
    edited = {**store.get("py"), "description": "Our course's Python"}
    store.update(parse_image({k: edited[k] for k in ("name", "image", "description")}))
    store.seed(catalog(description="Python, updated upstream"))
    assert store.get("py")["description"] == "Our course's Python"


def test_the_shipped_catalog_seeds(store):
    shipped = load_catalog()
    assert store.seed(shipped)["added"] == shipped.names()
    assert all(e["check"]["ok"] is None for e in store.all()), "seeded images are not yet checked"


def test_migration_0002_upgrades_a_0001_database_keeping_its_queue(db_url, tmp_path):
    command.upgrade(alembic_config(db_url), "0001")
    engine = create_engine(db_url)
    with engine.begin() as connection:
        connection.execute(
            text(
                'INSERT INTO sessions (id, seq, "user", server_name, status, image, cpu, mem,'
                " fgpu, reason, skips) VALUES ('a1', 1, 'ann', '', 'PENDING', 'python-3.11',"
                " 1, 1024, 0, '', 0)"
            )
        )
    # The backup taken before the upgrade goes to the test's folder, not the current one.
    db = open_database(db_url, BackupSettings(folder=tmp_path))
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SELECT id FROM sessions")).scalars().all() == ["a1"]
        ImageStore(db).add(image())
        command.downgrade(alembic_config(db_url), "0001")
        assert "images" not in inspect(engine).get_table_names()
    finally:
        db.kw["bind"].dispose()
        engine.dispose()


def test_the_migrated_schema_is_the_models_schema(db_url):
    """Every column as the models declare it, on SQLite and PostgreSQL alike."""
    db = open_database(db_url)
    try:
        with db.kw["bind"].connect() as connection:
            context = MigrationContext.configure(connection)
            assert compare_metadata(context, Base.metadata) == []
    finally:
        db.kw["bind"].dispose()
