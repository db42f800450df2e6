import math

import pytest

from fgpu_spawner.request import InvalidRequest, Range, RequestLimits, parse_request
from image_catalog.catalog import Catalog, parse_catalog

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


def test_options_with_only_an_image_give_the_defaults():
    request = parse_request({"image": "base"}, LIMITS, CATALOG)
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


@pytest.mark.parametrize("image", [None, "", "  "])
def test_a_launch_that_names_no_image_gets_the_marked_default_where_the_user_may_start_it(image):
    """One rule for the form, the hub's REST API and the admin panel's Start button, which sends
    no options at all (docs/source/explanation/sessions-and-queue.md, "Launch options")."""
    options = {} if image is None else {"image": image}
    marked = RequestLimits(LIMITS.cpu, LIMITS.mem, LIMITS.fgpu, default_image="sk")
    assert parse_request(options, marked, CATALOG).image_name == "sk"
    # No mark, or one the user may not start (hidden, or gone): the first image offered.
    for default in (None, "secret", "gone"):
        limits = RequestLimits(LIMITS.cpu, LIMITS.mem, LIMITS.fgpu, default_image=default)
        assert parse_request(options, limits, CATALOG).image_name == "base"


def test_with_no_image_offered_a_launch_is_refused_with_what_to_do():
    nothing = Catalog(())
    with pytest.raises(InvalidRequest, match="No image is offered to you yet; ask your instructor"):
        parse_request({}, LIMITS, nothing)


DEFAULT_CANDIDATES = [
    {"name": "big", "cpu": 2, "mem": 4 * GIB, "fgpu": 0, "available": True},
    {"name": "gpu", "cpu": 0.5, "mem": GIB, "fgpu": 1, "available": True},
    {"name": "over quota", "cpu": 0.5, "mem": 512 * 1024**2, "fgpu": 0, "available": False},
    {"name": "small", "cpu": 1, "mem": GIB, "fgpu": 0, "available": True},
]


def test_a_launch_that_gives_no_slots_gets_the_smallest_usable_preset_without_a_gpu():
    request = parse_request({}, GPU_LIMITS, CATALOG, DEFAULT_CANDIDATES)
    assert (request.image_name, request.cpu, request.mem, request.fgpu) == ("base", 1, GIB, 0)
    # With slots given, no preset is taken: the rest come from the image and the hub.
    request = parse_request(
        {"image": "base", "mem": "512M"}, GPU_LIMITS, CATALOG, DEFAULT_CANDIDATES
    )
    assert (request.cpu, request.mem, request.fgpu) == (1.0, 512 * 1024**2, 0.0)


def test_without_a_usable_preset_a_launch_of_no_slots_gets_the_defaults_and_no_gpu():
    gpu_default = parse_catalog(
        {"images": [{"name": "g", "image": "fgpu/g:1", "resources": {"default": {"fgpu": 1}}}]}
    )
    only_gpu = [p for p in DEFAULT_CANDIDATES if p["fgpu"] or not p["available"]]
    request = parse_request({}, GPU_LIMITS, gpu_default, only_gpu)
    assert (request.cpu, request.mem, request.fgpu) == (1.0, 2 * GIB, 0.0)


def test_the_default_preset_meets_the_images_minimum():
    hungry = parse_catalog(
        {"images": [{"name": "h", "image": "fgpu/h:1", "resources": {"min": {"mem": "2G"}}}]}
    )
    request = parse_request({}, GPU_LIMITS, hungry, DEFAULT_CANDIDATES)
    assert (request.cpu, request.mem) == (2, 4 * GIB)


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
        ({"mem": "1M"}, "at least 256 MiB"),
        ({"mem": "64G"}, "limited to 8 GiB"),
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
        parse_request({"image": "base", **options}, LIMITS, CATALOG)
    assert fragment in str(refused.value)


def test_unknown_image_message_lists_the_choices_but_not_hidden_ones():
    with pytest.raises(InvalidRequest) as refused:
        parse_request({"image": "nope"}, LIMITS, CATALOG)
    assert "base, sk" in str(refused.value)
    assert "secret" not in str(refused.value)


def test_fgpu_within_the_limit_is_accepted_where_offered():
    request = parse_request(
        {"image": "base", "fgpu": "0.5", "resource_group": "a100"}, GPU_LIMITS, CATALOG
    )
    assert (request.fgpu, request.resource_group) == (0.5, "a100")


