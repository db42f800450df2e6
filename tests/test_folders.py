"""folders.py with folder_store on real databases (SQLite and PostgreSQL) and a real disk: who
sees, changes and shares a folder, what a share allows, and that nothing is half-made."""

from __future__ import annotations

import os

import pytest

from queue_service.core.errors import Refusal
from queue_service.folders import Folders
from queue_service.store.accounts import Account
from queue_service.store.db import open_database
from queue_service.store.folder_files import TRASH, FolderFiles
from queue_service.store.folders import FolderStore, Reader

ANN = Account("ann", "20261101T000000000000Z")
BOB = Account("bob", "20261102T000000000000Z")
NEW_ANN = Account("ann", "20261125T000000000000Z")  # ann deleted and created again


@pytest.fixture
def folders(db_url, tmp_path):
    return Folders(FolderStore(open_database(db_url)), FolderFiles(tmp_path / "folders"))


def reader(account: Account, *groups: str, admin: bool = False) -> Reader:
    return Reader(account, frozenset(groups), admin)


def refused(cause: str, call, *args):
    with pytest.raises(Refusal) as caught:
        call(*args)
    assert caught.value.cause == cause, caught.value.message
    return caught.value.message


def test_a_folder_is_its_owners_and_nobody_elses_until_shared(folders):
    made = folders.create(reader(ANN), "data")
    assert made["own"] and made["permission"] == "rw" and made["shares"] == []
    assert os.path.isdir(folders.files.source(made["id"]))
    assert [f["name"] for f in folders.visible(reader(ANN), everyone=False)] == ["data"]
    assert folders.visible(reader(BOB), everyone=False) == []
    # Bob cannot tell it exists: every door is a 404.
    refused("not_found", folders.listing, reader(BOB), made["id"], "")
    refused("not_found", folders.rename, reader(BOB), made["id"], "mine")
    refused("not_found", folders.remove, reader(BOB), made["id"])
    # Asking for everyone's needs admin powers, not the flag alone.
    assert folders.visible(reader(BOB), everyone=True) == []
    assert [f["owner"] for f in folders.visible(reader(BOB, admin=True), everyone=True)] == ["ann"]


def test_a_name_is_taken_once_per_owner_and_a_refused_one_leaves_nothing(folders, tmp_path):
    folders.create(reader(ANN), "data")
    before = sorted(os.listdir(tmp_path / "folders"))
    assert "already" in refused("conflict", folders.create, reader(ANN), "data")
    assert "no '/'" in refused("invalid", folders.create, reader(ANN), "a/b")
    after = [n for n in sorted(os.listdir(tmp_path / "folders")) if n != TRASH]
    assert after == before
    assert folders.create(reader(BOB), "data")["owner"] == "bob"  # another owner's name is free


def test_a_group_share_is_read_only_for_students_and_read_write_for_instructors(folders):
    course = folders.create(reader(ANN), "course")
    folders.share(reader(ANN), course["id"], {"group": "ml101"}, "ro")
    folders.share(reader(ANN), course["id"], {"group": "instructors"}, "rw")
    folders.write(reader(ANN), course["id"], "lab1.ipynb", b"{}", 0)
    student, teacher = reader(BOB, "ml101"), reader(Account("tess", "t"), "ml101", "instructors")
    (seen,) = folders.visible(student, everyone=False)
    assert (seen["owner"], seen["permission"], seen["own"]) == ("ann", "ro", False)
    assert seen["shares"] is None  # the list of shares is the owner's
    assert seen["writers"] == ["ann", "group instructors"]
    assert [e["name"] for e in folders.listing(student, course["id"], "")["entries"]] == [
        "lab1.ipynb"
    ]
    assert "read-only" in refused("forbidden", folders.write, student, course["id"], "x", b"", 0)
    refused("forbidden", folders.remove_path, student, course["id"], "lab1.ipynb")
    refused("forbidden", folders.make_directory, student, course["id"], "new")
    folders.write(teacher, course["id"], "lab2.ipynb", b"{}", 0)  # the widest share wins
    # A share lets one use a folder, not change it.
    assert "owner" in refused("forbidden", folders.rename, teacher, course["id"], "x")
    assert "owner" in refused(
        "forbidden", folders.share, teacher, course["id"], {"group": "all"}, "rw"
    )


def test_sharing_again_changes_the_permission_and_taking_it_back_ends_it(folders):
    data = folders.create(reader(ANN), "data")
    share, new = folders.share(reader(ANN), data["id"], {"user": "bob", "account": BOB.key}, "ro")
    assert new
    again, new = folders.share(reader(ANN), data["id"], {"user": "bob", "account": BOB.key}, "rw")
    assert (again["id"], again["permission"], new) == (share["id"], "rw", False)
    assert folders.visible(reader(BOB), everyone=False)[0]["permission"] == "rw"
    folders.unshare(reader(ANN), data["id"], share["id"])
    assert folders.visible(reader(BOB), everyone=False) == []
    refused("not_found", folders.unshare, reader(ANN), data["id"], share["id"])
    assert "read-only" in refused(
        "invalid", folders.share, reader(ANN), data["id"], {"group": "g"}, "write"
    )


