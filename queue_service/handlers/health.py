"""`api/health`: is the service able to serve (health.py's checks)?

`GET api/health` answers anyone, a load balancer or a monitoring probe with no token included:
`{"status": "ok" | "degraded" | "fail"}`, with 200, or 503 on `fail` (`HEAD`: the code alone).
Admins (the token's `admin:servers`) get the checks as well:
`{"status", "checks": [{name, status, message, fix}]}`.
It reads and changes nothing else, and the checks run at most once every two seconds whoever
asks (`HealthMonitor`).
"""

from __future__ import annotations

from queue_service import health

from .base import BaseHandler


class HealthHandler(BaseHandler):
    async def head(self):
        """The status code alone, for probes that ask with HEAD (HAProxy's `httpchk`)."""
        status = health.overall(await self.health.checks())
        self.set_header("Cache-Control", "no-store")
        self.set_status(health.http_status(status))
        self.finish()

    async def get(self):
        checks = await self.health.checks()
        status = health.overall(checks)
        answer = {"status": status}
        # Not `identity()`: a caller with no token is welcome here, and only told the status.
        if self.get_current_user() and self.is_admin():
            answer["checks"] = [check.as_dict() for check in checks]
        self.set_header("Cache-Control", "no-store")
        self.write_json(answer, health.http_status(status))


def routes(prefix: str) -> list:
    return [(prefix + r"api/health", HealthHandler)]
