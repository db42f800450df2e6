"""`api/usage` (contract 4): CPU-core-hours, memory-GiB-hours and fGPU-hours per UTC day and user.

`GET api/usage?user=&group=&resource_group=&from=&to=&format=csv`:
- students read their own (naming another user is refused; `group` then narrows their own rows
  to a group they are in); a course's instructors read its members' with `group=<course>`
  (and `user=` one of them); admins (the token's `admin:servers`) read everyone's;
- `from`, `to`: ISO dates, both days included (default: the last 30 days up to today, UTC);
- `format=csv`: the same rows as a CSV download.

JSON: `{"from", "to", "usage": [{day, user, resource_group, cpu_hours, mem_gib_hours,
fgpu_hours}], "totals": {cpu_hours, mem_gib_hours, fgpu_hours}}`, oldest day first.
"""

from __future__ import annotations

import csv
import io
from datetime import date, timedelta

from tornado import web

from queue_service import courses
from queue_service.core import query_args, usage
from queue_service.store.accounts import Account

from .base import BaseHandler

#: The default span, and the longest one asked at once (a decade of days is still small).
DEFAULT_DAYS = 30
MAX_DAYS = 3660
CSV_COLUMNS = ("day", "user", "resource_group", *usage.FIGURES)


class UsageHandler(BaseHandler):
    query_arguments = {
        "from": "date",
        "to": "date",
        "format": "choice",
        "user": "text",
        "group": "text",
        "resource_group": "text",
    }

    @web.authenticated
    async def get(self):
        first, last = self.span()
        kind = self.get_argument("format", "json")
        if kind not in ("json", "csv"):
            raise web.HTTPError(400, f"format must be json or csv, not {kind!r}.")
        users = await self.readable_users()
        book = self.usage
        table = await book.report(first, last, users)
        wanted_group = self.get_argument("resource_group", None)
        rows = [
            row
            for row in usage.as_rows(table)
            if wanted_group is None or row["resource_group"] == wanted_group
        ]
        if kind == "csv":
            self.write_csv(rows, first, last)
            return
        totals = {f: sum(row[f] for row in rows) for f in usage.FIGURES}
        self.write_json(
            {"from": first.isoformat(), "to": last.isoformat(), "usage": rows, "totals": totals}
        )

    def span(self) -> tuple[date, date]:
        today = self.usage.clock().date()
        last = query_args.day(self.get_argument("to", ""), "to") or today
        first = query_args.day(self.get_argument("from", ""), "from")
        first = first or last - timedelta(days=DEFAULT_DAYS - 1)
        if first > last:
            raise web.HTTPError(400, f"from ({first}) is after to ({last}).")
        if (last - first).days >= MAX_DAYS:
            raise web.HTTPError(400, f"Ask for at most {MAX_DAYS} days at once.")
        return first, last

    async def readable_users(self) -> set[str | Account] | None:
        """Whose usage this caller reads, after `?user=` and `?group=` (None: everyone's)."""
        identity = self.identity()
        if identity.get("kind") != "user":
            raise web.HTTPError(403, "Usage is read by users (your own) and admins.")
        name = self.get_argument("user", "")
        group = self.get_argument("group", "")
        if not self.is_admin():
            taught = await self.taught_members(group)
            if taught is not None:
                return {name} & taught if name else taught
            if name and name != identity["name"]:
                raise web.HTTPError(403, "Only admins may read another user's usage.")
            person = await self.person()
            in_group = not group or group in person.get("groups", [])
            # Your own account's: not an earlier account's of the same name.
            return {await self.account_of(person["name"])} if in_group else set()
        users = {name} if name else None
        if group:
            members = set((await self.from_hub(self.hub.group(group))).get("users") or ())
            users = members if users is None else users & members
        return users

    async def taught_members(self, group: str) -> set[str] | None:
        """The members of course `group` if the caller is one of its instructors, else None."""
        if not group:
            return None
        person = await self.person()
        course = await self.from_hub(courses.course_named(self.hub, group))
        if course is None or course.role_of(person["name"]) != "instructor":
            return None
        return set(course.members)

    def write_csv(self, rows: list[dict], first: date, last: date) -> None:
        out = io.StringIO()
        writer = csv.DictWriter(out, CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", f'attachment; filename="usage-{first}-{last}.csv"')
        self.finish(out.getvalue())


def routes(prefix: str) -> list:
    return [(prefix + r"api/usage", UsageHandler)]


def _cell(value):
    """A spreadsheet must not read a user's name as a formula (CSV injection)."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@"):
        return "'" + value
    return value
