"""Sessions on a Docker Swarm, whose manager DOCKER_HOST names: see backend.py.

The nodes, their resource groups and GPUs come from the Swarm's node labels, read every
reconciler round; sessions are services (session_services.py); what a node's sessions use, and
how its engine is set up, its agent reports (node_reports.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from . import inventory, job_services
from .backend import EngineBackend, JobExit, LogStream, NodeReading
from .node_reports import DAEMON_FIX, NodeReports, wrong_daemon_settings
from .registry_images import registry_digests
from .session_services import SwarmSessionLister


class SwarmBackend(EngineBackend):
    """The Swarm's nodes, less those whose engine would let sessions reach one another."""

    sessions_here = False
    nodes_change = True
    follow_ends_by_itself = False

    def __init__(
        self,
        client,
        node_reports: NodeReports,
        *,
        node_down_grace: float,
        reserve_cpu: float,
        reserve_mem: int,
        registry: str,
        registry_auth: Callable[[], dict[str, str] | None],
        registry_ca: str,
        log: logging.Logger,
    ) -> None:
        super().__init__(client)
        self.node_reports = node_reports
        self.node_down_grace = node_down_grace
        self.reserve_cpu = reserve_cpu
        self.reserve_mem = reserve_mem
        self.registry = registry
        self.registry_auth = registry_auth
        self.registry_ca = registry_ca
        self.log = log
        # Per node, the engine settings last found wrong ([] when none): each is logged once.
        self._refused_nodes: dict[str, list[str]] = {}

    async def read_nodes(self) -> NodeReading:
        nodes = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: inventory.swarm_nodes(
                [n.attrs for n in self.client.nodes.list()], self.reserve_cpu, self.reserve_mem
            ),
        )
        taking = [node for node in nodes if not self.isolation_refused(node.name)]
        withheld = {
            n.name: self._refused_nodes[n.name] for n in nodes if self._refused_nodes[n.name]
        }
        return NodeReading(taking, withheld)

    def isolation_refused(self, node: str) -> bool:
        """Whether `node`'s agent reports an engine setting that lets sessions reach one another
        or gain privileges: no session is placed there (its running ones go on, as on a paused
        node) until it is fixed. Unknown (no fresh report, or an agent that cannot tell) is
        flagged by the health check and doctor, not refused: nodes run no agent in some setups
        (docs/source/howto/swarm.md, "Swarm mode"), and the first reports come a few seconds
        after the hub starts."""
        report = self.node_reports.fresh(node)
        wrong = [] if report is None else wrong_daemon_settings(report.daemon)
        if wrong and self._refused_nodes.get(node) != wrong:  # said once, not every round
            self.log.warning(
                "Node %s takes no sessions: its engine has %s wrong; %s",
                node,
                " and ".join(wrong),
                DAEMON_FIX,
            )
        self._refused_nodes[node] = wrong
        return bool(wrong)

    def describe(self, nodes: list[inventory.NodeInfo]) -> str:
        described = ", ".join(
            f"{n.name} ({n.resource_group}: {n.cpu:g} CPU, {len(n.gpus)} GPU)" for n in nodes
        )
        return f"Swarm nodes taking sessions: {described or 'none'}"

    def session_lister(self) -> SwarmSessionLister:
        return SwarmSessionLister(self.client, self.node_down_grace, time.time)

    def usage_of(self, session_id: str) -> dict | None:
        # Read on the session's node, by the node's agent.
        return self.node_reports.usage(session_id)

    @property
    def images_listable(self) -> bool:
        # Without a registry, the nodes' images are the site's business: all are offered.
        return bool(self.registry)

    def runnable_images(self, wanted: Iterable[str]) -> dict[str, str | None]:
        return registry_digests(
            self.registry, wanted, self.registry_auth(), self.registry_ca or None
        )

    def job_exit(self, session_id: str) -> JobExit | None:
        # The reconciler asks about a job whose session it found gone: a task still starting or
        # running is one on a lost node (session_services.py), not an exit of the job's own.
        service = job_services.job_service(self.client, session_id)
        if service is None:
            return None
        code = job_services.task_exit_code(job_services.job_task(self.client, service))
        if code is None:
            return None
        return code, job_services.log_tail(self.client, service["ID"])

    def remove_job(self, session_id: str) -> None:
        service = job_services.job_service(self.client, session_id)
        if service is not None:
            job_services.remove(self.client, service["ID"])

    def job_log(self, session_id: str, lines: int) -> str | None:
        service = job_services.job_service(self.client, session_id)
        return (
            None
            if service is None
            else job_services.running_tail(self.client, service["ID"], lines)
        )

    def follow_job_log(self, session_id: str, tail: int) -> LogStream | None:
        service = job_services.job_service(self.client, session_id)
        return (
            None if service is None else job_services.follow_log(self.client, service["ID"], tail)
        )

    def exited_jobs(self, deployment_id: str) -> list[str]:
        return job_services.exited_jobs(self.client, deployment_id)
