"""folder_files.py on a real disk: files reached one component at a time and never through a
link, FIFOs and devices refused, uploads in chunks that must follow each other, removal and
measurement that do not leave the folder."""

from __future__ import annotations

import os

import pytest

from queue_service.core.errors import Refusal
from queue_service.store.folder_files import TRASH, FolderFiles

ID = "f" * 32


@pytest.fixture
def files(tmp_path):
    files = FolderFiles(tmp_path / "root")
    files.make(ID)
    return files


def folder(files) -> str:
    return files.source(ID)


def test_a_new_folder_belongs_to_the_session_user(files):
    info = os.stat(folder(files))
    expected = (1000, 100) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    assert (info.st_uid, info.st_gid) == expected


def test_an_upload_in_chunks_makes_the_file_and_a_gap_or_overlap_is_a_conflict(files):
    assert files.write(ID, ("data.bin",), b"abc", 0) == 3
    assert files.write(ID, ("data.bin",), b"def", 3) == 6
    for offset in (2, 9):
        with pytest.raises(Refusal) as refused:
            files.write(ID, ("data.bin",), b"x", offset)
        assert refused.value.cause == "conflict" and "holds 6 bytes" in refused.value.message
    with open(os.path.join(folder(files), "data.bin"), "rb") as f:
        assert f.read() == b"abcdef"
    assert files.write(ID, ("data.bin",), b"new", 0) == 3  # offset 0 starts it again


def test_a_listing_shows_kinds_and_sizes_and_links_as_links(files):
    files.make_directory(ID, ("sub",))
    files.write(ID, ("sub", "a.txt"), b"hello", 0)
    os.symlink("/etc", os.path.join(folder(files), "planted"))
    entries = {e["name"]: e for e in files.listing(ID, ())[0]}
    assert entries["sub"]["type"] == "directory"
    assert entries["planted"]["type"] == "link"
    assert files.listing(ID, ("sub",))[0][0] | {"modified": 0} == {
        "name": "a.txt",
        "type": "file",
        "size": 5,
        "modified": 0,
    }


@pytest.mark.parametrize("link_to", ["/etc", "../../elsewhere"])
def test_a_planted_link_is_never_followed(files, tmp_path, link_to):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret").write_text("theirs")
    os.symlink(link_to if link_to == "/etc" else str(elsewhere), os.path.join(folder(files), "in"))
    os.symlink("/etc/passwd", os.path.join(folder(files), "passwd"))
    for attempt in (
        lambda: files.listing(ID, ("in",)),
        lambda: files.write(ID, ("in", "secret"), b"mine", 0),
        lambda: files.write(ID, ("passwd",), b"root::0:0::/:/bin/sh\n", 0),
        lambda: files.make_directory(ID, ("in", "new")),
        lambda: files.remove(ID, ("in", "secret")),
    ):
        with pytest.raises(Refusal) as refused:
            attempt()
        assert refused.value.cause == "forbidden", refused.value.message
        assert "link" in refused.value.message
    with pytest.raises(Refusal):
        files.open_file(ID, ("passwd",))
    assert (elsewhere / "secret").read_text() == "theirs"
    files.remove(ID, ("in",))  # removing the link removes the link alone
    assert (elsewhere / "secret").exists() and os.path.exists("/etc/passwd")


def test_a_fifo_is_neither_read_nor_written(files):
    os.mkfifo(os.path.join(folder(files), "pipe"))
    with pytest.raises(Refusal, match="not a file"):
        files.open_file(ID, ("pipe",))
    with pytest.raises(Refusal, match="not a file"):
        files.write(ID, ("pipe",), b"x", 0)


def test_removing_a_directory_removes_what_is_in_it_and_nothing_a_link_points_at(files, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    files.make_directory(ID, ("tree",))
    files.write(ID, ("tree", "f"), b"1", 0)
    os.symlink(str(outside), os.path.join(folder(files), "tree", "link"))
    files.remove(ID, ("tree",))
    assert not os.path.exists(os.path.join(folder(files), "tree"))
    assert (outside / "keep").read_text() == "keep"


def test_a_measure_counts_disk_use_and_files_without_entering_links(files, tmp_path):
    files.make_directory(ID, ("d",))
    files.write(ID, ("d", "big"), b"x" * 100_000, 0)
    os.symlink(str(tmp_path), os.path.join(folder(files), "loop"))
    found = files.measure(ID)
    assert found.files == 2  # the file and the link, not what the link reaches
    assert 100_000 <= found.bytes < 200_000


def test_rename_moves_inside_the_folder_and_never_over_something(files):
    files.write(ID, ("a",), b"1", 0)
    files.write(ID, ("b",), b"2", 0)
    with pytest.raises(Refusal, match="exists already"):
        files.rename(ID, ("a",), ("b",))
    files.make_directory(ID, ("d",))
    files.rename(ID, ("a",), ("d", "a2"))
    assert [e["name"] for e in files.listing(ID, ("d",))[0]] == ["a2"]


def test_a_trashed_folder_is_kept_until_the_purge_after_its_grace(files):
    files.write(ID, ("kept",), b"1", 0)
    name = files.trash(ID, now=1000)
    assert not os.path.exists(folder(files))
    assert files.purge_trash(older_than=1000) == []
    assert files.purge_trash(older_than=1001) == [name]
    assert os.listdir(files.root / TRASH) == []


def test_missing_paths_are_not_found(files):
    with pytest.raises(Refusal) as refused:
        files.listing(ID, ("nope",))
    assert refused.value.cause == "not_found"
    with pytest.raises(Refusal) as refused:
        files.listing("0" * 32, ())
    assert refused.value.cause == "not_found"


def test_whether_a_file_is_there_is_told_without_following_or_opening_anything(files, tmp_path):
    """holds_file (a batch job's notebook, looked for at submission): a regular file is there;
    nothing, a directory or a FIFO is not; a link, on the way or at the end, is never followed,
    so what lies behind it stays unknown (None), even where the link's target holds the file."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "real.ipynb").write_text("{}")
    files.make_directory(ID, ("work",))
    files.write(ID, ("work", "train.ipynb"), b"{}", 0)
    os.mkfifo(os.path.join(folder(files), "work", "pipe.ipynb"))
    os.symlink(outside, os.path.join(folder(files), "out"))
    os.symlink(outside / "real.ipynb", os.path.join(folder(files), "work", "linked.ipynb"))
    assert files.holds_file(ID, ("work", "train.ipynb")) is True
    for missing in [
        ("work", "nope.ipynb"),
        ("nowhere", "a.ipynb"),
        ("work",),
        ("work", "pipe.ipynb"),
    ]:
        assert files.holds_file(ID, missing) is False, missing
    assert files.holds_file(ID, ("work", "train.ipynb", "x.ipynb")) is False  # a file, not a dir
    for hidden in [("out", "real.ipynb"), ("out", "missing.ipynb"), ("work", "linked.ipynb")]:
        assert files.holds_file(ID, hidden) is None, hidden
    assert files.holds_file("0" * 32, ("a.ipynb",)) is False  # no such folder directory
