"""A launch's batch-job options, judged alike by the spawner and the queue service. Pure, no I/O.

A launch is an interactive session unless it says `type: "batch"`; a batch job then names what
it runs, either a `notebook` (a path in the home folder, where mounted storage folders appear
under `folders/`, executed top to bottom with `parameters`, as papermill does) or a `command`
(run by `bash -c` in the home folder). `time_limit` bounds its run (seconds, or "90m", "2h");
`output` is the folder, in the home, that receives the executed copy of a notebook; `start_after`
(an ISO 8601 time with its offset) is the earliest the job may start: until then it waits out of
the line (queue_pass.py). Only its form is checked here, against no clock: whether it is too far
in the past or the future is the queue service's to say when the job is submitted (jobs.py), so
that the spawner's re-check of the same options, later, makes the same text.

The job is kept as one canonical JSON text (`job_json`): the queue's record, the hub's start and
the spawner's grant request all carry that same text, so a launched record is claimed by the
spawn it was made for and by no other (queue.py compares the request's fields).
"""

from __future__ import annotations

import json
import keyword
from datetime import UTC, datetime

from fgpu_shared.units import format_duration, parse_duration

BATCH = "batch"
INTERACTIVE = "interactive"
#: The options of a batch job, besides the session's (launch_options.LAUNCH_OPTIONS).
JOB_OPTIONS = (
    "type",
    "command",
    "notebook",
    "parameters",
    "output",
    "time_limit",
    "start_after",
)

COMMAND_MAX_BYTES = 8192
PATH_MAX = 1024
PARAMETERS_MAX_BYTES = 16384
TIME_LIMIT_MIN = 60.0
#: Beyond this a number is a mistake, not a plan (a site's own maximum is usually far lower:
#: QueueService.job_time_limit_max).
TIME_LIMIT_MAX = 30 * 86400.0
_TYPES = (INTERACTIVE, BATCH)


class JobOptionError(ValueError):
    """A job option that is refused; the message says why and what is allowed."""


def check_job(options: dict) -> str | None:
    """The job's canonical JSON text, None for an interactive launch, or JobOptionError."""
    kind = options.get("type") or INTERACTIVE
    if kind not in _TYPES:
        raise JobOptionError(f"type must be {' or '.join(map(repr, _TYPES))}, not {kind!r}.")
    given = [key for key in JOB_OPTIONS[1:] if options.get(key) not in (None, "")]
    if kind == INTERACTIVE:
        if given:
            raise JobOptionError(
                f'{", ".join(given)} belong(s) to a batch job: add "type": "batch".'
            )
        return None
    return job_text(_job(options))


def _job(options: dict) -> dict:
    command, notebook = options.get("command"), options.get("notebook")
    if _blank(command) == _blank(notebook):
        raise JobOptionError("A batch job runs either a notebook or a command: give one of them.")
    job: dict = {"time_limit": check_time_limit(options.get("time_limit"))}
    start_after = check_start_after(options.get("start_after"))
    if start_after is not None:
        # Left out when not given: the text of a job without it stays as it was before the option.
        job["start_after"] = start_after
    if not _blank(command):
        if options.get("parameters") not in (None, "", {}):
            raise JobOptionError("parameters go to a notebook; a command takes none.")
        if not _blank(options.get("output")):
            raise JobOptionError(
                "output is where a notebook's executed copy goes; a command's log goes to ~/jobs."
            )
        job["command"] = check_command(command)
    else:
        job["notebook"] = check_path("notebook", notebook)
        if not job["notebook"].endswith(".ipynb"):
            raise JobOptionError(f"notebook {job['notebook']!r} is not a notebook (.ipynb).")
        job["parameters"] = check_parameters(options.get("parameters"))
        output = options.get("output")
        job["output"] = "" if _blank(output) else check_path("output", output)
    return job


def job_text(job: dict) -> str:
    return json.dumps(job, sort_keys=True, separators=(",", ":"))


def parse_job(text: str | None) -> dict | None:
    """A record's job (its `job_json`), or None for an interactive session."""
    return json.loads(text) if text else None


