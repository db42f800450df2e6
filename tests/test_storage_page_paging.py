"""The Storage page in Debian's Chromium with a directory of more entries than one page of its
listing: the first page shows with a "Show more" button, which loads the rest in name order and
goes away once all are shown. Screenshot: test-output/browser/storage-show-more."""

from __future__ import annotations

import os
import secrets

import pytest
from playwright.sync_api import expect

from queue_service.handlers.folders import LISTING_DEFAULT

from .browser import log_in, screenshot
from .harness import QueueUser
from .test_folders_hub import made, on_disk
from .test_storage_page import folder_row, open_storage

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

ENTRIES = LISTING_DEFAULT + 7


def test_a_directory_past_one_page_shows_more_on_request(hub, page):
    name = f"many-{secrets.token_hex(3)}"
    folder = made(QueueUser(hub, name), "many files")
    for number in range(ENTRIES):
        open(os.path.join(on_disk(hub, folder), f"f{number:05}.csv"), "w").close()
    log_in(page, hub, name)
    open_storage(page, hub)
    folder_row(page, "mine", "many files").locator("[data-action=open]").click()

    rows = page.locator("#fgpu-entries tbody tr")
    expect(rows).to_have_count(LISTING_DEFAULT)
    more = page.locator("#fgpu-more")
    expect(more).to_be_visible()
    expect(page.locator("#fgpu-more-note")).to_have_text(
        f"{LISTING_DEFAULT} entries shown; more follow."
    )
    more.scroll_into_view_if_needed()
    screenshot(page, "storage-show-more")
    more.click()
    expect(rows).to_have_count(ENTRIES)
    expect(more).to_be_hidden()
    shown = rows.evaluate_all("rows => rows.map(r => r.dataset.entry)")
    assert shown == [f"f{number:05}.csv" for number in range(ENTRIES)]
