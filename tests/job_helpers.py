"""What the batch-job test modules share (test_batch_jobs_hub, test_batch_jobs_page,
test_jobs_from_jupyterlab and the Swarm's in test_swarm_hub): a training notebook with a
`parameters` cell, and a job's record read from the active list or, once it has ended, from the
finished one."""

from __future__ import annotations

from .harness import QueueUser, wait_until


def training_notebook(first: str = "") -> dict:
    """A notebook whose cell tagged `parameters` sets `epochs = 1`, and whose next cell runs
    `first` (e.g. a sleep that holds the slice a while) and prints "trained for" epochs × 10."""
    return {
        "cells": [
            {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": "epochs = 1",
             "outputs": [], "execution_count": None},
            {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
             "source": first + "print('trained for', epochs * 10)"},
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }  # fmt: skip


def job_record(user: QueueUser, session_id: str) -> dict:
    """The job's record: among the user's sessions while active, else among the finished."""
    for session in user.sessions():
        if session["id"] == session_id:
            return session
    finished = user.call("GET", "sessions?finished=1").json()["sessions"]
    return next(s for s in finished if s["id"] == session_id)


def job_ended(user: QueueUser, session_id: str, timeout: float = 120) -> dict:
    """The job's record once it has ended."""
    return wait_until(
        lambda: (r := job_record(user, session_id))["ended"] and r, timeout, f"{session_id}'s end"
    )
