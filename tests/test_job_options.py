"""A launch's batch-job options (image_catalog/job_options.py): each rule and its message, the
normalised paths and durations, and the one canonical JSON text that the launch's record, the
hub's start and the spawner's re-check all carry (queue.py claims a record by comparing it)."""

from __future__ import annotations

import json

import pytest

from fgpu_spawner.request import Range, RequestLimits, parse_request
from image_catalog.catalog import parse_catalog
from image_catalog.job_options import (
    COMMAND_MAX_BYTES,
    JOB_OPTIONS,
    PARAMETERS_MAX_BYTES,
    PATH_MAX,
    JobOptionError,
    check_command,
    check_job,
    check_parameters,
    check_path,
    check_start_after,
    check_time_limit,
    job_text,
    parse_job,
)
from image_catalog.launch_options import LAUNCH_OPTIONS
from queue_service.launches import hub_options, launch_request

GIB = 1024**3
KEY = "a" * 32
CATALOG = parse_catalog({"images": [{"name": "base", "image": "fgpu/base:1"}]})
LIMITS = RequestLimits(
    cpu=Range(0.5, 4, 1), mem=Range(256 * 1024**2, 8 * GIB, 2 * GIB), fgpu=Range(0, 2, 0)
)
SLOTS = {"image": "base", "cpu": 1, "mem": "1G"}


# --- interactive or batch ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", [None, "", "interactive"])
def test_an_interactive_launch_has_no_job(kind):
    options = {} if kind is None else {"type": kind}
    assert check_job({**SLOTS, **options}) is None


@pytest.mark.parametrize(
    "field, value",
    [
        ("command", "python train.py"),
        ("notebook", "a.ipynb"),
        ("parameters", {"lr": 0.1}),
        ("output", "out"),
        ("time_limit", "1h"),
        ("start_after", "2026-11-28T02:00:00+00:00"),
    ],
)
def test_an_interactive_launch_with_a_job_field_is_refused(field, value):
    with pytest.raises(JobOptionError, match=rf'^{field} belong\(s\) to a batch job: add "type"'):
        check_job({**SLOTS, field: value})


def test_empty_job_fields_on_an_interactive_launch_are_as_if_absent():
    """A form sends every field, the blank ones as "" (or null from JSON)."""
    blanks = {"command": "", "notebook": None, "output": "", "time_limit": None, "parameters": ""}
    assert check_job({**SLOTS, **blanks}) is None


def test_several_job_fields_on_an_interactive_launch_are_all_named():
    with pytest.raises(JobOptionError, match="^command, time_limit belong"):
        check_job({"type": "interactive", "command": "x", "time_limit": 600})


@pytest.mark.parametrize("kind", ["Batch", "job", 1])
def test_an_unknown_type_is_refused(kind):
    with pytest.raises(JobOptionError, match=r"type must be 'interactive' or 'batch', not"):
        check_job({"type": kind, "command": "x"})


def test_the_job_options_are_launch_options():
    assert set(JOB_OPTIONS) <= set(LAUNCH_OPTIONS)
    assert JOB_OPTIONS[0] == "type"


# --- a command or a notebook --------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"command": "", "notebook": ""},
        {"command": "  ", "notebook": None},
        {"command": "echo", "notebook": "a.ipynb"},
    ],
)
def test_a_job_runs_a_notebook_or_a_command_never_both_or_neither(options):
    with pytest.raises(JobOptionError, match="either a notebook or a command: give one"):
        check_job({"type": "batch", **options})


def test_a_command_job_is_its_command_stripped_and_its_time_limit():
    text = check_job({"type": "batch", "command": "  python train.py --epochs 3\n"})
    assert json.loads(text) == {"command": "python train.py --epochs 3", "time_limit": None}
    timed = check_job({"type": "batch", "command": "x", "time_limit": "1h30m"})
    assert json.loads(timed) == {"command": "x", "time_limit": 5400.0}


@pytest.mark.parametrize(
    "extra, says",
    [
        ({"parameters": {"a": 1}}, "parameters go to a notebook; a command takes none."),
        ({"parameters": '{"a": 1}'}, "parameters go to a notebook"),
        ({"output": "out"}, "output is where a notebook's executed copy goes; a command's log"),
    ],
)
def test_a_command_takes_no_parameters_and_no_output(extra, says):
    with pytest.raises(JobOptionError, match=says):
        check_job({"type": "batch", "command": "x", **extra})


