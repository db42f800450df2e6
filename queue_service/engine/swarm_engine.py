"""Sessions on a Docker Swarm, whose manager DOCKER_HOST names: see backend.py.

`c.QueueService.engine_class = "swarm"` picks it; its settings are `c.SwarmEngine.…`. The nodes,
their resource groups and GPUs come from the Swarm's node labels, read every reconciler round;
sessions are services (session_services.py); what a node's sessions use, and how its engine is
set up, its agent reports (node_reports.py); shells in sessions go through it too (swarm_exec.py). The service deploys those agents, a global service
(node_agent_deploy.py), when `node_agent_url` is set."""

from __future__ import annotations

import asyncio
import fnmatch
import json
import time
from collections.abc import Iterable

from traitlets import Bool, Float, Int, List, Unicode

from fgpu_shared.registry_auth import log_in
from queue_service.core.errors import Refusal

from . import inventory, job_services
from .backend import EngineBackend, JobExit, LogStream, NodeReading
from .image_prepull import ImagePrepull, offered_images
from .node_agent_deploy import (
    TOKEN_FILE,
    AgentSettings,
    deploy_node_agents,
    node_agent_token,
    pinned_image,
    rotate_node_key,
)
from .node_commits import commit_on_node
from .node_reports import DAEMON_FIX, wrong_daemon_settings
from .registry_images import registry_digests
from .session_services import SwarmSessionLister
from .swarm_exec import SwarmExec


