"""The spawner's default `apply_user_options` hook (fgpu_spawner/user_options.py): which options
read the user's presets, and how long a deferred job's start may wait before its own timeout."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from fgpu_spawner.user_options import _deferred_for, _reads_presets


@pytest.mark.parametrize(
    ("options", "reads"),
    [
        ({"preset": "small"}, True),
        ({"image": "python-3.11"}, True),  # no slot given: the smallest preset may be the default
        ({"image": "python-3.11", "cpu": 1, "mem": "1G"}, False),
        ("not a dict", False),
        (None, False),
    ],
)
def test_the_presets_are_read_only_when_the_options_name_one_or_give_no_slot(options, reads):
    assert _reads_presets(options) is reads


def test_a_deferred_jobs_wait_is_whole_seconds_rounded_up_and_none_once_its_time_has_come():
    assert _deferred_for(None) == 0
    soon = (datetime.now(UTC) + timedelta(seconds=90.2)).isoformat()
    assert 90 <= _deferred_for(json.dumps({"command": "x", "start_after": soon})) <= 91
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    assert _deferred_for(json.dumps({"command": "x", "start_after": past})) == 0
