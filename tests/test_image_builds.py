"""The heavy images built behind the hub (queue_service/image_builds.py).

The pure part reads the build tool's lines; the rest is a real hub that builds its catalog's
heavy entries with the real build tool: one up to date (TensorFlow 2.15, which scripts/test
builds first), one whose PyTorch wheel is not in the wheel folder (it fails at once and
downloads nothing), and one whose pip step fails on the engine. The Images page shows each, and
the launcher offers only what is on the engine.
"""

from __future__ import annotations

import secrets

import pytest
import yaml
from playwright.sync_api import expect

from image_catalog.catalog import DEFAULT_CATALOG_PATH
from queue_service.image_builds import BuildState, build_command, finish, read_line

from .browser import log_in, screenshot
from .harness import QueueUser, running_hub, wait_until


def test_a_build_is_followed_step_by_step():
    state = BuildState(state="building", started=100.0)
    for line in (
        "tensorflow-2.15-cpu: building fgpu/tensorflow:2.15.1-cpu from fgpu/jupyter-base:py3.11",
        "  Step 1/5 : ARG BASE_IMAGE",
        "",
        "  Step 4/5 : RUN pip install tensorflow-cpu==2.15.1",
        "  Collecting tensorflow-cpu==2.15.1",
    ):
        read_line(state, line)
    assert state.step == "step 4 of 5"
    assert state.last_line == "Collecting tensorflow-cpu==2.15.1"
    finish(state, 0, now=161.04)
    assert (state.state, state.seconds, state.reason) == ("built", 61.0, "")


def test_a_failed_build_keeps_the_tools_reason():
    state = BuildState(state="building", started=0.0)
    read_line(state, "error: pytorch-2.13-cpu: no wheel matching 'torch-*.whl' in /opt/wheels")
    read_line(state, "--- last 2 log lines ---")
    finish(state, 1, now=2.0)
    assert state.state == "failed"
    assert state.reason == "pytorch-2.13-cpu: no wheel matching 'torch-*.whl' in /opt/wheels"


def test_pips_own_error_comes_first():
    state = BuildState(state="building", started=0.0)
    for line in ("error: building x failed: The command returned a non-zero code: 1",
                 "  ERROR: No matching distribution found for tensorflow-cpu==0.0.0"):  # fmt: skip
        read_line(state, line)
    finish(state, 1, now=1.0)
    assert state.reason == (
        "ERROR: No matching distribution found for tensorflow-cpu==0.0.0 "
        "(building x failed: The command returned a non-zero code: 1)"
    )


def test_a_tool_that_dies_without_a_word_says_how():
    state = BuildState(state="building", started=0.0)
    read_line(state, "Killed")
    finish(state, -9, now=1.0)
    assert state.reason == "the build tool exited with code -9: Killed"


def test_long_lines_are_cut_for_the_page():
    state = BuildState()
    read_line(state, "x" * 500)
    assert len(state.last_line) == 160 and state.last_line.endswith("…")


def test_the_command_names_the_services_catalog():
    assert build_command("a", "/srv/catalog.yaml")[-5:] == [
        "image_catalog", "--catalog", "/srv/catalog.yaml", "build", "a"
    ]  # fmt: skip
    assert build_command("a")[-3:] == ["image_catalog", "build", "a"]


# -- a real hub, building behind itself ----------------------------------------------------------

NO_WHEEL = "fgpu-test/no-wheel:1"
BAD_SPEC = "fgpu-test/bad-spec:1"


def heavy_catalog(path) -> None:
    shipped = {e["name"]: e for e in yaml.safe_load(DEFAULT_CATALOG_PATH.read_text())["images"]}
    heavy = {"recipe": "pytorch", "base": "python-3.11", "prebuild": False}
    entries = [
        shipped["python-3.11"],
        shipped["tensorflow-2.15-cpu"],
        {
            **heavy,
            "name": "pytorch-no-wheel",
            "display_name": "PyTorch, wheel missing",
            "image": NO_WHEEL,
            "wheels": ["torch-0.0.0+cpu-cp311-*.whl"],
            "build_args": {"TORCH_SPEC": "torch==0.0.0+cpu"},
        },
        {
            **heavy,
            "recipe": "tensorflow",
            "name": "tensorflow-bad-spec",
            "display_name": "TensorFlow, no such release",
            "image": BAD_SPEC,
            "build_args": {"TF_SPEC": "tensorflow-cpu==0.0.0"},
        },
    ]
    path.write_text(yaml.safe_dump({"images": entries}))


