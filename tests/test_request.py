import math

import pytest

from fgpu_spawner.request import InvalidRequest, Range, RequestLimits, parse_request
from image_catalog.catalog import parse_catalog

GIB = 1024**3

CATALOG = parse_catalog(
    {
        "images": [
            {"name": "base", "image": "fgpu/base:1"},
            {"name": "sk", "image": "fgpu/sk:1.5", "framework": "scikit-learn"},
            {"name": "secret", "image": "fgpu/secret:1", "hidden": True},
        ]
    }
)
LIMITS = RequestLimits(
    cpu=Range(0.5, 4, 1), mem=Range(256 * 1024**2, 8 * GIB, 2 * GIB), fgpu=Range(0, 0, 0)
)
GPU_LIMITS = RequestLimits(cpu=LIMITS.cpu, mem=LIMITS.mem, fgpu=Range(0, 2, 0))


def test_empty_options_give_the_defaults():
    request = parse_request({}, LIMITS, CATALOG)
    assert (request.image_name, request.image) == ("base", "fgpu/base:1")
    assert (request.cpu, request.mem, request.fgpu) == (1.0, 2 * GIB, 0.0)
    # No resource group named: the queue places it in any the user may use.
    assert request.resource_group is None


def test_form_strings_and_rest_numbers_mean_the_same():
    from_form = parse_request(
        {"image": "sk", "cpu": "1.5", "mem": "1G", "fgpu": "0"}, LIMITS, CATALOG
    )
    from_api = parse_request({"image": "sk", "cpu": 1.5, "mem": GIB, "fgpu": 0}, LIMITS, CATALOG)
    assert from_form == from_api
    assert (from_form.cpu, from_form.mem, from_form.image) == (1.5, GIB, "fgpu/sk:1.5")


def test_configured_default_image_is_used():
    limits = RequestLimits(LIMITS.cpu, LIMITS.mem, LIMITS.fgpu, default_image="sk")
    assert parse_request({}, limits, CATALOG).image_name == "sk"


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"cpu": -1}, "greater than zero"),
        ({"cpu": 0}, "greater than zero"),
        ({"cpu": "0"}, "greater than zero"),
        ({"cpu": math.nan}, "finite"),
        ({"cpu": "nan"}, "finite"),
        ({"cpu": "inf"}, "finite"),
        ({"cpu": "lots"}, "must be a number"),
        ({"cpu": True}, "must be a number"),
        ({"cpu": [1]}, "must be a number"),
        ({"cpu": 0.25}, "at least 0.5 cores"),
        ({"cpu": 64}, "limited to 4 cores"),
        ({"mem": 0}, "greater than zero"),
        ({"mem": "-1G"}, "not a size"),
        ({"mem": "lots"}, "not a size"),
        ({"mem": "nanG"}, "not a size"),
        ({"mem": "1M"}, "at least 256M"),
        ({"mem": "64G"}, "limited to 8G"),
        ({"fgpu": -0.5}, "greater than zero"),
        ({"fgpu": 1}, "offers no fGPU"),
        ({"fgpu": "NaN"}, "finite"),
        ({"cpu": 10**400}, "must be a number"),
        ({"mem": "9" * 400 + "G"}, "too large"),
        ({"image": "nope"}, "Unknown image 'nope'"),
        ({"image": "secret"}, "not offered"),
        ({"image": 3}, "catalog name"),
        ({"gpus": 1}, "Unknown option(s): gpus"),
        ({"resource_group": 7}, "resource_group must be the name"),
    ],
)
def test_bad_input_is_refused_with_a_message(options, fragment):
    with pytest.raises(InvalidRequest) as refused:
        parse_request(options, LIMITS, CATALOG)
    assert fragment in str(refused.value)


def test_unknown_image_message_lists_the_choices_but_not_hidden_ones():
    with pytest.raises(InvalidRequest) as refused:
        parse_request({"image": "nope"}, LIMITS, CATALOG)
    assert "base, sk" in str(refused.value)
    assert "secret" not in str(refused.value)


def test_fgpu_within_the_limit_is_accepted_where_offered():
    request = parse_request({"fgpu": "0.5", "resource_group": "a100"}, GPU_LIMITS, CATALOG)
    assert (request.fgpu, request.resource_group) == (0.5, "a100")


def test_fgpu_above_the_limit_is_refused():
    with pytest.raises(InvalidRequest, match="limited to 2"):
        parse_request({"fgpu": 3}, GPU_LIMITS, CATALOG)


def test_non_object_options_are_refused():
    with pytest.raises(InvalidRequest, match="JSON object"):
        parse_request(["cpu"], LIMITS, CATALOG)


# -- issue 11, item 10: a launch's start names the queue record made for it ---------------------


def test_a_request_key_names_the_queue_record_of_the_start():
    key = "0123456789abcdef" * 2
    request = parse_request({"image": "sk", "request_key": key}, LIMITS, CATALOG)
    assert request.request_key == key
    # Without one, the spawner picks its own key.
    assert parse_request({"image": "sk"}, LIMITS, CATALOG).request_key is None


@pytest.mark.parametrize(
    "key",
    ["", "0123456789ABCDEF" * 2, "0" * 31, "0" * 33, "../" + "0" * 29, "g" * 32, 12345, ["0" * 32]],
)
def test_a_malformed_request_key_is_refused(key):
    with pytest.raises(InvalidRequest, match="request_key must be 32 lowercase hex digits"):
        parse_request({"request_key": key}, LIMITS, CATALOG)
