"""The launch's pure parts (queue_service/launches.py): the options its records and the hub's
starts carry. The launch itself, against the real hub, is in tests/test_security_handlers.py."""

from __future__ import annotations

import pytest

from image_catalog.job_options import check_job
from queue_service.core.errors import Refusal
from queue_service.launches import hub_options, launch_request

GIB = 1024**3


def test_a_launch_request_holds_the_values_the_spawner_parses_back():
    request = launch_request({"image": " python-3.11 ", "cpu": "1.5", "mem": "2G"})
    assert request == {
        "image": "python-3.11",
        "cpu": 1.5,
        "mem": 2 * GIB,
        "fgpu": 0.0,
        "resource_group": None,
        "job": None,
    }
    key = "f" * 32
    # Numbers and bytes, not the strings given: the spawner's parse of them is the identity.
    assert hub_options(request, key) == {
        "image": "python-3.11",
        "cpu": 1.5,
        "mem": 2 * GIB,
        "fgpu": 0.0,
        "request_key": key,
    }
    grouped = launch_request({"image": "x", "cpu": 1, "mem": GIB, "resource_group": "gpu-a"})
    assert hub_options(grouped, key)["resource_group"] == "gpu-a"


def test_a_jobs_hub_options_are_its_checked_options_which_the_spawner_checks_to_the_same_json():
    request = launch_request(
        {"image": "x", "cpu": 1, "mem": GIB, "type": "batch", "notebook": "./a//b.ipynb",
         "parameters": '{"lr": 0.1}', "time_limit": "2h"}
    )  # fmt: skip
    options = hub_options(request, "f" * 32)
    assert options["type"] == "batch"
    assert (options["notebook"], options["parameters"], options["time_limit"]) == (
        "a/b.ipynb",
        {"lr": 0.1},
        7200.0,
    )
    assert check_job(options) == request["job"]


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"cpu": 1, "mem": "1G"}, "names its image"),
        ({"image": "x", "mem": "1G"}, "cpu must be a number"),
        ({"image": "x", "cpu": 0, "mem": "1G"}, "greater than zero"),
        ({"image": "x", "cpu": "nan", "mem": "1G"}, "finite"),
        ({"image": "x", "cpu": 1}, "mem:"),
        ({"image": "x", "cpu": 1, "mem": "lots"}, "mem:"),
        ({"image": "x", "cpu": 1, "mem": "1G", "fgpu": -1}, "fgpu must be"),
        ({"image": "x", "cpu": 1, "mem": "1G", "resource_group": 3}, "resource_group"),
        ({"image": "x", "cpu": 1, "mem": "1G", "request_key": "a" * 32}, "Unknown option"),
    ],
)
def test_a_bad_launch_is_refused_with_a_message(options, fragment):
    with pytest.raises(Refusal, match=fragment) as refused:
        launch_request(options)
    assert refused.value.cause == "invalid"


def test_a_batch_launch_holds_its_job_and_the_hubs_start_names_it():
    request = launch_request(
        {"image": "x", "cpu": 1, "mem": "1G", "type": "batch", "notebook": "./a.ipynb"}
    )
    assert request["job"] == '{"notebook":"a.ipynb","output":"","parameters":{},"time_limit":null}'
    assert hub_options(request, "f" * 32) == {
        "image": "x",
        "cpu": 1.0,
        "mem": GIB,
        "fgpu": 0.0,
        "type": "batch",
        "notebook": "a.ipynb",
        "output": "",
        "parameters": {},
        "time_limit": None,
        "request_key": "f" * 32,
    }


@pytest.mark.parametrize(
    "job, fragment",
    [
        ({"command": "x"}, "belong"),
        ({"type": "batch", "command": ""}, "either a notebook or a command"),
        ({"type": "batch", "notebook": "/etc/x.ipynb"}, "relative to your home"),
        ({"type": "batch", "command": "x", "time_limit": "forever"}, "not a duration"),
        ({"type": "batch", "notebook": "a.ipynb", "parameters": "[1]"}, "JSON object"),
    ],
)
def test_a_bad_job_is_refused_before_anything_is_queued(job, fragment):
    with pytest.raises(Refusal, match=fragment) as refused:
        launch_request({"image": "x", "cpu": 1, "mem": "1G", **job})
    assert refused.value.cause == "invalid"


def test_a_jobs_servers_are_named_job_and_a_sessions_s():
    from queue_service.launches import server_names

    assert all(n.startswith("job-") and len(n) == 10 for n in server_names(3, prefix="job"))
    assert server_names(1)[0].startswith("s-")
    assert server_names(2, "train", prefix="job") == ["train-1", "train-2"]