@pytest.fixture(scope="module")
def building_hub(tmp_path_factory, docker_engine):
    catalog = tmp_path_factory.mktemp("heavy-catalog") / "catalog.yaml"
    heavy_catalog(catalog)
    env = {"FGPU_CATALOG_PATH": str(catalog), "FGPU_BUILD_IMAGES": "1"}
    with running_hub(tmp_path_factory.mktemp("building-hub"), env=env) as hub:
        yield hub


def builds_of(admin: QueueUser) -> dict[str, dict]:
    response = admin.call("GET", "images?all=1")
    assert response.status_code == 200, response.text
    return {image["name"]: image for image in response.json()["images"]}


def test_the_hub_builds_its_heavy_images_and_offers_what_is_on_the_engine(
    building_hub, docker_engine, pages
):
    admin = QueueUser(building_hub, "admin")
    student = QueueUser(building_hub, f"stud-{secrets.token_hex(3)}")
    # Before any build has ended, only what the engine holds is offered.
    assert "pytorch-no-wheel" not in [
        i["name"] for i in student.call("GET", "images").json()["images"]
    ]

    def all_ended():
        images = builds_of(admin)
        heavy = [
            images[n]["build"]
            for n in ("tensorflow-2.15-cpu", "pytorch-no-wheel", "tensorflow-bad-spec")
        ]
        return images if all(b["state"] in ("built", "failed") for b in heavy) else None

    images = wait_until(all_ended, 240, "the three background builds to end", interval=1)
    assert images["python-3.11"]["build"] is None, "light images are the setup's"
    up_to_date = images["tensorflow-2.15-cpu"]["build"]
    assert up_to_date["state"] == "built" and up_to_date["step"] == "", up_to_date
    assert up_to_date["seconds"] < 60 and images["tensorflow-2.15-cpu"]["on_engine"] is True
    no_wheel = images["pytorch-no-wheel"]["build"]
    assert no_wheel["state"] == "failed" and no_wheel["step"] == "", "nothing was downloaded"
    assert "no wheel matching 'torch-0.0.0+cpu-cp311-*.whl' in /opt/wheels" in no_wheel["reason"]
    bad_spec = images["tensorflow-bad-spec"]["build"]
    assert bad_spec["state"] == "failed" and bad_spec["step"].startswith("step "), bad_spec
    assert bad_spec["reason"].startswith(
        "ERROR: Could not find a version that satisfies the requirement tensorflow-cpu==0.0.0"
    ), bad_spec
    assert (
        f"(building {BAD_SPEC} (tensorflow-bad-spec, recipe tensorflow) failed"
        in bad_spec["reason"]
    )
    assert not docker_engine.images.list(name=NO_WHEEL) and not docker_engine.images.list(
        name=BAD_SPEC
    )

    offered = [i["name"] for i in student.call("GET", "images").json()["images"]]
    assert offered == ["python-3.11", "tensorflow-2.15-cpu"]
    refused = student.call(
        "POST", "sessions", json={"image": "pytorch-no-wheel", "cpu": 1, "mem": "1G"}
    )
    assert refused.status_code == 409 and "not on this host's Docker engine yet" in refused.text
    assert student.sessions() == []

    page = pages()
    log_in(page, building_hub, "admin")
    page.goto(f"{building_hub.url}/services/queue/images")
    row = page.locator('tr[data-image="pytorch-no-wheel"] .fgpu-engine')
    expect(row).to_contain_text("build failed: pytorch-no-wheel: no wheel matching")
    expect(page.locator('tr[data-image="tensorflow-2.15-cpu"] .fgpu-engine')).to_have_text(
        "✓ on the engine"
    )
    screenshot(page, "images-background-builds")