def check_command(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise JobOptionError('command must be a non-empty shell command, e.g. "python train.py".')
    if "\0" in value:
        raise JobOptionError("command may not contain NUL characters.")
    if len(value.encode()) > COMMAND_MAX_BYTES:
        raise JobOptionError(
            f"command is {len(value.encode())} bytes; at most {COMMAND_MAX_BYTES} are allowed "
            "(put a long script in a file and run that)."
        )
    return value.strip()


def check_path(name: str, value: object) -> str:
    """A path relative to the home folder that stays inside it (mounted storage folders are under
    `folders/`), normalised: no `..`, no absolute path, no NUL."""
    if not isinstance(value, str) or not value.strip():
        raise JobOptionError(f'{name} must be a path in your home folder, e.g. "work/train.ipynb".')
    text = value.strip()
    if "\0" in text or len(text) > PATH_MAX:
        raise JobOptionError(f"{name}: a path has at most {PATH_MAX} characters and no NUL.")
    if text.startswith(("/", "~")):
        raise JobOptionError(
            f'{name} {text[:80]!r} must be relative to your home folder (e.g. "work/a.ipynb").'
        )
    parts = [part for part in text.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise JobOptionError(f"{name} {text[:80]!r} may not leave your home folder ('..').")
    if not parts:
        raise JobOptionError(f"{name} must name a path in your home folder.")
    return "/".join(parts)


def check_parameters(value: object) -> dict:
    """A notebook's parameters: a JSON object of Python names (a form's JSON text is taken)."""
    if value in (None, ""):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise JobOptionError(f"parameters are not JSON: {e}.") from None
    if not isinstance(value, dict):
        raise JobOptionError('parameters must be a JSON object, e.g. {"epochs": 3, "lr": 0.01}.')
    for name in value:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise JobOptionError(f"parameters: {str(name)[:40]!r} is not a Python variable name.")
    try:
        # NaN and Infinity are no JSON: the record's API answer would be unreadable to a browser.
        text = json.dumps(value, allow_nan=False)
    except ValueError:
        raise JobOptionError("parameters: numbers must be finite (no NaN or Infinity).") from None
    if len(text.encode()) > PARAMETERS_MAX_BYTES:
        raise JobOptionError(f"parameters take at most {PARAMETERS_MAX_BYTES} bytes of JSON.")
    return value


def check_time_limit(value: object) -> float | None:
    """Seconds (None: the site's default), from a number or a text such as "90m" or "2h". The
    hub's range for the user (`time_limit_rule`) is checked where it is known (queue_service/
    jobs.py); here only what no hub allows: under a minute, over `TIME_LIMIT_MAX`."""
    if value in (None, ""):
        return None
    try:
        seconds = parse_duration(value) or 0.0
    except ValueError as e:
        raise JobOptionError(f"time_limit: {e}.") from None
    given = f"time_limit {format_duration(seconds)}: a job's time limit is"
    if seconds < TIME_LIMIT_MIN:
        raise JobOptionError(f"{given} at least {format_duration(TIME_LIMIT_MIN)}.")
    if seconds > TIME_LIMIT_MAX:
        raise JobOptionError(f"{given} at most {format_duration(TIME_LIMIT_MAX)} on any hub.")
    return seconds


def time_limit_rule(maximum: float) -> str:
    """The one wording of a job's time limit on this hub, for the form (static/sessions.js says
    the same) and the service's refusal: "a job's time limit is from 1 min to 24 h on this hub"
    (`maximum`: the hub's for the user)."""
    return (
        f"a job's time limit is from {format_duration(TIME_LIMIT_MIN)} to "
        f"{format_duration(min(maximum, TIME_LIMIT_MAX))} on this hub"
    )


def check_start_after(value: object) -> str | None:
    """The earliest start of a job as canonical text, UTC to the second
    ("2026-11-28T02:00:00+00:00"), from an ISO 8601 time with an offset ("Z" or "+01:00"); None
    when not given. A time without an offset is refused: whose 02:00 would it be?"""
    if _blank(value):
        return None
    example = '"2026-11-28T02:00:00+00:00"'
    if not isinstance(value, str):
        raise JobOptionError(
            f"start_after must be an ISO 8601 time with its offset, e.g. {example}."
        )
    text = value.strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise JobOptionError(
            f"start_after {text[:40]!r} is not a time: give an ISO 8601 time with its offset, "
            f"e.g. {example}."
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise JobOptionError(
            f"start_after {text[:40]!r} has no offset: add one, e.g. {example} or "
            '"2026-11-28T03:00:00+01:00".'
        )
    try:
        return moment.astimezone(UTC).replace(microsecond=0).isoformat()
    except (OverflowError, ValueError):
        raise JobOptionError(f"start_after {text[:40]!r} is out of any reasonable range.") from None


def start_after_of(job: dict | None) -> datetime | None:
    """A parsed job's earliest start (its canonical `start_after`), or None."""
    text = (job or {}).get("start_after")
    return datetime.fromisoformat(text) if text else None


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())
