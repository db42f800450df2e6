import json
import re

from fgpu_spawner.form import options_from_form, render_spawn_form
from fgpu_spawner.request import Range, RequestLimits
from fgpu_spawner.resource_groups import GroupOffer
from image_catalog.catalog import parse_catalog

GIB = 1024**3
CATALOG = parse_catalog(
    {
        "images": [
            {"name": "base", "image": "fgpu/base:1", "display_name": "Python"},
            {"name": "sk", "image": "fgpu/sk:1.5", "display_name": "scikit-learn 1.5"},
            {"name": "secret", "image": "fgpu/secret:1", "hidden": True},
        ]
    }
)
LIMITS = RequestLimits(
    cpu=Range(0.5, 4, 1),
    mem=Range(256 * 1024**2, 8 * GIB, 2 * GIB),
    fgpu=Range(0, 0, 0),
    default_image="sk",
)


def test_form_offers_visible_images_with_the_default_selected():
    html = render_spawn_form(LIMITS, CATALOG)
    assert re.findall(r'<option value="([^"]+)"', html) == ["base", "sk"]
    assert re.search(r'value="sk"[^>]*selected', html)


def test_form_sliders_carry_the_configured_limits():
    html = render_spawn_form(LIMITS, CATALOG)
    cpu = re.search(r'<input type="range"[^>]*name="cpu"[^>]*>', html, re.S).group(0)
    assert 'min="0.5"' in cpu and 'max="4' in cpu and 'value="1' in cpu
    assert re.search(r'name="mem" value="2 GiB"', html)
    assert "Between 256 MiB and 8 GiB" in html


def test_fgpu_field_is_disabled_when_the_hub_offers_none():
    html = render_spawn_form(LIMITS, CATALOG)
    assert 'name="fgpu"' not in html
    assert "disabled" in html


def test_fgpu_slider_appears_when_offered():
    limits = RequestLimits(LIMITS.cpu, LIMITS.mem, Range(0, 2, 0.5))
    html = render_spawn_form(limits, CATALOG, units_per_gpu=2, simulated=True)
    assert re.search(r'name="fgpu"[^>]*max="2', html)
    assert "1/2 of a GPU" in html and "simulated" in html


def test_the_shown_figures_read_as_the_sessions_dialogs():
    """ "1 core" and "0.5 fGPU", never "1.0 cores" or "0.0 fGPU"."""
    limits = RequestLimits(LIMITS.cpu, LIMITS.mem, Range(0, 2, 0.5))
    html = render_spawn_form(limits, CATALOG, units_per_gpu=2)
    assert re.search(r'id="fgpu-cpu-value"[^>]*>1 core<', html)
    assert re.search(r'id="fgpu-fgpu-value"[^>]*>0.5 fGPU<', html)
    zero = render_spawn_form(RequestLimits(LIMITS.cpu, LIMITS.mem, Range(0, 2, 0)), CATALOG)
    assert re.search(r'id="fgpu-fgpu-value"[^>]*>0 fGPU<', zero)


def test_form_values_are_flattened_and_xsrf_dropped():
    data = {"image": ["sk"], "cpu": ["1.5"], "mem": ["1G"], "_xsrf": ["x"], "extra": ["1"]}
    assert options_from_form(data) == {"image": "sk", "cpu": "1.5", "mem": "1G", "extra": "1"}


def test_previous_choices_are_shown_again():
    previous = {"image": "base", "cpu": "2.5", "mem": "lots"}
    html = render_spawn_form(LIMITS, CATALOG, previous=previous)
    assert re.search(r'value="base"[^>]*selected', html)
    assert re.search(r'name="cpu"[^>]*value="2.5"', html)
    # What was typed comes back as typed, so the student can correct it.
    assert 'name="mem" value="lots"' in html


def test_previous_values_outside_the_limits_fall_back_to_defaults():
    previous = {"image": "secret", "cpu": "99", "mem": "64G"}
    html = render_spawn_form(LIMITS, CATALOG, previous=previous)
    assert re.search(r'value="sk"[^>]*selected', html)
    assert re.search(r'name="cpu"[^>]*value="1"', html)
    assert re.search(r'id="fgpu-mem-slider"[^>]*value="8.0"', html)


A100 = GroupOffer("gpu-a100", 12.0, 40 * GIB, 3.0, has_gpus=True)
CPU_ONLY = GroupOffer("cpu-only", 2.0, 4 * GIB, 0.0, has_gpus=False)


