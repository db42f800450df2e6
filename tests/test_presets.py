"""Resource presets (queue_service/core/presets.py): parsing, who gets which, and which are usable."""

from __future__ import annotations

import pytest

from queue_service.core.presets import Preset, PresetError, listing, merged, parse_presets, refusal

GIB = 1024**3
SESSION_MAX = {"cpu": 4.0, "mem": 8 * GIB, "fgpu": 2.0}


def test_presets_parse_with_sizes_and_a_default_fgpu():
    parsed = parse_presets(
        [{"name": " CPU small ", "cpu": 1, "mem": "2G"}, {"name": "half GPU", "cpu": "2",
          "mem": 4 * GIB, "fgpu": 1}], "site"
    )  # fmt: skip
    assert parsed == (Preset("CPU small", 1.0, 2 * GIB, 0.0), Preset("half GPU", 2.0, 4 * GIB, 1.0))
    assert parse_presets(None, "site") == ()


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"name": "x"}, "must be a list"),
        (["x"], "preset 1: must be a mapping"),
        ([{"name": "x", "cpu": 1, "mem": "1G", "gpu": 1}], "unknown key"),
        ([{"cpu": 1, "mem": "1G"}], "name must be text"),
        ([{"name": "x" * 41, "cpu": 1, "mem": "1G"}], "name must be text"),
        ([{"name": "x", "cpu": "lots", "mem": "1G"}], r"preset 1 \(x\)"),
        ([{"name": "x", "cpu": 1, "mem": "1G", "fgpu": float("inf")}], "not an amount"),
        ([{"name": "x", "cpu": 0, "mem": "1G"}], "above zero"),
        ([{"name": "x", "cpu": 1, "mem": "1G"}] * 2, "given twice: x"),
    ],
)
def test_a_malformed_preset_is_named(data, fragment):
    with pytest.raises(PresetError, match=fragment):
        parse_presets(data, "group ml")


def test_a_groups_preset_joins_the_sites_and_replaces_one_of_its_name():
    site = (Preset("small", 1, GIB), Preset("GPU", 1, GIB, 1))
    groups = {"ml": (Preset("GPU", 2, 4 * GIB, 2),), "art": (Preset("paint", 1, GIB),)}
    assert [(p.name, p.fgpu) for p in merged(site, groups)] == [
        ("small", 0),
        ("paint", 0),
        ("GPU", 2),
    ]


def test_a_preset_above_the_quota_or_one_sessions_limit_is_unavailable_with_the_reason():
    quota = {"cpu": None, "mem": None, "fgpu": 1.0}
    assert refusal(Preset("half", 1, GIB, 1), quota, SESSION_MAX) is None
    assert refusal(Preset("two", 1, GIB, 2), quota, SESSION_MAX) == (
        "Needs 2 fGPU; your quota allows 1 fGPU in all."
    )
    assert refusal(Preset("wide", 8, GIB), quota, SESSION_MAX) == (
        "Needs 8 cores; one session may have at most 4 cores."
    )
    assert refusal(Preset("gpu", 1, GIB, 1), {}, {**SESSION_MAX, "fgpu": 0}) == (
        "This hub offers no fGPU."
    )
    rows = listing([Preset("half", 1, GIB, 1), Preset("two", 1, GIB, 2)], quota, SESSION_MAX)
    assert [(r["name"], r["available"], bool(r["reason"])) for r in rows] == [
        ("half", True, False),
        ("two", False, True),
    ]
