"""A large directory of a storage folder is listed a page at a time (`GET
api/folders/{id}/files/{dir}?limit=&after=`) on the real hub and service: directories first, each kind by name, `next` naming
where the following page starts, every entry exactly once, and a limit past the maximum refused
with the maximum named."""

from __future__ import annotations

import os

import pytest

from queue_service.handlers.folders import LISTING_DEFAULT, LISTING_MAX

from .harness import QueueUser
from .test_folders_hub import made, on_disk

pytestmark = [pytest.mark.docker, pytest.mark.hub]

ENTRIES = 2 * LISTING_DEFAULT + 500


def test_a_large_directory_is_listed_a_page_at_a_time(hub, username):
    user = QueueUser(hub, username)
    folder = made(user, "many files")
    big = os.path.join(on_disk(hub, folder), "big")
    os.mkdir(big)
    for number in range(ENTRIES):
        open(os.path.join(big, f"f{number:05}.txt"), "w").close()
    os.mkdir(os.path.join(big, "a-directory"))
    os.mkdir(os.path.join(big, "zz-directory"))
    url = f"folders/{folder['id']}/files/big"

    seen, after, pages = [], "", 0
    while True:
        answer = user.call("GET", url + (f"?after={after}" if after else ""))
        assert answer.status_code == 200, answer.text
        page = answer.json()
        pages += 1
        seen += [entry["name"] for entry in page["entries"]]
        assert len(page["entries"]) <= LISTING_DEFAULT
        if page["next"] is None:
            break
        assert page["next"] == page["entries"][-1]["name"]
        after = page["next"]
    assert pages == 3
    # Directories first, then files, each by name; every entry exactly once.
    files = [f"f{n:05}.txt" for n in range(ENTRIES)]
    assert seen == ["a-directory", "zz-directory", *files]

    across = user.call("GET", url + "?limit=2&after=a-directory").json()
    assert [e["name"] for e in across["entries"]] == ["zz-directory", "f00000.txt"]
    small = user.call("GET", url + "?limit=2&after=f00007.txt").json()
    assert [e["name"] for e in small["entries"]] == ["f00008.txt", "f00009.txt"]
    assert small["next"] == "f00009.txt"
    last = user.call("GET", url + f"?limit=5&after=f{ENTRIES - 2:05}.txt").json()
    assert ([e["name"] for e in last["entries"]], last["next"]) == (
        [f"f{ENTRIES - 1:05}.txt"],
        None,
    )
    for bad in (0, LISTING_MAX + 1):
        refused = user.call("GET", url + f"?limit={bad}")
        assert refused.status_code == 400
        assert str(LISTING_MAX) in refused.json()["message"]
