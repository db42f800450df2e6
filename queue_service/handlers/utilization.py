"""`api/utilization`, admins only: the cluster's capacity, allocation and use over time, per
resource type (the Cluster page's charts; utilization_store.py keeps the samples).

`GET api/utilization?from=&to=` or `?hours=`:
- `from`, `to`: ISO 8601 moments (`2026-11-24T06:00:00Z`; without an offset they are UTC; a date
  alone is its 00:00 UTC); `to` defaults to now;
- `hours`: the last N hours up to `to`, instead of `from` (the default is 24), so that a page
  never depends on the browser's clock.

JSON: `{"from", "to", "interval", "width", "units_per_gpu", "samples": [{at, seconds,
cpu: {capacity, allocated, used}, mem: {...}, fgpu: {...}}]}`, oldest first; cpu in cores, mem in
bytes, fgpu in units; `used` is null where nothing measures it (simulated GPUs). `width` is the
bucket (seconds) the samples were averaged into to keep the answer small, or null.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from tornado import web

from .. import utilization
from .base import BaseHandler

DEFAULT_HOURS = 24
#: The longest span asked at once (the answer is thinned, so this only keeps the dates sane).
MAX_DAYS = 3660


class UtilizationHandler(BaseHandler):
    @web.authenticated
    async def get(self):
        self.require_admin("Cluster utilization")
        start, end = self.span()
        log = self.settings["utilization"]
        samples, width = await log.read(start, end)
        self.write_json(
            {
                "from": start.isoformat(),
                "to": end.isoformat(),
                "interval": log.interval,
                "width": width,
                "units_per_gpu": self.manager.settings.units_per_gpu,
                "samples": [utilization.as_json(s) for s in samples],
            }
        )

    def span(self) -> tuple[datetime, datetime]:
        end = self.moment_argument("to") or self.settings["utilization"].clock()
        start = self.moment_argument("from")
        hours = self.get_argument("hours", "")
        if start is not None and hours:
            raise web.HTTPError(400, "Give either from or hours, not both.")
        if start is None:
            try:
                start = end - timedelta(hours=self.hours(hours) if hours else DEFAULT_HOURS)
            except OverflowError:
                raise web.HTTPError(400, f"to ({end.isoformat()}) is too early.") from None
        if start > end:
            raise web.HTTPError(400, f"from ({start.isoformat()}) is after to ({end.isoformat()}).")
        if end - start > timedelta(days=MAX_DAYS):
            raise web.HTTPError(400, f"Ask for at most {MAX_DAYS} days at once.")
        return start, end

    def moment_argument(self, name: str) -> datetime | None:
        text = self.get_argument(name, "")
        if not text:
            return None
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise web.HTTPError(
                400, f"{name} must be an ISO 8601 time (2026-11-24T06:00:00Z), not {text!r}."
            ) from None
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)

    @staticmethod
    def hours(text: str) -> float:
        try:
            hours = float(text)
        except ValueError:
            hours = math.nan
        if not 0 < hours <= MAX_DAYS * 24:
            raise web.HTTPError(
                400, f"hours must be a number above 0 and at most {MAX_DAYS * 24}, not {text!r}."
            )
        return hours


def routes(prefix: str) -> list:
    return [(prefix + r"api/utilization", UtilizationHandler)]
