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
    assert re.search(r'name="mem" value="2G"', html)
    assert "Between 256M and 8G" in html


def test_fgpu_field_is_disabled_when_the_hub_offers_none():
    html = render_spawn_form(LIMITS, CATALOG)
    assert 'name="fgpu"' not in html
    assert "disabled" in html


def test_fgpu_slider_appears_when_offered():
    limits = RequestLimits(LIMITS.cpu, LIMITS.mem, Range(0, 2, 0.5))
    html = render_spawn_form(limits, CATALOG, units_per_gpu=2, simulated=True)
    assert re.search(r'name="fgpu"[^>]*max="2', html)
    assert "1/2 of a GPU" in html and "simulated" in html


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
        ("gpu-a100", True, "gpu-a100 — 3 fGPU, 12 CPU, 40G free"),
        ("cpu-only", False, "cpu-only — 2 CPU, 4G free"),
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
    assert line == "gpu-a100 — 3 fGPU, 12 CPU, 40G free"


def test_without_groups_the_form_is_as_before():
    html = render_spawn_form(LIMITS, CATALOG)
    assert "resource_group" not in html and "Resource group" not in html
