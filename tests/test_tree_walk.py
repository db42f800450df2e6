"""Trees thousands of levels deep (as a session can make) are measured, archived, tagged and
removed without recursion, holding a bounded number of descriptors, never following a link."""

from __future__ import annotations

import os
import tarfile

import pytest

from queue_service.store import tree_walk
from queue_service.store.folder_files import TRASH, FolderFiles

DEPTH = 3000


def make_deep(top: str, depth: int = DEPTH) -> None:
    """`depth` nested directories `d` under `top`, a file of 5 bytes at the bottom, each made
    relative to its parent's descriptor (no path grows past PATH_MAX)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    with os.fdopen(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
        f.write("hello")
    os.close(fd)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def files(tmp_path):
    files = FolderFiles(tmp_path / "folders", owner=(os.getuid(), os.getgid()))
    files.make("f1")
    make_deep(files.source("f1"))
    yield files
    # pytest's own clean-up of old temporary folders recurses: leave it nothing deep.
    root = os.open(tmp_path, tree_walk.DIR_FLAGS)
    tree_walk.remove_tree(root, "folders")
    os.close(root)


def test_a_deep_folder_is_measured(files):
    found = files.measure("f1")
    assert found.files == 1
    assert found.bytes > 0


def test_a_walk_holds_a_bounded_number_of_descriptors(files):
    before = open_fds()
    fd = os.open(files.source("f1"), tree_walk.DIR_FLAGS)
    most = depth = 0
    for names, _, _, _ in tree_walk.walk(fd):
        most = max(most, open_fds() - before)
        depth = max(depth, len(names))
    os.close(fd)
    assert depth == DEPTH
    assert most <= tree_walk.MAX_OPEN + 3  # the top's, and the listing's own while it lists
    assert open_fds() == before


def test_a_deep_directory_is_removed_through_the_api_layer(files):
    files.remove("f1", ("d",))
    assert os.listdir(files.source("f1")) == []


def test_a_deep_trashed_folder_is_purged(files):
    files.trash("f1", now=100)
    assert files.purge_trash(older_than=200) == ["f1.100"]
    assert os.listdir(files.root / TRASH) == []


def test_a_deep_folder_is_archived_whole(files, tmp_path):
    with tarfile.open(tmp_path / "a.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        assert files.archive("f1", tar) == []
    with tarfile.open(tmp_path / "a.tar") as tar:
        names = tar.getnames()
    assert len(names) == DEPTH + 2
    assert names[-1] == "f1/" + "d/" * DEPTH + "bottom.txt"


def test_removal_takes_links_and_never_what_they_point_at(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    tree = tmp_path / "tree"
    tree.mkdir()
    make_deep(str(tree), depth=40)
    deep = tree / "/".join(["d"] * 40)
    (deep / "link").symlink_to(outside)
    (deep / "link_file").symlink_to(outside / "keep.txt")
    parent = os.open(tmp_path, tree_walk.DIR_FLAGS)
    tree_walk.remove_tree(parent, "tree")
    os.close(parent)
    assert not tree.exists()
    assert (outside / "keep.txt").read_text() == "x"


def test_a_walk_lists_links_to_directories_as_names_and_never_enters_them(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "inside.txt").write_text("x")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "link").symlink_to(tmp_path / "real")
    fd = os.open(tmp_path / "tree", tree_walk.DIR_FLAGS)
    seen = [(names, dirs, others) for names, _, dirs, others in tree_walk.walk(fd)]
    os.close(fd)
    assert seen == [((), [], ["link"])]