def test_a_command_with_empty_parameters_and_output_is_accepted():
    text = check_job({"type": "batch", "command": "x", "parameters": {}, "output": " "})
    assert json.loads(text) == {"command": "x", "time_limit": None}


def test_a_notebook_job_is_its_normalised_path_parameters_and_output():
    text = check_job(
        {
            "type": "batch",
            "notebook": " ./work//train.ipynb ",
            "parameters": '{"epochs": 3, "lr": 0.01}',
            "output": "results/./runs/",
            "time_limit": 7200,
        }
    )
    assert json.loads(text) == {
        "notebook": "work/train.ipynb",
        "parameters": {"epochs": 3, "lr": 0.01},
        "output": "results/runs",
        "time_limit": 7200.0,
    }
    plain = json.loads(check_job({"type": "batch", "notebook": "a.ipynb"}))
    assert plain == {"notebook": "a.ipynb", "parameters": {}, "output": "", "time_limit": None}


def test_a_notebook_must_be_an_ipynb_file():
    with pytest.raises(JobOptionError, match=r"^notebook 'work/train.py' is not a notebook"):
        check_job({"type": "batch", "notebook": "work/train.py"})


# --- commands -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, says",
    [
        (None, "command must be a non-empty shell command"),
        ("", "command must be a non-empty shell command"),
        (" \n ", "command must be a non-empty shell command"),
        (["python", "x.py"], "command must be a non-empty shell command"),
        ("echo a\0b", "command may not contain NUL characters."),
        ("x" * (COMMAND_MAX_BYTES + 1), f"at most {COMMAND_MAX_BYTES} are allowed"),
        ("é" * (COMMAND_MAX_BYTES // 2 + 1), "bytes; at most"),  # counted in bytes, not letters
    ],
)
def test_a_bad_command_is_refused_with_why(value, says):
    with pytest.raises(JobOptionError, match=says):
        check_command(value)


def test_a_command_of_exactly_the_maximum_is_accepted():
    assert check_command("x" * COMMAND_MAX_BYTES) == "x" * COMMAND_MAX_BYTES


# --- paths --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, normalised",
    [
        ("a.ipynb", "a.ipynb"),
        ("./a.ipynb", "a.ipynb"),
        ("work//x/./a.ipynb", "work/x/a.ipynb"),
        ("folders/course-data/a.ipynb", "folders/course-data/a.ipynb"),
        ("  out/  ", "out"),
        ("a..b/c", "a..b/c"),  # ".." only as a whole part leaves the folder
    ],
)
def test_paths_are_normalised_relative_to_the_home(value, normalised):
    assert check_path("notebook", value) == normalised


@pytest.mark.parametrize(
    "value, says",
    [
        (None, 'notebook must be a path in your home folder, e.g. "work/train.ipynb".'),
        ("", "notebook must be a path in your home folder"),
        (3, "notebook must be a path in your home folder"),
        ("/etc/passwd", "notebook '/etc/passwd' must be relative to your home folder"),
        ("~/a.ipynb", "notebook '~/a.ipynb' must be relative to your home folder"),
        ("../bob/a.ipynb", r"notebook '../bob/a.ipynb' may not leave your home folder \('..'\)"),
        ("work/../../a.ipynb", "may not leave your home folder"),
        (".", "notebook must name a path in your home folder."),
        ("././/", "notebook must name a path in your home folder."),
        ("a\0.ipynb", f"notebook: a path has at most {PATH_MAX} characters and no NUL."),
        ("a" * (PATH_MAX + 1), f"at most {PATH_MAX} characters"),
    ],
)
def test_a_path_outside_the_home_or_malformed_is_refused(value, says):
    with pytest.raises(JobOptionError, match=says):
        check_path("notebook", value)


def test_the_message_names_the_option_and_cuts_a_long_path():
    with pytest.raises(JobOptionError) as refused:
        check_path("output", "/" + "x" * 500)
    message = str(refused.value)
    assert message.startswith("output '/xxx")
    assert len(message) < 200


