"""The queue service's wall clock, moved by a test instead of slept through.

Debian's libfaketime is preloaded into the hub's queue service alone (the hub, the proxy and the
sessions keep the real time). It reads the offset from a file at most once a second (reading it
on every call made the service ten times slower), so a test moves the service's clock while the
hub runs with `clock.move_to(moment)` and waits until the service shows the new time. The
monotonic clock is left alone: the service's timers and asyncio's loop keep real durations.
"""

from __future__ import annotations

import glob
from datetime import UTC, datetime
from pathlib import Path


def _library() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        raise RuntimeError(
            "libfaketime is missing: run scripts/up --setup-only (Debian's faketime)"
        )
    return found[0]


class ServiceClock:
    def __init__(self, workdir: Path):
        self.offset_file = workdir / "service-clock"
        self.offset_file.write_text("+0\n")

    def config(self) -> str:
        """Hub config that preloads libfaketime into the queue service."""
        environment = {
            "LD_PRELOAD": _library(),
            "FAKETIME_TIMESTAMP_FILE": str(self.offset_file),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
        return (
            "for service in c.JupyterHub.services:\n"
            "    if service['name'] == 'queue':\n"
            f"        service.setdefault('environment', {{}}).update({environment!r})\n"
        )

    def move_to(self, moment: datetime) -> None:
        """From now on the service reads `moment` plus the real time that passes."""
        offset = (moment - datetime.now(UTC)).total_seconds()
        self.offset_file.write_text(f"{offset:+.0f}\n")

    def reset(self) -> None:
        self.offset_file.write_text("+0\n")
