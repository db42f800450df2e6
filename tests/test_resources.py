"""image_catalog.resources: an image's min/default/max bounds."""

import pytest

from image_catalog.resources import ImageResources, ResourceError, parse_resources


def test_bounds_parse_sizes_and_round_trip():
    resources = parse_resources({"min": {"cpu": 1, "mem": "512M"}, "max": {"mem": "4G", "fgpu": 2}})
    assert resources.min.mem == 512 * 1024**2
    assert resources.to_dict() == {
        "min": {"cpu": 1.0, "mem": 512 * 1024**2},
        "default": {},
        "max": {"mem": 4 * 1024**3, "fgpu": 2.0},
    }
    assert parse_resources(resources.to_dict()) == resources
    assert parse_resources(None) == ImageResources()


def test_shortfall_names_the_slot_and_both_amounts():
    resources = parse_resources({"min": {"cpu": 2, "mem": "1G"}, "max": {"fgpu": 1}})
    assert resources.shortfall(2, 1024**3, 0) is None
    assert resources.shortfall(1, 1024**3, 0) == "needs at least 2 CPU cores; 1 CPU cores was asked"
    assert "at least 1 GiB of memory; 512 MiB" in resources.shortfall(2, 512 * 1024**2, 0)
    assert resources.shortfall(2, 1024**3, 1.5) == "allows at most 1 fGPU; 1.5 fGPU was asked"


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"min": {"cpu": 4}, "max": {"cpu": 2}}, "the min 4 CPU cores exceeds the max 2 CPU cores"),
        (
            {"min": {"mem": "2G"}, "default": {"mem": "1G"}},
            "min 2 GiB of memory exceeds the default",
        ),
        ({"default": {"fgpu": 3}, "max": {"fgpu": 1}}, "default 3 fGPU exceeds the max"),
        ({"min": {"cpu": -1}}, "positive number"),
        ({"min": {"cpu": "nan"}}, "positive number"),
        ({"min": {"cpu": True}}, "must be a number"),
        ({"min": {"mem": "lots"}}, "not a size"),
        ({"min": {"gpu": 1}}, "unknown slot(s) gpu"),
        ({"least": {}}, "unknown level(s) least"),
        ([1], "must be a mapping"),
    ],
)
def test_contradictory_or_malformed_bounds_are_refused(data, fragment):
    with pytest.raises(ResourceError) as refused:
        parse_resources(data)
    assert fragment in str(refused.value)