def group_options(html: str) -> list[tuple[str, bool, str]]:
    select = re.search(r'<select[^>]*name="resource_group".*?</select>', html, re.S).group(0)
    return [
        (value, bool(selected), text.strip())
        for value, selected, text in re.findall(
            r'<option value="([^"]+)"[^>]*?( selected)?>([^<]*)</option>', select
        )
    ]


def test_two_groups_or_more_are_offered_with_what_is_free_the_first_preselected():
    html = render_spawn_form(LIMITS, CATALOG, resource_groups=[A100, CPU_ONLY])
    assert group_options(html) == [
        ("gpu-a100", True, "gpu-a100 — 3 fGPU, 12 CPU, 40 GiB free"),
        ("cpu-only", False, "cpu-only — 2 CPU, 4 GiB free"),
    ]


def test_the_previous_group_is_preselected_while_it_may_still_be_used():
    chosen = render_spawn_form(
        LIMITS, CATALOG, previous={"resource_group": "cpu-only"}, resource_groups=[A100, CPU_ONLY]
    )
    assert [selected for _, selected, _ in group_options(chosen)] == [False, True]
    gone = render_spawn_form(
        LIMITS, CATALOG, previous={"resource_group": "vip"}, resource_groups=[A100, CPU_ONLY]
    )
    assert [selected for _, selected, _ in group_options(gone)] == [True, False]


def test_one_group_is_named_as_plain_text_and_sends_nothing():
    html = render_spawn_form(LIMITS, CATALOG, resource_groups=[A100])
    assert 'name="resource_group"' not in html
    line = re.search(r'id="fgpu-group-line">([^<]*)<', html).group(1)
    assert line == "gpu-a100 — 3 fGPU, 12 CPU, 40 GiB free"


def test_without_groups_the_form_is_as_before():
    html = render_spawn_form(LIMITS, CATALOG)
    assert "resource_group" not in html and "Resource group" not in html


def resources_answer(cpu=2.0, mem=4 * GIB, fgpu=2.0, free=None, groups=None) -> dict:
    """An api/resources answer for a user, as the queue service gives it."""
    capacity = {"cpu": cpu, "mem": mem, "fgpu": fgpu}
    free = free or capacity
    return {
        "capacity": capacity,
        "allocatable": free,
        "units_per_gpu": 2,
        "resource_groups": groups
        or {"default": {"capacity": capacity, "allocatable": free, "allowed": True}},
    }


GPU_LIMITS = RequestLimits(LIMITS.cpu, LIMITS.mem, Range(0, 4, 0))


def slider(html: str, name: str) -> str:
    return re.search(rf'<input type="range"[^>]*id="{name}"[^>]*>', html, re.S).group(0)


def test_sliders_stop_at_what_the_cluster_can_ever_grant():
    # A 2-fGPU hub with 2 cores and 4G: one session may ask 4 fGPU, 4 cores and 8G by the site's
    # limits, but nothing here could ever grant that.
    html = render_spawn_form(GPU_LIMITS, CATALOG, resources=resources_answer())
    assert 'max="2.0"' in slider(html, "fgpu-fgpu")
    assert 'max="2.0"' in slider(html, "fgpu-cpu")
    assert 'max="4.0"' in slider(html, "fgpu-mem-slider")
    # The default memory (2G) fits; the help names the clamped range.
    assert 'name="mem" value="2 GiB"' in html and "Between 256 MiB and 4 GiB" in html


def test_the_largest_group_the_user_may_use_sets_the_ceiling():
    small = {"cpu": 1.0, "mem": GIB, "fgpu": 1.0}
    big = {"cpu": 3.0, "mem": 6 * GIB, "fgpu": 3.0}
    huge = {"cpu": 64.0, "mem": 512 * GIB, "fgpu": 16.0}
    groups = {
        "small": {"capacity": small, "allocatable": small, "allowed": True},
        "big": {"capacity": big, "allocatable": big, "allowed": True},
        "vip": {"capacity": huge, "allocatable": huge, "allowed": False},
    }
    html = render_spawn_form(GPU_LIMITS, CATALOG, resources=resources_answer(groups=groups))
    assert 'max="3.0"' in slider(html, "fgpu-fgpu")
    assert 'max="3.0"' in slider(html, "fgpu-cpu")
    assert 'max="6.0"' in slider(html, "fgpu-mem-slider")


