"""store/project_quotas.py: the kernel's project quotas under the storage folders.

The project ids are real: a loop-mounted XFS file system (xfsprogs, installed by scripts/test)
takes them through the FS_IOC_FSSETXATTR ioctl, and files a session writes later inherit them.
The kernels of these machines are built without quota support (CONFIG_QUOTA), so no file system
here mounts with `prjquota` and `xfs_quota` cannot enforce a limit: the limit is checked at its
boundary, the command the service runs, as the GPU paths are (docs/source/howto/storage-folders.md).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from queue_service.folders import Folders
from queue_service.store.accounts import Account
from queue_service.store.db import open_database
from queue_service.store.folder_files import TRASH, FolderFiles
from queue_service.store.folders import FolderStore, Reader
from queue_service.store.project_quotas import (
    FS_XFLAG_PROJINHERIT,
    FSXATTR,
    NO_PROJECT,
    Mount,
    ProjectQuotas,
    limit_command,
    mount_of,
    parse_mountinfo,
    project_of_fd,
    set_project_fd,
    support_reason,
    with_project,
)

ANN = Account("ann", "20261101T000000000000Z")
BOB = Account("bob", "20261102T000000000000Z")
GIB = 1024**3
MOUNTINFO = (
    "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n"
    "43 22 7:0 / /srv/fgpu rw,relatime - xfs /dev/loop0 rw,inode64,prjquota\n"
    "44 22 7:1 / /srv/fgpu/my\\040folders rw - xfs /dev/loop1 rw,noquota\n"
    "45 22 0:40 / /var/lib/docker/overlay rw - overlay overlay rw,lowerdir=/a\n"
)


def test_the_mount_of_a_path_is_the_deepest_one_above_it_with_its_options():
    mounts = parse_mountinfo(MOUNTINFO)
    assert [m.point for m in mounts][:3] == ["/", "/srv/fgpu", "/srv/fgpu/my folders"]
    assert mount_of("/srv/fgpu/folders/abc", mounts).point == "/srv/fgpu"
    assert mount_of("/srv/fgpu/my folders/x", mounts).fs_type == "xfs"
    assert "noquota" in mount_of("/srv/fgpu/my folders/x", mounts).options
    assert mount_of("/srv/fgpuX", mounts).point == "/"  # a prefix of a name is not a parent
    assert "prjquota" in mount_of("/srv/fgpu", mounts).options


@pytest.mark.parametrize(
    ("mount", "has_tool", "says"),
    [
        (None, True, "could not be found"),
        (Mount("/", "overlay", frozenset({"rw"})), True, "on overlay, which has no project"),
        (Mount("/srv", "xfs", frozenset({"rw", "noquota"})), True, "not mounted with prjquota"),
        (Mount("/srv", "ext4", frozenset({"rw", "usrquota"})), True, "not mounted with prjquota"),
        (Mount("/srv", "xfs", frozenset({"prjquota"})), False, "xfs_quota"),
    ],
)
def test_a_root_without_project_quotas_says_why(mount, has_tool, says):
    assert says in support_reason(mount, has_tool)


@pytest.mark.parametrize("option", ["prjquota", "pquota", "prjjquota"])
def test_xfs_and_ext4_mounted_with_project_quotas_can_hold_them(option):
    for fs_type in ("xfs", "ext4"):
        assert support_reason(Mount("/srv", fs_type, frozenset({"rw", option})), True) is None


def test_the_project_is_set_with_the_inherit_flag_and_the_other_flags_are_kept():
    immutable_and_dax = 0x00000008 | 0x00008000
    raw = FSXATTR.pack(immutable_and_dax, 4096, 3, 0, 0, b"\0" * 8)
    xflags, extsize, nextents, project, _, _ = FSXATTR.unpack(with_project(raw, 1001))
    assert project == 1001 and xflags == immutable_and_dax | FS_XFLAG_PROJINHERIT
    assert (extsize, nextents) == (4096, 3)
    xflags, _, _, project, _, _ = FSXATTR.unpack(with_project(with_project(raw, 7), NO_PROJECT))
    assert project == NO_PROJECT and xflags == immutable_and_dax  # nothing below takes an id


def test_the_limit_is_one_xfs_quota_call_on_the_mount_point():
    assert limit_command("/srv/fgpu", 1001, 5 * GIB) == [
        "xfs_quota",
        "-x",
        "-c",
        f"limit -p bhard={5 * GIB} 1001",
        "/srv/fgpu",
    ]
    assert limit_command("/srv/fgpu", 1001, None)[3] == "limit -p bhard=0 1001"  # no limit


def test_this_machines_disk_has_none_and_the_service_says_why(tmp_path):
    """The probe reads the real /proc/self/mountinfo: the folders root of the tests has no
    project quotas, and the reason names its file system."""
    projects = ProjectQuotas(tmp_path)
    assert projects.mount is not None and projects.mount.fs_type in projects.reason


@pytest.fixture(scope="module")
def xfs(tmp_path_factory) -> Path:
    """A real XFS file system on a loop device (no quota accounting: the kernel has none)."""
    where = tmp_path_factory.mktemp("xfs")
    image, point = where / "disk.img", where / "mnt"
    point.mkdir()
    with open(image, "wb") as disk:
        disk.truncate(320 * 1024**2)  # sparse; XFS's smallest
    subprocess.run(["mkfs.xfs", "-q", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(point)], check=True)
    yield point
    subprocess.run(["umount", str(point)], check=True)


class Limits:
    """The xfs_quota calls the service makes (run, not enforced: no quota in these kernels)."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def __call__(self, command: list[str]) -> None:
        self.calls.append(command)


