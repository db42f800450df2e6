"""The command that runs a batch job: job_runner.py's own text, given to the image's `python3 -c`.

Passed as text rather than mounted as a file, so that a job runs the same on one host and on a
Swarm node, which has none of the hub's files, and on any image without installing anything.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def job_runner_text() -> str:
    return (Path(__file__).with_name("job_runner.py")).read_text(encoding="utf-8")


def job_command() -> list[str]:
    return ["python3", "-c", job_runner_text()]