def test_without_the_service_the_site_limits_stand_and_a_note_says_why():
    html = render_spawn_form(GPU_LIMITS, CATALOG, note="The queue service did not answer.")
    assert 'max="4' in slider(html, "fgpu-fgpu")
    assert re.search(r'id="fgpu-form-note"[^>]*>The queue service did not answer.<', html)
    assert 'id="fgpu-free"' not in html


def test_the_note_names_what_is_missing():
    from fgpu_spawner.form import unavailable_note

    assert unavailable_note([]) == ""
    note = unavailable_note(["the images", "what is free for you", "the presets"])
    assert note.startswith(
        "The queue service did not answer, so the images, what is free for you and the presets "
        "could not be shown here"
    )


PRESETS = [
    {"name": "CPU small", "cpu": 1.0, "mem": GIB, "fgpu": 0.0, "available": True, "reason": ""},
    {
        "name": "half GPU",
        "cpu": 2.0,
        "mem": 4 * GIB,
        "fgpu": 1.0,
        "available": True,
        "reason": "",
    },
    {
        "name": "whole node",
        "cpu": 8.0,
        "mem": 32 * GIB,
        "fgpu": 4.0,
        "available": False,
        "reason": "Needs 8 cores; one session may have at most 4 cores.",
    },
]


def preset_rows(html: str) -> list[tuple[str, bool, str]]:
    rows = re.findall(
        r'<input class="form-check-input" type="radio" name="preset" [^>]*value="([^"]*)"'
        r"([^>]*)>\s*<label[^>]*>(.*?)</label>",
        html,
        re.S,
    )
    return [
        (value, "disabled" in attrs, re.sub(r"<[^>]+>", " | ", text)) for value, attrs, text in rows
    ]


def test_presets_are_listed_beside_custom_those_off_limits_disabled_with_the_reason():
    html = render_spawn_form(GPU_LIMITS, CATALOG, presets=PRESETS)
    assert preset_rows(html) == [
        ("", False, "Custom: the sliders below"),
        ("CPU small", False, "CPU small — 1 core, 1 GiB"),
        ("half GPU", False, "half GPU — 2 cores, 4 GiB, 1 fGPU"),
        (
            "whole node",
            True,
            "whole node — 8 cores, 32 GiB, 4 fGPU | Not available: Needs 8 cores; one session may "
            "have at most 4 cores. | ",
        ),
    ]
    assert re.search(r'id="fgpu-preset-custom" value=""\s*checked', html)
    # The browser fills the sliders from the preset's slots.
    assert 'value="half GPU"\n        data-cpu="2.0" data-mem="4294967296" data-fgpu="1.0"' in html


def test_the_previous_preset_is_picked_again_while_it_is_available():
    html = render_spawn_form(GPU_LIMITS, CATALOG, presets=PRESETS, previous={"preset": "half GPU"})
    assert re.search(r'value="half GPU"[^>]*checked', html)
    gone = render_spawn_form(
        GPU_LIMITS, CATALOG, presets=PRESETS, previous={"preset": "whole node"}
    )
    assert re.search(r'id="fgpu-preset-custom" value=""\s*checked', gone)


def test_no_presets_no_choice():
    assert 'name="preset"' not in render_spawn_form(GPU_LIMITS, CATALOG, presets=[])


def free_data(html: str) -> dict:
    return json.loads(re.search(r'id="fgpu-free">(.*?)</script>', html, re.S).group(1))


def test_the_warning_reads_what_is_free_for_the_user_now_in_all_and_per_group():
    free = {"cpu": 1.5, "mem": 3 * GIB, "fgpu": 1.0}
    full = {"cpu": 0, "mem": 0, "fgpu": 0}
    groups = {
        "default": {"capacity": free, "allocatable": free, "allowed": True},
        "vip": {"capacity": free, "allocatable": full, "allowed": False},
    }
    html = render_spawn_form(
        GPU_LIMITS, CATALOG, resources=resources_answer(free=free, groups=groups)
    )
    figures = {
        "amount": {"cpu": 1.5, "mem": 3 * GIB, "fgpu": 1.0},
        "text": {"cpu": "1.5 cores", "mem": "3 GiB", "fgpu": "1 fGPU"},
    }
    assert free_data(html) == {"": figures, "default": figures}
    assert re.search(r'id="fgpu-form-warning"[^>]*role="status"', html)