def test_fgpu_above_the_limit_is_refused():
    with pytest.raises(InvalidRequest, match="limited to 2"):
        parse_request({"image": "base", "fgpu": 3}, GPU_LIMITS, CATALOG)


def test_non_object_options_are_refused():
    with pytest.raises(InvalidRequest, match="JSON object"):
        parse_request(["cpu"], LIMITS, CATALOG)


# -- a launch's start names the queue record made for it ---------------------


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
        parse_request({"image": "base", "request_key": key}, LIMITS, CATALOG)


# -- presets, names and environment variables -------------------------------

PRESETS = [
    {"name": "CPU small", "cpu": 1, "mem": GIB, "fgpu": 0, "available": True, "reason": ""},
    {"name": "wide", "cpu": 64, "mem": GIB, "fgpu": 0, "available": True, "reason": ""},
    {"name": "GPU", "cpu": 1, "mem": GIB, "fgpu": 1, "available": False, "reason": "No fGPU."},
]


def test_a_preset_gives_its_slots():
    request = parse_request({"image": "sk", "preset": "CPU small"}, LIMITS, CATALOG, PRESETS)
    assert (request.cpu, request.mem, request.fgpu) == (1.0, GIB, 0.0)


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"preset": "CPU small", "cpu": "2"}, "leave out cpu"),
        ({"preset": "nope"}, "Unknown preset 'nope'"),
        ({"preset": "GPU"}, "not available to you: No fGPU."),
        # A preset's slots meet the same limits as slots given one by one.
        ({"preset": "wide"}, "CPU is limited to 4 cores"),
    ],
)
def test_a_bad_preset_is_refused(options, fragment):
    with pytest.raises(InvalidRequest, match=fragment):
        parse_request({"image": "sk", **options}, LIMITS, CATALOG, PRESETS)


def test_a_name_must_be_the_servers_own_and_valid():
    named = parse_request({"image": "sk", "name": "mnist"}, LIMITS, CATALOG, server_name="mnist")
    assert named.image_name == "sk"
    with pytest.raises(InvalidRequest, match="differs from server 'other'"):
        parse_request({"image": "sk", "name": "mnist"}, LIMITS, CATALOG, server_name="other")
    with pytest.raises(InvalidRequest, match="lowercase letters"):
        parse_request({"image": "sk", "name": "My Run"}, LIMITS, CATALOG, server_name="x")


def test_env_is_checked_and_kept_in_order():
    request = parse_request({"image": "sk", "env": {"B": "2", "A": "1"}}, LIMITS, CATALOG)
    assert request.env == (("A", "1"), ("B", "2"))
    with pytest.raises(InvalidRequest, match="CUDA_VISIBLE_DEVICES is set by the hub"):
        parse_request({"image": "sk", "env": {"CUDA_VISIBLE_DEVICES": "0"}}, LIMITS, CATALOG)


# --- batch jobs -------------------------------------------------------------------------


def test_a_batch_launch_carries_its_jobs_canonical_text():
    request = parse_request(
        {"image": "base", "type": "batch", "command": " python train.py ", "time_limit": "2h"},
        LIMITS,
        CATALOG,
    )
    assert request.batch
    assert request.job == '{"command":"python train.py","time_limit":7200.0}'
    assert request.to_dict()["job"] == request.job
    interactive = parse_request({"image": "base"}, LIMITS, CATALOG)
    assert (interactive.job, interactive.batch) == (None, False)


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"command": "x"}, 'belong\\(s\\) to a batch job: add "type": "batch"'),
        ({"type": "batch"}, "either a notebook or a command"),
        ({"type": "batch", "notebook": "../x.ipynb"}, "may not leave your home folder"),
        (
            {"type": "batch", "command": "x", "time_limit": 5},
            "a job's time limit is at least 1 min",
        ),
        ({"type": "batch", "notebook": "a.ipynb", "parameters": "{"}, "parameters are not JSON"),
    ],
)
def test_a_bad_job_is_an_invalid_request_with_its_message(options, fragment):
    with pytest.raises(InvalidRequest, match=fragment):
        parse_request({"image": "base", **options}, LIMITS, CATALOG)