def test_a_share_ends_with_the_account_it_was_given_to(folders):
    data = folders.create(reader(ANN), "data")
    folders.share(reader(ANN), data["id"], {"user": "bob", "account": BOB.key}, "ro")
    later_bob = Account("bob", "20261126T000000000000Z")
    assert folders.visible(reader(later_bob), everyone=False) == []
    assert folders.store.end_shares_of(BOB) == 1
    assert folders.visible(reader(BOB), everyone=False) == []


def test_a_new_account_of_a_deleted_owners_name_owns_none_of_the_old_folders(folders):
    old = folders.create(reader(ANN), "thesis")
    assert folders.visible(reader(NEW_ANN), everyone=False) == []
    refused("not_found", folders.listing, reader(NEW_ANN), old["id"], "")
    assert folders.create(reader(NEW_ANN), "thesis")["id"] != old["id"]
    # An admin hands the old folder over, under a name the new account does not use.
    folders.rename(reader(BOB, admin=True), old["id"], "thesis-2025")
    given = folders.give(old["id"], NEW_ANN)
    assert given["own"] and given["owner"] == "ann"


def test_a_removed_folder_is_gone_for_everyone_and_kept_in_the_trash(folders, tmp_path):
    data = folders.create(reader(ANN), "data")
    folders.share(reader(ANN), data["id"], {"group": "g"}, "ro")
    folders.write(reader(ANN), data["id"], "keep.txt", b"1", 0)
    folders.remove(reader(ANN), data["id"])
    assert folders.visible(reader(ANN), everyone=False) == []
    assert folders.visible(reader(BOB, "g"), everyone=False) == []
    refused("not_found", folders.listing, reader(ANN), data["id"], "")
    (kept,) = os.listdir(tmp_path / "folders" / TRASH)
    assert kept.startswith(data["id"])
    assert folders.create(reader(ANN), "data")["id"] != data["id"]  # the name is free again


def test_a_write_measures_the_folder(folders):
    data = folders.create(reader(ANN), "data")
    folders.write(reader(ANN), data["id"], "blob", b"x" * 50_000, 0)
    (seen,) = folders.visible(reader(ANN), everyone=False)
    assert seen["files"] == 1 and seen["size_bytes"] >= 50_000 and seen["modified"]


def test_folders_are_found_by_id_or_name_own_names_first(folders):
    mine = folders.create(reader(BOB), "data")
    theirs = folders.create(reader(ANN), "data")
    folders.share(reader(ANN), theirs["id"], {"user": "bob", "account": BOB.key}, "ro")
    assert [f["id"] for f in folders.store.named(["data"], reader(BOB))] == [mine["id"]]
    assert [f["id"] for f in folders.store.named([theirs["id"]], reader(BOB))] == [theirs["id"]]
    assert "No folder 'nope'" in refused("not_found", folders.store.named, ["nope"], reader(BOB))


def test_a_session_mounts_what_it_names_and_its_owners_automount_folders(folders):
    course = folders.create(reader(ANN), "course")
    folders.share(reader(ANN), course["id"], {"group": "ml101"}, "ro")
    work, cache = folders.create(reader(BOB), "work"), folders.create(reader(BOB), ".cache")
    folders.create(reader(ANN), ".local")  # ann's automount folder is not bob's
    mounts = folders.mounts(reader(BOB, "ml101"), ["course", work["id"]])
    assert [(m["path"], m["read_only"], m["id"]) for m in mounts] == [
        ("folders/course", True, course["id"]),
        ("folders/work", False, work["id"]),
        (".cache", False, cache["id"]),
    ]
    assert mounts[0]["source"] == folders.files.source(course["id"])
    assert [m["path"] for m in folders.mounts(reader(BOB), [])] == [".cache"]


def test_a_shared_automount_folder_is_its_owners_automount_and_a_plain_share_for_others(folders):
    theirs = folders.create(reader(ANN), ".cache")
    folders.share(reader(ANN), theirs["id"], {"user": "bob", "account": BOB.key}, "ro")
    mine = folders.create(reader(BOB), ".cache")
    (seen,) = [f for f in folders.visible(reader(BOB), False) if f["id"] == theirs["id"]]
    assert not seen["own"] and not seen["automount"]
    # Not mounted unless chosen; chosen, beside bob's own at ~/folders/.cache, read-only.
    assert [m["id"] for m in folders.mounts(reader(BOB), [])] == [mine["id"]]
    mounts = folders.mounts(reader(BOB), [theirs["id"]])
    assert [(m["path"], m["read_only"], m["id"]) for m in mounts] == [
        ("folders/.cache", True, theirs["id"]),
        (".cache", False, mine["id"]),
    ]
    assert [m["path"] for m in folders.mounts(reader(ANN), [])] == [".cache"]
    assert folders.visible(reader(ANN), False)[0]["automount"]