@pytest.fixture
def on_xfs(xfs, db_url):
    root = xfs / uuid.uuid4().hex
    limits = Limits()
    projects = ProjectQuotas(root.parent, run=limits)
    assert projects.mount.fs_type == "xfs" and "not mounted with prjquota" in projects.reason
    folders = Folders(
        FolderStore(open_database(db_url)),
        FolderFiles(root),
        storage_limits=lambda groups: [(None, 2 * GIB)],
        projects=projects,
    )
    return folders, limits


def project_at(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return project_of_fd(fd)
    finally:
        os.close(fd)


def test_what_a_session_writes_in_a_folder_counts_under_its_owners_project(on_xfs):
    folders, _ = on_xfs
    made = folders.create(Reader(ANN), "data")
    source = Path(folders.files.source(made["id"]))
    ann = folders.store.project_of(ANN)
    assert ann != NO_PROJECT and project_at(source) == ann
    # What a session writes later, at any depth, takes the id (the inherit flag).
    (source / "runs" / "1").mkdir(parents=True)
    (source / "runs" / "1" / "weights.bin").write_bytes(b"x" * 4096)
    assert project_at(source / "runs" / "1" / "weights.bin") == ann
    folders.write(Reader(ANN), made["id"], "notes.txt", b"hello", 0)
    assert project_at(source / "notes.txt") == ann
    # Each account has its own project, and keeps it.
    other = folders.create(Reader(BOB), "data")
    bob = folders.store.project_of(BOB)
    assert bob not in (ann, NO_PROJECT) and folders.store.project_of(ANN) == ann
    assert project_at(Path(folders.files.source(other["id"]))) == bob


def test_a_folder_handed_over_counts_under_the_new_owner_and_a_planted_link_is_not_followed(
    on_xfs, tmp_path
):
    folders, _ = on_xfs
    made = folders.create(Reader(ANN), "data")
    source = Path(folders.files.source(made["id"]))
    (source / "deep" / "er").mkdir(parents=True)
    (source / "deep" / "er" / "file").write_bytes(b"1")
    outside = folders.files.root.parent / f"outside-{uuid.uuid4().hex}"
    outside.write_bytes(b"not the folder's")
    (source / "link").symlink_to(outside)
    folders.give(made["id"], BOB)
    bob = folders.store.project_of(BOB)
    assert [project_at(p) for p in (source, source / "deep" / "er" / "file")] == [bob, bob]
    assert project_at(outside) == NO_PROJECT  # the link's target was not touched


def test_a_removed_folder_no_longer_fills_its_owners_quota(on_xfs):
    folders, _ = on_xfs
    made = folders.create(Reader(ANN), "data")
    (Path(folders.files.source(made["id"])) / "big").write_bytes(b"x" * 8192)
    folders.remove(Reader(ANN), made["id"])
    (kept,) = (folders.files.root / TRASH).iterdir()
    assert project_at(kept) == NO_PROJECT and project_at(kept / "big") == NO_PROJECT


def test_the_owners_own_quota_is_the_projects_limit_set_once_and_again_when_it_changes(on_xfs):
    folders, limits = on_xfs
    folders.create(Reader(ANN), "data")
    ann = folders.store.project_of(ANN)
    point = folders.projects.mount.point
    assert limits.calls == [limit_command(point, ann, 2 * GIB)]
    quotas = folders.quotas(Reader(ANN))  # the Storage page reads them: nothing to set again
    assert limits.calls == [limit_command(point, ann, 2 * GIB)]
    assert [(q["group"], q["held_by"]) for q in quotas] == [(None, "kernel")]
    folders.storage_limits = lambda groups: [(None, 5 * GIB), ("class", 50 * GIB)]
    quotas = folders.quotas(Reader(ANN, frozenset({"class"})))
    assert limits.calls[-1] == limit_command(point, ann, 5 * GIB)
    # A group's quota, over several owners' folders, has no kernel form.
    assert [(q["group"], q["held_by"]) for q in quotas] == [(None, "kernel"), ("class", "measure")]


def test_a_folder_made_before_the_site_had_project_quotas_is_tagged_by_the_measure_round(on_xfs):
    folders, _ = on_xfs
    made = folders.create(Reader(ANN), "data")
    source = Path(folders.files.source(made["id"]))
    (source / "old").write_bytes(b"x")
    folders.projects.assign(source, NO_PROJECT)  # as a folder from before
    assert folders.measure_all() >= 1
    ann = folders.store.project_of(ANN)
    assert [project_at(source), project_at(source / "old")] == [ann, ann]


def test_a_file_its_owner_re_tags_is_tagged_back_by_the_measure_round_at_any_depth(on_xfs):
    """The session user owns the files, so a student may set one's project id (to 0, or to
    another user's) to slip the quota: each round sets every file and directory back."""
    folders, _ = on_xfs
    made = folders.create(Reader(ANN), "data")
    source = Path(folders.files.source(made["id"]))
    deep = source / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "big").write_bytes(b"x" * 4096)
    bob = folders.store.project_of(BOB)
    for path, project in ((deep / "big", NO_PROJECT), (source / "a" / "b", bob)):
        fd = os.open(path, os.O_RDONLY)
        try:
            set_project_fd(fd, project)  # as the file's owner can, with FS_IOC_FSSETXATTR
        finally:
            os.close(fd)
    assert project_at(deep / "big") == NO_PROJECT
    folders.measure_all()
    ann = folders.store.project_of(ANN)
    assert [project_at(source / "a" / "b"), project_at(deep / "big")] == [ann, ann]
