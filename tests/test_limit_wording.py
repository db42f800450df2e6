"""fgpu.js's words for what stops a launch (`whyNothing`, `freeLines`, `launchOutlook`), run in
Debian's Chromium without a hub, on figures shaped as api/resources gives them (their Python
side: tests/test_limits.py; on the real pages at the limit: tests/test_pages.py)."""

from __future__ import annotations

import json

import pytest

from queue_service.handlers.pages import STATIC_DIR

from .browser import browser  # noqa: F401 (the module's Chromium)

pytestmark = pytest.mark.browser

GIB = 1024**3
SESSIONS_USED_UP = {
    "kind": "sessions",
    "group": None,
    "used": 3,
    "limit": 3,
    "left": 0,
    "reached": True,
    "text": "You have 3 of 3 sessions (running or starting; your quota).",
}
PENDING_LEFT = {
    "kind": "pending",
    "group": None,
    "used": 1,
    "limit": 2,
    "left": 1,
    "reached": False,
    "text": "You have 1 of 2 requests waiting in the queue (your quota).",
}


def slots(cpu, mem, fgpu):
    return {"cpu": cpu, "mem": mem, "fgpu": fgpu}


#: The issue's case: three sessions at the 3-session quota while the cluster has a free fGPU.
AT_SESSION_QUOTA = {
    "name": None,
    "allocatable": slots(0, 0, 0),
    "free": slots(2.5, 5 * GIB, 1),
    "capacity": slots(4, 8 * GIB, 2),
}
#: Others hold the whole GPU; the user's quota has room.
GPU_TAKEN = {
    "name": None,
    "allocatable": slots(3, 6 * GIB, 0),
    "free": slots(3, 6 * GIB, 0),
    "capacity": slots(4, 8 * GIB, 2),
}


@pytest.fixture(scope="module")
def fgpu_js(browser):  # noqa: F811
    page = browser.new_page()
    config = json.dumps({"api": "/", "user": "x"})
    page.set_content(f'<script type="application/json" id="fgpu-page-config">{config}</script>')
    page.add_script_tag(content=(STATIC_DIR / "fgpu.js").read_text())

    def call(function: str, *args):
        return page.evaluate(f"args => fgpu.{function}.apply(null, args)", list(args))

    yield call
    page.close()


def test_at_the_session_quota_the_indicator_names_it_not_the_cluster(fgpu_js):
    assert fgpu_js("whyNothing", AT_SESSION_QUOTA, [SESSIONS_USED_UP]) == [
        "Nothing more starts for you now. " + SESSIONS_USED_UP["text"]
    ]


def test_when_others_hold_the_gpu_the_indicator_says_so(fgpu_js):
    assert fgpu_js("whyNothing", GPU_TAKEN, []) == [
        "No more fGPU for you now: all 2 fGPU of the cluster are in use."
    ]


def test_a_used_up_slot_quota_is_named_with_its_figures(fgpu_js):
    limit = {
        "kind": "fgpu",
        "left": 0,
        "reached": True,
        "text": "You hold 4 fGPU of 4 fGPU (your quota).",
    }
    scope = {**GPU_TAKEN, "free": slots(3, 6 * GIB, 2)}
    assert fgpu_js("whyNothing", scope, [limit]) == [
        "No more fGPU for you now. You hold 4 fGPU of 4 fGPU (your quota)."
    ]


def test_a_hub_without_gpus_says_so_and_room_needs_no_reason(fgpu_js):
    cpu_only = {
        "name": "cpu",
        **{k: slots(4, 8 * GIB, 0) for k in ("allocatable", "free", "capacity")},
    }
    assert fgpu_js("whyNothing", cpu_only, []) == ["Resource group cpu has no GPUs."]
    roomy = {**GPU_TAKEN, "allocatable": slots(1, GIB, 1), "free": slots(1, GIB, 1)}
    assert fgpu_js("whyNothing", roomy, []) == []


def test_free_figures_tell_the_cluster_apart_from_the_quota(fgpu_js):
    lines = fgpu_js("freeLines", AT_SESSION_QUOTA, [SESSIONS_USED_UP, PENDING_LEFT], 2)
    assert lines == [
        "Free on the cluster: 2.5 cores, 5 GiB memory, 1 fGPU (1 fGPU = 1/2 GPU).",
        "Your quota leaves you none of it now. " + SESSIONS_USED_UP["text"],
    ]
    # Where the quota leaves all the cluster has, one line.
    assert len(fgpu_js("freeLines", GPU_TAKEN, [PENDING_LEFT], 2)) == 1


def test_a_launch_at_the_session_quota_waits_for_the_quota_and_says_which(fgpu_js):
    ask = {"cpu": 0.5, "mem": GIB // 2, "fgpu": 0.5, "count": 1}
    outlook = fgpu_js("launchOutlook", ask, AT_SESSION_QUOTA, [SESSIONS_USED_UP, PENDING_LEFT])
    assert (outlook["now"], outlook["waiting"], outlook["refused"]) == (0, 1, 0)
    assert outlook["text"] == (
        "1 will wait in the queue (PENDING) until your quota has room. " + SESSIONS_USED_UP["text"]
    )


def test_at_the_session_quota_with_the_cluster_full_too_both_are_said(fgpu_js):
    """Others ending alone would not start it: the quota is named, and the cluster too."""
    ask = {"cpu": 0.5, "mem": GIB // 2, "fgpu": 0.5, "count": 1}
    full = {**AT_SESSION_QUOTA, "free": slots(0, 5 * GIB, 1)}
    outlook = fgpu_js("launchOutlook", ask, full, [SESSIONS_USED_UP, PENDING_LEFT])
    assert outlook["text"] == (
        "1 will wait in the queue (PENDING) until your quota has room and others end. "
        + SESSIONS_USED_UP["text"]
    )


def test_beyond_the_pending_quota_a_launch_is_refused_and_says_so(fgpu_js):
    ask = {"cpu": 0.5, "mem": GIB // 2, "fgpu": 0, "count": 3}
    outlook = fgpu_js("launchOutlook", ask, AT_SESSION_QUOTA, [SESSIONS_USED_UP, PENDING_LEFT])
    assert (outlook["now"], outlook["waiting"], outlook["refused"]) == (0, 1, 2)
    assert "2 will be refused" in outlook["text"]
    assert PENDING_LEFT["text"] in outlook["text"]


def test_when_the_cluster_is_full_the_rest_wait_for_others(fgpu_js):
    ask = {"cpu": 0.5, "mem": GIB // 2, "fgpu": 1, "count": 3}
    scope = {**GPU_TAKEN, "allocatable": slots(3, 6 * GIB, 2), "free": slots(3, 6 * GIB, 2)}
    outlook = fgpu_js("launchOutlook", ask, scope, [])
    assert (
        outlook["text"] == "2 will start now; 1 will wait in the queue (PENDING) until others end."
    )
    assert fgpu_js("launchOutlook", {**ask, "count": 2}, scope, []) is None