def test_two_folders_of_one_name_cannot_meet_at_one_mount_point(folders):
    theirs = folders.create(reader(ANN), "data")
    folders.share(reader(ANN), theirs["id"], {"user": "bob", "account": BOB.key}, "ro")
    mine = folders.create(reader(BOB), "data")
    says = refused("invalid", folders.mounts, reader(BOB), [mine["id"], theirs["id"]])
    assert "~/folders/data" in says


def test_a_course_folder_is_mounted_for_those_who_see_it_and_gives_way_to_a_chosen_one(folders):
    course = folders.create(reader(ANN), "cs101")
    folders.share(reader(ANN), course["id"], {"group": "cs101"}, "ro")
    student, stranger = reader(BOB, "cs101"), reader(BOB)
    (mount,) = folders.mounts(student, [], courses=[course["id"]])
    assert (mount["path"], mount["read_only"], mount["id"]) == ("folders/cs101", True, course["id"])
    # One outside the group is not mounted it (nor told it exists), and a spawn still starts.
    assert folders.mounts(stranger, [], courses=[course["id"]]) == []
    # A folder of the student's own of that name, chosen, takes the place.
    mine = folders.create(reader(BOB), "cs101")
    mounts = folders.mounts(student, ["cs101"], courses=[course["id"]])
    assert [(m["path"], m["id"]) for m in mounts] == [("folders/cs101", mine["id"])]


def test_a_storage_quota_refuses_what_would_pass_it_and_mounts_own_folders_read_only(
    db_url, tmp_path
):
    limits = {frozenset(): [(None, 64 * 1024)], frozenset({"ml"}): [("ml", 96 * 1024)]}
    folders = Folders(
        FolderStore(open_database(db_url)),
        FolderFiles(tmp_path / "folders"),
        storage_limits=lambda groups: limits[groups],
        members=lambda group: ("ann", "bob"),
    )
    data = folders.create(reader(ANN), "data")
    folders.write(reader(ANN), data["id"], "a", b"x" * 40_000, 0)
    says = refused("full", folders.write, reader(ANN), data["id"], "b", b"x" * 40_000, 0)
    assert "of your storage quota of 64 KiB" in says
    assert os.listdir(folders.files.source(data["id"])) == ["a"]  # nothing half-written
    # Past the quota (a session wrote on its own): no new folder, own folders read-only.
    with open(os.path.join(folders.files.source(data["id"]), "big"), "wb") as f:
        f.write(b"x" * 40_000)
    folders.measure_all()
    assert "storage quota" in refused("quota", folders.create, reader(ANN), "more")
    (mount,) = folders.mounts(reader(ANN), ["data"])
    assert mount["read_only"] and "storage quota" in mount["note"]
    # A group's quota counts all of its members' folders.
    bobs = folders.create(reader(BOB, "ml"), "b")
    says = refused("full", folders.write, reader(BOB, "ml"), bobs["id"], "x", b"x" * 20_000, 0)
    assert says.startswith("The folders of group ml hold ") and "of its storage quota" in says


def test_a_folder_past_its_owners_quota_is_read_only_for_every_writer_sharers_included(
    db_url, tmp_path
):
    """The owner's quota bounds the folder, whoever writes: a read-write sharer with no quota
    of their own mounts it read-only and is refused a write, told whose quota it is."""
    # Ann (no group) has a 64 KiB quota; Bob (group "free") has none.
    limits = {frozenset(): [(None, 64 * 1024)], frozenset({"free"}): []}
    folders = Folders(
        FolderStore(open_database(db_url)),
        FolderFiles(tmp_path / "folders"),
        storage_limits=lambda groups: limits[groups],
    )
    bob = reader(BOB, "free")
    shared = folders.create(reader(ANN), "shared")
    folders.share(reader(ANN), shared["id"], {"user": "bob", "account": BOB.key}, "rw")
    (mount,) = folders.mounts(bob, [shared["id"]])
    assert not mount["read_only"]  # room left: Bob writes
    # A session of Bob's writes past Ann's quota on its own; the round measures it.
    with open(os.path.join(folders.files.source(shared["id"]), "big"), "wb") as f:
        f.write(b"x" * 80_000)
    folders.measure_all()
    (mount,) = folders.mounts(bob, [shared["id"]])
    assert mount["read_only"], mount
    assert mount["note"].startswith("The folders of ann (this folder's owner) hold ")
    says = refused("full", folders.write, bob, shared["id"], "more", b"x", 0)
    assert "of their storage quota of 64 KiB; files must be removed first." in says
    assert sorted(os.listdir(folders.files.source(shared["id"]))) == ["big"]
