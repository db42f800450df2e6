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

from datetime import datetime, timedelta

from tornado import web

from queue_service.core import query_args, utilization

from .base import BaseHandler

DEFAULT_HOURS = 24
#: The longest span asked at once (the answer is thinned, so this only keeps the dates sane).
MAX_DAYS = 3660


class UtilizationHandler(BaseHandler):
    query_arguments = {"from": "moment", "to": "moment", "hours": "number"}

    @web.authenticated
    async def get(self):
        self.require_admin("Cluster utilization")
        start, end = self.span()
        log = self.utilization
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
        end = self.moment_argument("to") or self.utilization.clock()
        start = self.moment_argument("from")
        hours = self.get_argument("hours", "")
        if start is not None and hours:
            raise web.HTTPError(400, "Give either from or hours, not both.")
        if start is None:
            start = end - timedelta(hours=self.hours(hours))
        if start > end:
            raise web.HTTPError(400, f"from ({start.isoformat()}) is after to ({end.isoformat()}).")
        if end - start > timedelta(days=MAX_DAYS):
            raise web.HTTPError(400, f"Ask for at most {MAX_DAYS} days at once.")
        return start, end

    def moment_argument(self, name: str) -> datetime | None:
        return query_args.moment(self.get_argument(name, ""), name)

    @staticmethod
    def hours(text: str) -> float:
        return query_args.number(text, "hours", DEFAULT_HOURS, 0, MAX_DAYS * 24, above_low=True)


def routes(prefix: str) -> list:
    return [(prefix + r"api/utilization", UtilizationHandler)]