def test_a_preset_sends_the_preset_alone_and_custom_sends_the_sliders():
    data = {"image": ["sk"], "preset": ["half GPU"], "cpu": ["1"], "mem": ["2G"], "fgpu": ["0"]}
    assert options_from_form(data) == {"image": "sk", "preset": "half GPU"}
    data["preset"] = [""]
    assert options_from_form(data) == {"image": "sk", "cpu": "1", "mem": "2G", "fgpu": "0"}


def test_env_lines_become_an_object_and_come_back_as_lines():
    data = {"image": ["sk"], "env": ["SEED=42\r\n\r\nMODE=a=b\nFLAG\n"]}
    env = {"SEED": "42", "MODE": "a=b", "FLAG": ""}
    assert options_from_form(data) == {"image": "sk", "env": env}
    assert options_from_form({"image": ["sk"], "env": ["  \n"]}) == {"image": "sk"}
    html = render_spawn_form(LIMITS, CATALOG, previous={"env": env})
    assert ">SEED=42\nMODE=a=b\nFLAG=</textarea>" in html


def folder(name, own=True, owner="ann", permission="rw", folder_id=None):
    return {
        "id": folder_id or name.encode().hex().ljust(32, "0")[:32],
        "name": name,
        "owner": owner,
        "own": own,
        "automount": name.startswith("."),
        "permission": permission,
        "size_bytes": 0,
    }


FOLDERS = [
    folder("course", own=False, owner="teach", permission="ro", folder_id="c" * 32),
    folder(".local", folder_id="l" * 32),
    folder("work", folder_id="w" * 32),
    folder("data", folder_id="d" * 32),
    folder("team", own=False, owner="bob", permission="rw", folder_id="t" * 32),
]


def folder_boxes(html: str) -> list[tuple[str, str]]:
    """(value, label text) of each folder checkbox, in order."""
    return [
        (value, " ".join(re.sub(r"<[^>]+>", "", label).split()))
        for value, label in re.findall(
            r'name="folders" id="[^"]+" value="([^"]+)"[^>]*>\s*<label[^>]*>(.*?)</label>',
            html,
            re.S,
        )
    ]


def test_the_folder_picker_offers_own_folders_first_then_shared_ones_but_not_automount_ones():
    html = render_spawn_form(LIMITS, CATALOG, folders=FOLDERS)
    assert folder_boxes(html) == [
        ("d" * 32, "data"),
        ("w" * 32, "work"),
        ("t" * 32, "team (shared by bob)"),
        ("c" * 32, "course (shared by teach, read-only)"),
    ]
    assert re.search(r'id="fgpu-folders-always">Always mounted: .local \(at ~/.local\)<', html)
    assert "~/folders/&lt;name&gt;" in html
    assert 'id="fgpu-folder-warning"' in html and "Launch without storage folder" in html


def test_the_previous_folders_are_ticked_again_by_id_or_name():
    html = render_spawn_form(
        LIMITS, CATALOG, folders=FOLDERS, previous={"folders": ["work", "c" * 32]}
    )
    ticked = re.findall(r'name="folders" id="[^"]+" value="([^"]+)" checked', html)
    assert ticked == ["w" * 32, "c" * 32]


def test_no_folders_no_boxes_and_a_service_that_did_not_answer_is_said():
    none = render_spawn_form(LIMITS, CATALOG, folders=[folder(".cache")])
    assert folder_boxes(none) == [] and "You have no storage folders to mount." in none
    assert "Always mounted: .cache (at ~/.cache)" in none
    unknown = render_spawn_form(LIMITS, CATALOG, folders=None)
    assert folder_boxes(unknown) == []
    assert "Your storage folders cannot be listed now" in unknown
    assert "Always mounted" not in unknown


def test_checked_folders_become_one_list_and_none_checked_sends_none():
    data = {"image": ["sk"], "folders": ["d" * 32, "c" * 32], "_xsrf": ["x"]}
    assert options_from_form(data) == {"image": "sk", "folders": ["d" * 32, "c" * 32]}
    assert options_from_form({"image": ["sk"], "folders": ["d" * 32]})["folders"] == ["d" * 32]
    assert options_from_form({"image": ["sk"]}) == {"image": "sk"}
    assert options_from_form({"image": ["sk"], "folders": [""]}) == {"image": "sk"}
