"""The record of parallel uploads (queue_service/uploads.py): which bytes came whole, the moment
a file is complete (once, however many chunks finish together), whose upload an id is, how many
one account may have under way, and forgetting the ones no chunk came to."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from queue_service.core.errors import Refusal
from queue_service.store.accounts import Account
from queue_service.uploads import FORGET_AFTER, MAX_PER_ACCOUNT, Uploads

ANN, BOB = Account("ann", "1"), Account("bob", "2")
PARTS = ("sub", "data.bin")


def test_chunks_in_any_order_and_again_complete_the_file_once():
    uploads = Uploads()
    upload = uploads.start(ANN, "f", PARTS, 10, ".fgpu-upload-x")
    assert uploads.add(upload, 6, 10) is False
    assert uploads.add(upload, 6, 10) is False  # again: counted once
    assert (upload.received, upload.received_bytes) == ([(6, 10)], 4)
    assert uploads.add(upload, 0, 3) is False
    assert uploads.add(upload, 3, 6) is True
    assert upload.complete and upload.received == [(0, 10)]
    assert uploads.add(upload, 0, 3) is False  # a late copy: already whole
    assert upload.answer("sub/data.bin") == {
        "path": "sub/data.bin",
        "size": 10,
        "upload": upload.id,
        "part": "sub/.fgpu-upload-x",
        "received": 10,
        "complete": True,
    }


def test_of_many_chunks_finishing_together_exactly_one_makes_the_file_whole():
    uploads = Uploads()
    upload = uploads.start(ANN, "f", PARTS, 1000, "p")
    with ThreadPoolExecutor(max_workers=8) as pool:
        made_whole = list(pool.map(lambda o: uploads.add(upload, o, o + 10), range(0, 1000, 10)))
    assert made_whole.count(True) == 1 and upload.complete


def test_an_id_opens_only_its_own_accounts_upload_of_that_file():
    uploads = Uploads()
    upload = uploads.start(ANN, "f", PARTS, 10, "p")
    assert uploads.get(upload.id, ANN, "f", PARTS) is upload
    for account, folder, parts, upload_id in [
        (BOB, "f", PARTS, upload.id),
        (ANN, "g", PARTS, upload.id),
        (ANN, "f", ("other.bin",), upload.id),
        (ANN, "f", PARTS, "0" * 24),
    ]:
        with pytest.raises(Refusal) as refused:
            uploads.get(upload_id, account, folder, parts)
        assert refused.value.cause == "conflict"


def test_an_account_has_a_bounded_number_under_way_and_old_ones_are_forgotten():
    uploads = Uploads()
    mine = [uploads.start(ANN, "f", (f"{n}.bin",), 10, f"p{n}") for n in range(MAX_PER_ACCOUNT)]
    with pytest.raises(Refusal) as refused:
        uploads.start(ANN, "f", ("more.bin",), 10, "p")
    assert "uploads under way" in refused.value.message
    assert uploads.start(BOB, "f", ("bob.bin",), 10, "p")  # another account's are its own
    uploads.add(mine[0], 0, 10)  # a complete one no longer counts
    assert uploads.start(ANN, "f", ("more.bin",), 10, "p")
    later = mine[1].touched + FORGET_AFTER + 1
    forgotten = uploads.forgotten(now=later)
    assert len(forgotten) == MAX_PER_ACCOUNT + 2
    assert uploads.under_way == {}
