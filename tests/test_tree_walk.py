"""A tree deeper than Python recurses, made on disk as a session can: measured, archived, removed and purged, each right, with few descriptors open (tree_walk.py)."""

from __future__ import annotations

import os
import resource
import tarfile

import pytest

from queue_service.store.folder_files import TRASH, FolderFiles, archive_directory, tree_size
from queue_service.store.tree_walk import Enter, Leave, TreeChanged, walk

from .deep_trees import deep_tree, empty_out

ID = "d" * 32
DEPTH = 2000


@pytest.fixture(autouse=True)
def _no_deep_tree_left(tmp_path):
    yield
    empty_out(tmp_path)


@pytest.fixture
def files(tmp_path):
    files = FolderFiles(tmp_path / "root")
    files.make(ID)
    deep_tree(files.source(ID))
    return files


@pytest.fixture
def few_descriptors():
    """At most 64 open descriptors while the walk runs (a walk holding one per level fails)."""
    with few_descriptors_now():
        yield


def test_a_deep_tree_is_measured_in_full(files, few_descriptors):
    measure = files.measure(ID)
    # Each level holds a file and a link; only files fill the quota's bytes.
    assert measure.files == 2 * DEPTH
    assert measure.bytes == DEPTH * os.stat(os.path.join(files.source(ID), "f")).st_blocks * 512


def test_a_deep_tree_is_archived_in_full_without_its_links(files, tmp_path, few_descriptors):
    with tarfile.open(tmp_path / "folder.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        left_out = files.archive(ID, tar)
    assert len(left_out) == DEPTH and all(path.endswith("/out") for path in left_out)
    with tarfile.open(tmp_path / "folder.tar") as tar:
        names = tar.getnames()
    deepest = "/".join([ID, *["a"] * DEPTH])
    assert deepest in names and f"{deepest[: -len('/a')]}/f" in names
    assert sum(name.endswith("/f") for name in names) == DEPTH


def test_a_deep_home_is_sized_and_archived(tmp_path, few_descriptors):
    home = tmp_path / "home" / "ana"
    home.mkdir(parents=True)
    deep_tree(str(home))
    assert tree_size(home) == 10 * DEPTH
    with tarfile.open(tmp_path / "home.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        archive_directory(home, tar)
    with tarfile.open(tmp_path / "home.tar") as tar:
        assert sum(name.endswith("/f") for name in tar.getnames()) == DEPTH


def test_a_deep_directory_is_removed_and_nothing_a_link_points_at(files, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("x")
    os.symlink(outside, os.path.join(files.source(ID), "a", "to-outside"))
    with few_descriptors_now():
        files.remove(ID, ("a",))
    assert sorted(os.listdir(files.source(ID))) == ["f", "out"]
    assert (outside / "kept").read_text() == "x"


def test_a_deep_trashed_folder_is_purged(files):
    files.trash(ID, now=100)
    with few_descriptors_now():
        assert files.purge_trash(older_than=200) == [f"{ID}.100"]
    assert os.listdir(files.root / TRASH) == []


def test_every_directory_is_entered_once_and_left_once(tmp_path):
    deep_tree(str(tmp_path), depth=50)
    (tmp_path / "b").mkdir()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        steps = list(walk(fd))
    finally:
        os.close(fd)
    entered = [step for step in steps if isinstance(step, Enter)]
    assert len(entered) == 52 and len([s for s in steps if isinstance(s, Leave)]) == 51


def test_a_directory_moved_while_walked_stops_the_walk(tmp_path):
    deep_tree(str(tmp_path), depth=3)
    (tmp_path / "elsewhere").mkdir()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(TreeChanged):
            for step in walk(fd):
                if isinstance(step, Enter) and step.path == ["a", "a"]:
                    # The walk is in a/a: move it under another parent.
                    os.rename(tmp_path / "a" / "a", tmp_path / "elsewhere" / "moved")
    finally:
        os.close(fd)


class few_descriptors_now:
    """At most 64 open descriptors within."""

    def __enter__(self):
        self.limits = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, self.limits[1]))

    def __exit__(self, *exc):
        resource.setrlimit(resource.RLIMIT_NOFILE, self.limits)