def test_an_output_outside_the_home_is_refused_for_a_notebook():
    with pytest.raises(JobOptionError, match="output '../x' may not leave"):
        check_job({"type": "batch", "notebook": "a.ipynb", "output": "../x"})


# --- parameters ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, parsed",
    [
        (None, {}),
        ("", {}),
        ({}, {}),
        ('{"epochs": 3}', {"epochs": 3}),
        ({"name": "run-1", "layers": [64, 32], "on": True, "x": None}, None),
    ],
)
def test_parameters_are_a_json_object_or_its_text(value, parsed):
    assert check_parameters(value) == (value if parsed is None else parsed)


@pytest.mark.parametrize(
    "value, says",
    [
        ("{epochs: 3}", "parameters are not JSON: "),
        ("[1, 2]", r'parameters must be a JSON object, e.g. \{"epochs": 3, "lr": 0.01\}.'),
        ([1], "parameters must be a JSON object"),
        ("3", "parameters must be a JSON object"),
        ({"1st": 1}, "parameters: '1st' is not a Python variable name."),
        ({"a-b": 1}, "'a-b' is not a Python variable name"),
        ({"class": 1}, "'class' is not a Python variable name"),
        ({"a b": 1}, "'a b' is not a Python"),
        ('{"lr": NaN}', r"parameters: numbers must be finite \(no NaN or Infinity\)."),
        ('{"x": [1, -Infinity]}', "numbers must be finite"),
        ({"lr": float("inf")}, "numbers must be finite"),
        (
            {"x": "y" * PARAMETERS_MAX_BYTES},
            f"parameters take at most {PARAMETERS_MAX_BYTES} bytes",
        ),
    ],
)
def test_bad_parameters_are_refused_with_why(value, says):
    with pytest.raises(JobOptionError, match=says):
        check_parameters(value)


def test_a_long_parameter_name_is_cut_in_the_message():
    with pytest.raises(JobOptionError) as refused:
        check_parameters({"-" * 100: 1})
    assert str(refused.value) == f"parameters: {'-' * 40!r} is not a Python variable name."


# --- time limits --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, seconds",
    [
        (None, None),
        ("", None),
        (60, 60.0),
        ("60", 60.0),
        (90.5, 90.5),
        ("90m", 5400.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1d", 86400.0),
        ("30d", 30 * 86400.0),
    ],
)
def test_a_time_limit_is_seconds_from_a_number_or_a_duration(value, seconds):
    assert check_time_limit(value) == seconds


@pytest.mark.parametrize(
    "value, says",
    [
        (59, "time_limit 59 s: a job's time limit is at least 1 min."),
        ("30s", "time_limit 30 s: "),
        (0, "time_limit 0 s: "),  # zero is not "no limit" for a job: the site's default is None
        ("0", "time_limit 0 s: "),
        ("31d", "time_limit 744 h: a job's time limit is at most 720 h on any hub."),
        (10**12, "a job's time limit is at most 720 h"),
        (-5, "time_limit: -5 is not a duration \\(zero or more seconds\\)."),
        ("soon", "time_limit: 'soon' is not a duration \\(seconds, or e.g. 90m, 8h, 1d, 1h30m\\)."),
        ("2 weeks", "is not a duration"),
        ("inf", "is not a duration"),
        (float("nan"), "is not a duration"),
        (True, "time_limit: True is not a duration."),
        ([60], "is not a duration"),
    ],
)
def test_an_absurd_or_malformed_time_limit_is_refused(value, says):
    with pytest.raises(JobOptionError, match=says):
        check_time_limit(value)


# --- start not before ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-28T02:00:00+00:00",
        "2026-11-28T02:00:00Z",
        "2026-11-28T02:00Z",
        " 2026-11-28T03:00:00+01:00 ",
        "2026-11-27T21:00:00.999-05:00",  # the fraction is dropped: to the second
        "2026-11-28 02:00:00+00:00",
    ],
)
def test_a_start_after_is_one_utc_text_to_the_second_whatever_its_offset(value):
    assert check_start_after(value) == "2026-11-28T02:00:00+00:00"


