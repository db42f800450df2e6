"""The pure parts of SSH and SFTP: which server a login names (core/ssh_logins.py), which paths
an SFTP login reaches (core/sftp_paths.py), the engine's exec frames (engine/session_exec.py),
and the file layer's writes for SFTP, which never follow a link (store/folder_files.py)."""

from __future__ import annotations

import os
import struct

import pytest

from queue_service.core.errors import Refusal
from queue_service.core.sftp_paths import Place, place_of, real_path
from queue_service.core.ssh_logins import login_of, reaches_server, server_of_login
from queue_service.engine.session_exec import Frames
from queue_service.store.folder_files import FolderFiles


@pytest.mark.parametrize(
    ("login", "user", "server"),
    [
        ("ann", "ann", ""),
        ("ann-lab", "ann", "lab"),
        ("ann-s-1a2b", "ann", "s-1a2b"),
        ("ann-s-1a2b", "ann-s", "1a2b"),
        ("ann-s-1a2b", "ann-s-1a2b", ""),
        ("ann-", "ann", None),
        ("anna", "ann", None),
        ("bob", "ann", None),
        ("ann", "ann-s", None),
    ],
)
def test_the_token_owner_settles_which_server_a_login_names(login, user, server):
    assert server_of_login(login, user) == server
    if server is not None:
        assert login_of(user, server) == login


@pytest.mark.parametrize(
    ("scopes", "reaches"),
    [
        (["access:servers"], True),
        (["access:servers!user=ann"], True),
        (["access:servers!server=ann/lab"], True),
        (["access:servers!group=course-a"], True),
        (["access:servers!server=ann/"], False),  # the default server only
        (["access:servers!user=bob", "access:servers!group=other"], False),
        (["read:users!user=ann", "access:services"], False),
        ([], False),
    ],
)
def test_a_token_reaches_a_server_as_jupyterhub_scopes_say(scopes, reaches):
    assert reaches_server(scopes, "ann", "lab", groups=["course-a"]) is reaches


@pytest.mark.parametrize(
    ("path", "place"),
    [
        ("/", Place("home")),
        ("", Place("home")),
        (".", Place("home")),
        ("/a/./b//c", Place("home", ("a", "b", "c"))),
        ("notes.txt", Place("home", ("notes.txt",))),
        ("/folders", Place("folders")),
        ("/folders/", Place("folders")),
        ("/folders/data", Place("folder", (), "data")),
        ("/folders/data/x/y", Place("folder", ("x", "y"), "data")),
        ("/folder", Place("home", ("folder",))),
    ],
)
def test_each_path_is_the_home_or_a_storage_folder(path, place):
    assert place_of(path) == place


@pytest.mark.parametrize(
    "path",
    ["/..", "/../etc/passwd", "/folders/../../etc", "/folders/data/../../x", "a/..", "x\0y"],
)
def test_a_path_that_could_leave_the_tree_is_refused(path):
    with pytest.raises(Refusal):
        place_of(path)


def test_a_folder_name_no_folder_could_have_is_refused():
    with pytest.raises(Refusal, match="cannot name a folder"):
        place_of("/folders/a:b/x")


@pytest.mark.parametrize(
    ("path", "real"),
    [("", "/"), (".", "/"), ("..", "/"), ("/../..", "/"), ("a/../b", "/b"), ("//x/", "/x")],
)
def test_realpath_folds_dot_dot_without_climbing_above_the_root(path, real):
    assert real_path(path) == real


def test_the_engines_frames_are_split_however_they_arrive():
    def frame(stream: int, payload: bytes) -> bytes:
        return struct.pack(">BxxxL", stream, len(payload)) + payload

    stream = frame(1, b"out") + frame(2, b"err!") + frame(1, b"")
    frames = Frames()
    found = []
    for i in range(len(stream)):  # a byte at a time
        found += frames.feed(stream[i : i + 1])
    assert found == [(1, b"out"), (2, b"err!"), (1, b"")]


@pytest.fixture
def files(tmp_path) -> FolderFiles:
    (tmp_path / "f").mkdir()
    return FolderFiles(tmp_path)


def test_a_file_opened_to_write_is_made_new_or_reused_never_through_a_link(files, tmp_path):
    target = tmp_path / "outside.txt"
    target.write_text("keep")
    os.symlink(target, tmp_path / "f" / "link")
    with pytest.raises(Refusal, match="link"):
        files.open_to_write("f", ("link",), create=True, truncate=True, new=False)
    with pytest.raises(Refusal, match="exists already"):
        files.open_to_write("f", ("link",), create=True, truncate=True, new=True)
    assert target.read_text() == "keep"
    fd = files.open_to_write("f", ("new.txt",), create=True, truncate=False, new=False)
    os.write(fd, b"abc")
    os.close(fd)
    fd = files.open_to_write("f", ("new.txt",), create=False, truncate=True, new=False)
    assert os.fstat(fd).st_size == 0
    os.close(fd)
    with pytest.raises(Refusal, match="There is no"):
        files.open_to_write("f", ("missing",), create=False, truncate=False, new=False)


def test_sftp_removes_files_and_empty_directories_apart(files, tmp_path):
    (tmp_path / "f" / "d").mkdir()
    (tmp_path / "f" / "d" / "x").write_text("x")
    with pytest.raises(Refusal, match="not empty"):
        files.remove_directory("f", ("d",))
    with pytest.raises(Refusal, match="is a directory"):
        files.remove_file("f", ("d",))
    files.remove_file("f", ("d", "x"))
    files.remove_directory("f", ("d",))
    assert files.stats("f", ()) == []