class SwarmEngine(EngineBackend):
    """The Swarm's nodes, less those whose engine would let sessions reach one another."""

    nodes_change = True
    follow_ends_by_itself = False

    node_down_grace = Float(
        30.0,
        config=True,
        help="""
        Swarm mode: seconds a node may be down before its sessions end as lost and their slices
        are given back. A node that is back sooner (a reboot of the engine, a network blip) keeps
        its sessions. Waiting requests go to the other nodes at once either way.

        Example::

            c.SwarmEngine.node_down_grace = 120
        """,
    )
    node_agent_url = Unicode(
        "",
        config=True,
        help="""
        Where node agents reach this service, as seen from a Swarm node: the hub's public URL of
        the service, e.g. http://10.213.0.1:8000/services/queue/. Set, the service deploys the node
        agent on the Swarm its engine manages (a global service) at start, and again whenever the
        agent's code or token changed; empty (single-host mode), no agent is deployed.

        Example::

            c.SwarmEngine.node_agent_url = "https://hub.example.org/services/queue/"
        """,
    )
    node_agent_image = Unicode(
        "fgpu/jupyter-base:py3.11",
        config=True,
        help="""
        Image that runs the node agent (any with python3; every node must be able to pull it).

        Example::

            c.SwarmEngine.node_agent_image = "registry.example.org:5000/fgpu/jupyter-base:py3.11"
        """,
    )
    node_agent_interval = Float(
        5.0,
        config=True,
        help="""
        Seconds between two reports of a node agent.

        Example::

            c.SwarmEngine.node_agent_interval = 10
        """,
    )
    node_agent_docker_socket = Unicode(
        "/var/run/docker.sock",
        config=True,
        help="""
        The engine socket of each node, as the node sees it, bound into its agent. Swarm fills
        templates in it: in the Swarm lab, where /var/run/docker.sock is the machine's own engine,
        /var/lib/fgpu-swarm-lab/LAB/nodes/{{.Node.Hostname}}/docker.sock is each node's.

        Example::

            c.SwarmEngine.node_agent_docker_socket = "/run/docker.sock"
        """,
    )
    node_agent_registry = Unicode(
        "",
        config=True,
        help="""
        The site's registry (host:port) to which node agents push sessions saved as private
        images, so that any node can start them; empty, nothing is committed through an agent.

        Example::

            c.SwarmEngine.node_agent_registry = "registry.example.org:5000"
        """,
    )
    registry_ca = Unicode(
        "",
        config=True,
        help="""
        CA certificate (PEM) that `node_agent_registry`'s TLS certificate is checked against, for a
        registry whose certificate no public CA signed (the lab's). Empty: the system's CAs.

        Example::

            c.SwarmEngine.registry_ca = "/etc/fgpu-hub/registry-ca.pem"
        """,
    )
    node_agent_deploy_interval = Float(
        60.0,
        config=True,
        help="""
        Seconds between two checks that every Swarm node runs its agent, with its own key: a node
        that joined gets its agent within this time, one that left loses its agent and key.

        Example::

            c.SwarmEngine.node_agent_deploy_interval = 300
        """,
    )
    node_agent_token_file = Unicode(
        TOKEN_FILE,
        config=True,
        help="""
        File holding the node agents' hub API token (the shipped config declares the
        `fgpu-node-agent` service with it), made (mode 0600) when missing; relative paths are in
        the state directory. The service hands it to the agents as a Swarm secret.

        Example::

            c.SwarmEngine.node_agent_token_file = "/var/lib/fgpu-hub/fgpu_node_agent_token"
        """,
    )

    prepull_images = Bool(
        True,
        config=True,
        help="""
        Swarm mode: every node pulls the catalog's offered images in the background (ordered
        through its agent, when an image is offered or the node joins), so that a student's first
        session on a node does not wait for the pull; sessions go first to nodes that hold their
        image. Needs the node agents and `node_agent_registry`.

        Example::

            c.SwarmEngine.prepull_images = False
        """,
    )
    prepull_names = List(
        Unicode(),
        ["*"],
        config=True,
        help="""
        Swarm mode: the catalog images (their names, or shell-style patterns of them) that the
        nodes pull ahead (prepull_images); the others are pulled by a node at their first
        session there. All by default.

        Example::

            c.SwarmEngine.prepull_names = ["python-3.11", "scikit-learn-*", "pytorch-*"]
        """,
    )
    prepull_per_node = Int(
        1,
        config=True,
        help="""
        Swarm mode: background pulls (prepull_images) running at once on one node; the node's
        other work, its sessions' own pulls among it, goes on beside them.

        Example::

            c.SwarmEngine.prepull_per_node = 2
        """,
    )

    def __init__(self, client, hooks, **kwargs) -> None:
        super().__init__(client, hooks, **kwargs)
        self.node_reports = hooks.node_reports
        self.prepull = ImagePrepull(self.node_reports, per_node=self.prepull_per_node, log=self.log)
        # GPUs per Swarm node, as last read: which nodes pull which images.
        self._node_gpus: dict[str, int] = {}
        self._holders: dict[str, frozenset[str]] = {}
        # Per node, the engine settings last found wrong ([] when none): each is logged once.
        self._refused_nodes: dict[str, list[str]] = {}
        self._agents_lock = asyncio.Lock()

    @property
    def commit_registry(self) -> str:
        return self.node_agent_registry

    async def start(self) -> None:
        if self.node_agent_url:
            await self.deploy_node_agents()
            self._agents_task = asyncio.create_task(self.keep_node_agents_deployed())

    def watch_job_exits(self, job_ends):
        # A Swarm reports no task events: the jobs' tasks are looked at every second.
        return job_ends.look()

    def reported_nodes(self):
        return self.node_reports.nodes

    async def read_nodes(self) -> NodeReading:
        nodes = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: inventory.swarm_nodes(
                [n.attrs for n in self.client.nodes.list()], self.reserve_cpu, self.reserve_mem
            ),
        )
        gone = set(self._node_gpus) - {node.name for node in nodes}
        self._node_gpus = {node.name: len(node.gpus) for node in nodes}
        self.prepull.forget(gone)
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

    # -- the catalog's images on the nodes (image_prepull.py) -------------------------------------

    def _offered(self, images):
        """The images the nodes pull ahead, of the catalog's `images`."""
        if not self.prepull_images:
            return []
        return [
            image
            for image in images
            if any(fnmatch.fnmatchcase(image.name, pattern) for pattern in self.prepull_names)
        ]

    def note_report(self, node: str) -> None:
        if node not in self._node_gpus:
            return  # not read from the Swarm yet: its next report
        images = offered_images(self.hooks.catalog(), self.node_agent_registry)
        try:
            for order in self.prepull.plan(node, self._offered(images), self._node_gpus[node]):
                self.log.info("Node %s: pulling %s ahead of its sessions", node, order["image"])
        except Exception:  # the report (usage, commits' results) counts all the same
            self.log.exception("Ordering the pulls of node %s failed", node)
        # Every catalog image, pulled ahead or not: its sessions go where it is. Kept, not
        # worked out at every scheduling pass (on the queue's own thread).
        self._holders = self.prepull.holders(images, self._node_gpus)

    def image_holders(self) -> dict[str, frozenset[str]]:
        return self._holders

    def images_on_nodes(self):
        if not (self.prepull_images and self.node_agent_registry):
            return None
        offered = self._offered(offered_images(self.hooks.catalog(), self.node_agent_registry))
        return (
            self.prepull.by_image(offered, self._node_gpus),
            self.prepull.by_node(offered, self._node_gpus),
        )

    def describe(self, nodes: list[inventory.NodeInfo]) -> str:
        described = ", ".join(
            f"{n.name} ({n.resource_group}: {n.cpu:g} CPU, {len(n.gpus)} GPU)" for n in nodes
        )
        return f"Swarm nodes taking sessions: {described or 'none'}"

    def session_lister(self) -> SwarmSessionLister:
        return SwarmSessionLister(self.client, self.node_down_grace, time.time)

    def session_exec(self) -> SwarmExec:
        # Made as the service starts, on its event loop, where the agents' channel is served.
        reports = self.node_reports
        loop = asyncio.get_running_loop()
        return SwarmExec(self.client, reports.execs, reports, self.hooks.deployment_id, loop)

    def usage_of(self, session_id: str) -> dict | None:
        # Read on the session's node, by the node's agent.
        return self.node_reports.usage(session_id)

    @property
    def images_listable(self) -> bool:
        # Without a registry, the nodes' images are the site's business: all are offered.
        return bool(self.node_agent_registry)

    def runnable_images(self, wanted: Iterable[str]) -> dict[str, str | None]:
        return registry_digests(
            self.node_agent_registry, wanted, self.hooks.registry_auth(), self.registry_ca or None
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

    async def commit_session(self, session_id: str, node: str, commit):
        # Nothing to undo: an image pushed from a node stays in the registry.
        registry = self.node_agent_registry
        if not registry:
            raise Refusal(
                "Saving a session in Swarm mode needs the site's registry "
                "(SwarmEngine.node_agent_registry, from FGPU_SWARM_REGISTRY).",
                "conflict",
            )
        result = await commit_on_node(self.node_reports, node, session_id, commit, registry)
        committed = {
            "image": commit.reference,
            "id": result.get("image_id", ""),
            "node": node,
            "pushed": result.get("image"),
        }
        return committed, None

    # -- the node agents -------------------------------------------------------------------------

    def _log_in_to_registry(self) -> None:
        # docker-py then sends the credentials with the agents' services: their nodes pull the
        # agent's image with them.
        auth = self.hooks.registry_auth()
        if auth is not None:
            log_in(self.client.api, auth)

    def _agent_settings(self) -> AgentSettings:
        auth = self.hooks.registry_auth()
        return AgentSettings(
            token=node_agent_token(self.node_agent_token_file),
            report_url=self.node_agent_url,
            image=pinned_image(
                self.node_agent_image, self.node_agent_registry, self.hooks.image_digests()
            ),
            name=self.hooks.agent_service,
            interval=self.node_agent_interval,
            deployment_id=self.hooks.deployment_id,
            docker_socket=self.node_agent_docker_socket,
            registry_auth=json.dumps(auth, sort_keys=True) if auth else None,
        )

    async def deploy_node_agents(self) -> None:
        """Deploy (or update) every node's agent; a failure is logged, not fatal: the service
        works without reports, with usage of other nodes' sessions unknown."""
        try:
            await asyncio.to_thread(self._log_in_to_registry)
            async with self._agents_lock:
                services = await asyncio.to_thread(
                    deploy_node_agents,
                    self.client,
                    self.hooks.node_credentials,
                    self._agent_settings(),
                )
            self.log.debug("Node agents deployed: %s", ", ".join(s.name for s in services))
        except Exception as e:
            self.log.error("Could not deploy the node agents: %s", e)

    async def keep_node_agents_deployed(self) -> None:
        while True:
            await asyncio.sleep(self.node_agent_deploy_interval)
            await self.deploy_node_agents()

    async def rotate_node_key(self, node: str):
        if not self.node_agent_url:
            return await super().rotate_node_key(node)
        await asyncio.to_thread(self._log_in_to_registry)
        async with self._agents_lock:
            return await asyncio.to_thread(
                rotate_node_key,
                self.client,
                self.hooks.node_credentials,
                self._agent_settings(),
                node,
            )