def test_a_job_with_a_start_after_carries_it_and_one_without_has_no_key():
    text = check_job({"type": "batch", "command": "x", "start_after": "2026-11-28T03:00+01:00"})
    assert json.loads(text) == {
        "command": "x",
        "time_limit": None,
        "start_after": "2026-11-28T02:00:00+00:00",
    }
    # Blank is as if absent; a job without one has the very text it had before the option.
    for blank in (None, "", "  "):
        text = check_job({"type": "batch", "command": "x", "start_after": blank})
        assert text == '{"command":"x","time_limit":null}'


@pytest.mark.parametrize(
    "value, says",
    [
        (
            "tomorrow",
            r"^start_after 'tomorrow' is not a time: give an ISO 8601 time with its offset",
        ),
        ("2026-11-31T02:00+00:00", "is not a time"),
        ("2026-11-28T25:00Z", "is not a time"),
        ("2026-11-28T02:00", r"^start_after '2026-11-28T02:00' has no offset: add one, e\.g\."),
        ("2026-11-28", "has no offset"),
        (1796004000, "^start_after must be an ISO 8601 time with its offset"),
        (["2026-11-28T02:00Z"], "^start_after must be an ISO 8601 time"),
        ("0001-01-01T00:00+01:00", "out of any reasonable range"),
    ],
)
def test_a_bad_start_after_is_refused_with_why(value, says):
    with pytest.raises(JobOptionError, match=says):
        check_job({"type": "batch", "command": "x", "start_after": value})


def test_a_bad_start_after_is_refused_by_the_launch_and_the_spawner_alike():
    from fgpu_spawner.request import InvalidRequest
    from queue_service.core.errors import Refusal

    options = {**SLOTS, "type": "batch", "command": "x", "start_after": "2026-11-28T02:00"}
    with pytest.raises(Refusal, match="has no offset"):
        launch_request(options)
    with pytest.raises(InvalidRequest, match="has no offset"):
        parse_request(options, LIMITS, CATALOG)


# --- the canonical text -------------------------------------------------------------------------


def test_the_text_is_sorted_and_compact_and_parse_job_reads_it_back():
    job = {"time_limit": None, "command": "echo 'ü'"}
    assert job_text(job) == '{"command":"echo \'\\u00fc\'","time_limit":null}'
    assert parse_job(job_text(job)) == job
    assert parse_job(None) is None
    assert parse_job("") is None


BATCH_LAUNCHES = [
    {"command": "python train.py", "time_limit": "90m"},
    {"command": "  echo hi  "},
    {"notebook": "./work/a.ipynb", "parameters": '{"lr": 0.5, "name": "ü"}', "output": "o/"},
    {"notebook": "a.ipynb", "parameters": {"b": [1, 2], "a": {"z": 1, "y": None}}},
    {"notebook": "a.ipynb", "time_limit": 3600},
    {"command": "x", "start_after": "2026-11-28T03:00:00.250+01:00"},
    {"notebook": "a.ipynb", "start_after": "2026-11-28T02:00Z"},
]


@pytest.mark.parametrize("job", BATCH_LAUNCHES)
def test_the_launch_and_the_spawners_recheck_of_the_hub_options_give_the_same_text(job):
    """POST sessions checks the job (launch_request), the hub's start carries hub_options, the
    spawner checks those again (parse_request): the record's job_json and the grant request's
    must be the very same text, or the spawn would not claim its record."""
    request = launch_request({**SLOTS, "type": "batch", **job})
    options = hub_options(request, KEY)
    assert options["type"] == "batch"
    spawned = parse_request(options, LIMITS, CATALOG)
    assert spawned.batch
    assert spawned.job == request["job"]
    # And a check of the checked options is the identity, however often it is made.
    assert check_job(options) == request["job"]
    assert check_job({"type": "batch", **parse_job(request["job"])}) == request["job"]


def test_the_same_job_written_two_ways_is_the_same_text():
    one = check_job({"type": "batch", "notebook": "a.ipynb", "parameters": '{"b": 1, "a": 2}'})
    two = check_job({"type": "batch", "notebook": "./a.ipynb", "parameters": {"a": 2, "b": 1}})
    assert one == two


def test_an_interactive_launch_has_no_job_anywhere():
    request = launch_request(SLOTS)
    assert request["job"] is None
    options = hub_options(request, KEY)
    assert not set(JOB_OPTIONS) & set(options)
    spawned = parse_request(options, LIMITS, CATALOG)
    assert (spawned.job, spawned.batch) == (None, False)
