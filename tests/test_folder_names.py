"""folder_names.py: which names a folder may have and which paths inside one a request may name."""

from __future__ import annotations

import pytest

from queue_service.core.errors import Refusal
from queue_service.core.folder_names import folder_name, is_automount, path_parts, permission


@pytest.mark.parametrize("name", ["data", "My data", ".local", "course-101_v2", "a", "x" * 64])
def test_a_plain_name_is_kept_as_given(name):
    assert folder_name(name) == name


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "needs a name"),
        (None, "needs a name"),
        (3, "needs a name"),
        ("a/b", "no '/'"),
        ("..", "cannot name"),
        (".", "cannot name"),
        ("a\0b", "cannot name"),
        ("x" * 65, "at most 64"),
        (" lead", "cannot name"),
        ("trail ", "cannot name"),
        ("tab\there", "cannot name"),
        ("ünïcode", "cannot name"),
    ],
)
def test_a_bad_name_is_refused_with_what_is_wrong(name, says):
    with pytest.raises(Refusal) as refused:
        folder_name(name)
    assert refused.value.cause == "invalid"
    assert says in refused.value.message


def test_a_dot_name_is_an_automount_folder():
    assert is_automount(".cache") and not is_automount("cache")


@pytest.mark.parametrize(
    ("path", "parts"),
    [("", ()), ("/", None), ("a", ("a",)), ("a/b/c.txt", ("a", "b", "c.txt")), ("dir/", ("dir",))],
)
def test_paths_split_into_components(path, parts):
    if parts is None:
        with pytest.raises(Refusal):
            path_parts(path)
    else:
        assert path_parts(path) == parts


@pytest.mark.parametrize(
    "path", ["..", "a/../b", "./a", "a//b", "/etc/passwd", "a\0b", "x" * 256, "a/" * 2100]
)
def test_a_path_that_could_leave_the_folder_is_refused(path):
    with pytest.raises(Refusal) as refused:
        path_parts(path)
    assert refused.value.cause == "invalid"


def test_a_permission_is_ro_or_rw():
    assert permission("ro") == "ro" and permission("rw") == "rw"
    with pytest.raises(Refusal, match="read-only"):
        permission("write")
