"""The launch options both sides judge (image_catalog/launch_options.py): names, env, presets."""

from __future__ import annotations

import re

import pytest
from jupyterhub.slugs import is_valid_safe_slug

from image_catalog.catalog import parse_catalog
from image_catalog.launch_options import (
    ENV_MAX_BYTES,
    ENV_MAX_COUNT,
    FOLDERS_MAX,
    OptionError,
    check_env,
    check_folders,
    check_name,
    resolve_preset,
    with_defaults,
)

NAMES = ["a", "mnist", "run-2", "x9", "a" * 30, "a" * 31, "Big", "-a", "a-", "a--b", "9a",
         "a_b", "a b", "é", "a/b", "s-1a2b3c"]  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_a_name_is_allowed_exactly_when_the_hub_allows_it_as_a_server_name(name):
    try:
        allowed = check_name(name) == name
    except OptionError as e:
        assert "lowercase letters" in str(e)
        allowed = False
    assert allowed == is_valid_safe_slug(name)


def test_no_name_is_none_and_a_non_string_is_refused():
    assert check_name(None) is None and check_name("  ") is None
    with pytest.raises(OptionError, match="must be a string"):
        check_name(5)


def test_env_keeps_good_variables():
    assert check_env(None) == {}
    assert check_env({"SEED": "1", "my_var": ""}) == {"SEED": "1", "my_var": ""}


@pytest.mark.parametrize(
    "env, fragment",
    [
        ([("A", "1")], "must be an object"),
        ({"1A": "x"}, "not a variable name"),
        ({"A-B": "x"}, "not a variable name"),
        ({"": "x"}, "not a variable name"),
        ({"A": 1}, "must be a string"),
        ({"A": "x\0y"}, "without NUL"),
        ({"PATH": "/tmp"}, "set by the hub"),
        ({"home": "/tmp"}, "set by the hub"),
        ({"JUPYTERHUB_API_TOKEN": "x"}, "set by the hub"),
        ({"FGPU_FGPU": "8"}, "set by the hub"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, "set by the hub"),
        ({"CUDA_DEVICE_MEMORY_LIMIT_0": "80g"}, "set by the hub"),
        ({"CUDA_DEVICE_SM_LIMIT": "100"}, "set by the hub"),
        ({"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/x"}, "set by the hub"),
        ({"CUDA_DISABLE_CONTROL": "true"}, "set by the hub"),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, "set by the hub"),
        ({"LD_PRELOAD": ""}, "set by the hub"),
        ({"ld_library_path": "/x"}, "set by the hub"),
        ({"MEM_LIMIT": "1"}, "set by the hub"),
        ({f"V{i}": "x" for i in range(ENV_MAX_COUNT + 1)}, f"at most {ENV_MAX_COUNT}"),
        ({"BIG": "x" * ENV_MAX_BYTES}, f"at most {ENV_MAX_BYTES} are allowed"),
    ],
)
def test_a_bad_env_is_refused_with_a_message(env, fragment):
    with pytest.raises(OptionError, match=fragment):
        check_env(env)


PRESETS = [
    {"name": "CPU small", "cpu": 1.0, "mem": 2 * 1024**3, "fgpu": 0.0, "available": True,
     "reason": ""},
    {"name": "big", "cpu": 4.0, "mem": 8 * 1024**3, "fgpu": 8.0, "available": False,
     "reason": "Needs 8 fGPU; your quota allows 4 fGPU in all."},
]  # fmt: skip


def test_a_preset_stands_for_its_slots():
    resolved = resolve_preset({"image": "x", "preset": "CPU small"}, PRESETS)
    assert resolved == {"image": "x", "cpu": 1.0, "mem": 2 * 1024**3, "fgpu": 0.0}
    assert resolve_preset({"image": "x", "preset": ""}, PRESETS) == {"image": "x"}


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"preset": "CPU small", "cpu": 2}, "leave out cpu"),
        ({"preset": "CPU small", "mem": "1G", "fgpu": 0}, "leave out fgpu, mem"),
        ({"preset": "huge"}, "Unknown preset 'huge'. Presets offered to you: CPU small, big"),
        ({"preset": "big"}, "not available to you: Needs 8 fGPU; your quota allows 4 fGPU"),
    ],
)
def test_a_bad_preset_is_refused_with_a_message(options, fragment):
    with pytest.raises(OptionError, match=fragment):
        resolve_preset(options, PRESETS)


def test_folders_are_a_list_or_a_forms_comma_text_kept_once_each_in_order():
    assert check_folders(None) == () and check_folders("") == ()
    assert check_folders(["data", ".cache", "data"]) == ("data", ".cache")
    assert check_folders("data, course material") == ("data", "course material")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"data": 1}, "list of folder names"),
        ([""], "list of folder names"),
        ([3], "list of folder names"),
        (["a/b"], "no '/'"),
        (["x" * 65], "at most 64"),
        ([f"f{i}" for i in range(FOLDERS_MAX + 1)], f"at most {FOLDERS_MAX}"),
    ],
)
def test_bad_folders_are_refused_with_why(value, says):
    with pytest.raises(OptionError, match=re.escape(says)):
        check_folders(value)


# -- what a launch leaves out (with_defaults) ---------------------------------------------------

OFFERED = parse_catalog(
    {
        "images": [
            {"name": "py", "image": "fgpu/py:1"},
            {"name": "tf", "image": "fgpu/tf:1", "resources": {"min": {"mem": "2G"}}},
        ]
    }
).images
LIMITS = {"cpu_default": 1.0, "mem_default": 2 * 2**30}
CANDIDATES = [
    {"name": "tiny", "cpu": 0.5, "mem": 512 * 2**20, "fgpu": 0, "available": True},
    {"name": "gpu", "cpu": 0.5, "mem": 2**30, "fgpu": 1, "available": True},
    {"name": "big", "cpu": 2, "mem": 4 * 2**30, "fgpu": 0, "available": True},
]


def test_nothing_given_takes_the_first_offered_image_and_the_smallest_preset_without_a_gpu():
    assert with_defaults({}, list(OFFERED), CANDIDATES, LIMITS) == {
        "image": "py", "cpu": 0.5, "mem": 512 * 2**20, "fgpu": 0,
    }  # fmt: skip


def test_the_marked_image_is_taken_where_offered_and_its_minimum_picks_the_preset():
    marked = {**LIMITS, "default_image_name": "tf"}
    assert with_defaults({}, list(OFFERED), CANDIDATES, marked)["cpu"] == 2
    gone = {**LIMITS, "default_image_name": "gone"}
    assert with_defaults({}, list(OFFERED), CANDIDATES, gone)["image"] == "py"


def test_what_is_given_is_kept_and_slots_given_take_no_preset():
    given = {"image": "tf", "mem": "3G"}
    assert with_defaults(given, list(OFFERED), CANDIDATES, LIMITS) == given
    assert with_defaults({"preset": "big"}, list(OFFERED), CANDIDATES, LIMITS) == {
        "preset": "big", "image": "py",
    }  # fmt: skip


def test_with_no_usable_preset_the_images_defaults_then_the_hubs_and_no_gpu():
    own = parse_catalog(
        {"images": [{"name": "x", "image": "fgpu/x:1", "resources": {"default": {"mem": "3G"}}}]}
    ).images
    assert with_defaults({}, list(own), [CANDIDATES[1]], LIMITS) == {
        "image": "x", "cpu": 1.0, "mem": 3 * 2**30, "fgpu": 0,
    }  # fmt: skip
    assert with_defaults({}, [], [], LIMITS) == {"cpu": 1.0, "mem": 2 * 2**30, "fgpu": 0}
