"""Images already on the nodes: every Swarm node pulls the catalog's images in the background (what
zero-to-jupyterhub's image pre-puller does), so that a student's first launch on a node does not
wait minutes for a pull.

- **What.** The shared catalog's images that are offered (not hidden, no owner) and pinned to a
  registry digest (registry_images.py), each as `<registry>/<name>@<digest>`: what sessions start
  from. An image marked `gpu` in the catalog is pulled only on nodes with GPUs (`can_run`).
- **How.** When a node reports (its first report, when it joins, and every one after), the
  service puts `pull` orders for what it lacks in the answer (node_reports.py); the node's agent
  pulls in a thread and gives the result in a later report. At most `per_node` pulls run on a
  node at once, so its other work (sessions' own pulls, commits) goes on beside them, and an
  image is never ordered twice while its pull runs. What a node holds comes from its reports
  (`images`, its engine's repository digests), whoever pulled it.
- **Failures.** A failed pull, or one whose result does not come within `pull_timeout`, is
  tried again after a backoff (`backoff`: 30 s doubling to 30 min), its reason kept and shown.
- **Placement.** `holders` tells the scheduler which nodes hold each image
  (core/scheduler.py goes there first).

Each node's state per image is one of `present`, `pulling`, `failed` (with its reason) or
`missing` (`node_state`); the Images page shows them per image, the Cluster page per node.
The functions above `ImagePrepull` are pure.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .registry_images import pinned_reference

PRESENT, PULLING, FAILED, MISSING = "present", "pulling", "failed", "missing"
BACKOFF_FIRST_S = 30.0
BACKOFF_MAX_S = 1800.0


@dataclass(frozen=True)
class OfferedImage:
    """A catalog image every node that can run it should hold."""

    name: str
    #: What a node pulls and then lists among its repository digests: `<registry>/<name>@<digest>`.
    reference: str
    gpu: bool = False


@dataclass
class PullState:
    """One image on one node, as far as the service's orders go."""

    attempts: int = 0  # failed pulls in a row
    error: str = ""
    next_try: float = 0.0
    order_id: str | None = None
    given_at: float = 0.0


def offered_images(catalog: Iterable[Mapping], registry: str) -> list[OfferedImage]:
    """The catalog entries (store views) that nodes pull: shared, not hidden, pinned."""
    if not registry:
        return []
    return [
        OfferedImage(
            entry["name"], pull_reference(registry, entry["image"], entry["digest"]), entry["gpu"]
        )
        for entry in catalog
        if entry.get("digest") and not entry.get("hidden") and not entry.get("owner")
    ]


def pull_reference(registry: str, reference: str, digest: str) -> str:
    """What a node pulls for a catalog reference pinned to `digest`: from the site's registry,
    unless the reference names a registry of its own (as the Swarm spawner starts it)."""
    pinned = pinned_reference(reference, digest)
    first = pinned.split("/", 1)[0]
    if "/" in pinned and ("." in first or ":" in first or first == "localhost"):
        return pinned
    return f"{registry.rstrip('/')}/{pinned}"


def can_run(image: OfferedImage, node_gpus: int) -> bool:
    """Whether a node with `node_gpus` GPUs is one to hold the image."""
    return not image.gpu or node_gpus > 0


def backoff(attempts: int) -> float:
    """Seconds before a pull that failed `attempts` times in a row is tried again."""
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** max(0, attempts - 1))


def node_state(image: OfferedImage, held: frozenset[str], state: PullState | None) -> str:
    if image.reference in held:
        return PRESENT
    if state is not None and state.order_id:
        return PULLING
    if state is not None and state.error:
        return FAILED
    return MISSING


def pulls_due(
    images: Iterable[OfferedImage],
    node_gpus: int,
    held: frozenset[str],
    states: Mapping[str, PullState],
    now: float,
    per_node: int,
) -> list[OfferedImage]:
    """The images to order on a node now: those it can run and lacks, not pulling, past their
    backoff, in catalog order, as many as leave at most `per_node` pulls running there."""
    running = sum(1 for state in states.values() if state.order_id)
    due = [
        image
        for image in images
        if can_run(image, node_gpus)
        and node_state(image, held, states.get(image.reference)) in (MISSING, FAILED)
        and states.get(image.reference, PullState()).next_try <= now
    ]
    return due[: max(0, per_node - running)]


def settled(state: PullState, result: dict | None, held: bool, now: float, timeout: float) -> bool:
    """Bring a pull's state up to date with its order's result (None: none yet); whether the
    pull has failed just now."""
    if held:
        state.attempts, state.error, state.order_id = 0, "", None
        return False
    if result is None and state.order_id and now - state.given_at <= timeout:
        return False  # still pulling
    if result is not None and result.get("ok"):
        error = "pulled, but the node's engine does not list the image's digest"
    elif result is not None:
        error = str(result.get("error") or "failed")
    elif state.order_id:
        error = f"no result from the node's agent within {timeout:g} s"
    else:
        return False
    state.order_id = None
    state.attempts += 1
    state.error = error[:500]
    state.next_try = now + backoff(state.attempts)
    return True


class ImagePrepull:
    """The pulls ordered on every node and their outcomes, driven by the nodes' reports."""

    def __init__(
        self,
        reports,
        per_node: int = 1,
        pull_timeout: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger | None = None,
    ):
        self.reports, self.per_node, self.pull_timeout, self.clock = (
            reports,
            per_node,
            pull_timeout,
            clock,
        )
        self.log = log or logging.getLogger(__name__)
        self._states: dict[str, dict[str, PullState]] = {}

    def held(self, node: str) -> frozenset[str] | None:
        """What the node's fresh report lists (None: no fresh report, or an agent that does not
        list its images)."""
        report = self.reports.fresh(node)
        return None if report is None else report.images

    def plan(self, node: str, images: list[OfferedImage], node_gpus: int) -> list[dict]:
        """After a report of `node`: settle its pulls, and order those due (the orders given)."""
        held = self.held(node)
        if held is None:
            return []
        now = self.clock()
        states = self._states.setdefault(node, {})
        for reference, state in states.items():
            result = self.reports.order_result(state.order_id) if state.order_id else None
            if settled(state, result, reference in held, now, self.pull_timeout):
                self.log.warning(
                    "Node %s could not pull %s (%d time(s) in a row; tried again in %g s): %s",
                    node,
                    reference,
                    state.attempts,
                    state.next_try - now,
                    state.error,
                )
        wanted = {image.reference for image in images}
        for reference in [r for r in states if r not in wanted]:
            del states[reference]  # no longer offered
        orders = []
        for image in pulls_due(images, node_gpus, held, states, now, self.per_node):
            order = {"kind": "pull", "id": secrets.token_hex(8), "image": image.reference}
            state = states.setdefault(image.reference, PullState())
            state.order_id, state.given_at = order["id"], now
            self.reports.queue_order(node, order)
            orders.append(order)
        return orders

    def forget(self, nodes: Iterable[str]) -> None:
        """Drop the states of nodes that left the Swarm."""
        for node in nodes:
            self._states.pop(node, None)

    # -- views ----------------------------------------------------------------------------------

    def state_of(self, image: OfferedImage, node: str) -> dict:
        held = self.held(node)
        state = self._states.get(node, {}).get(image.reference)
        if held is None:
            return {"node": node, "state": "unknown", "error": "no fresh report from its agent"}
        found = {"node": node, "state": node_state(image, held, state)}
        if found["state"] == FAILED:
            found["error"] = state.error
            found["retry_in_s"] = max(0.0, round(state.next_try - self.clock(), 1))
        return found

    def by_image(self, images: list[OfferedImage], nodes: Mapping[str, int]) -> dict[str, dict]:
        """Per image name: on how many of the nodes that can run it, and each one's state."""
        views = {}
        for image in images:
            states = [
                self.state_of(image, node)
                for node, gpus in sorted(nodes.items())
                if can_run(image, gpus)
            ]
            present = sum(1 for s in states if s["state"] == PRESENT)
            pulling = sum(1 for s in states if s["state"] == PULLING)
            views[image.name] = {
                "present": present,
                "pulling": pulling,
                "of": len(states),
                "nodes": states,
            }
        return views

    def by_node(self, images: list[OfferedImage], nodes: Mapping[str, int]) -> dict[str, dict]:
        """Per node: how many of the images it should hold it holds, and those it lacks."""
        views = {}
        for node, gpus in sorted(nodes.items()):
            states = [
                {**self.state_of(image, node), "image": image.name}
                for image in images
                if can_run(image, gpus)
            ]
            present = sum(1 for s in states if s["state"] == PRESENT)
            lacking = [s for s in states if s["state"] != PRESENT]
            views[node] = {"present": present, "offered": len(states), "lacking": lacking}
        return views

    def holders(self, images: list[OfferedImage], nodes: Iterable[str]) -> dict[str, frozenset]:
        """Per image name, the nodes whose fresh report lists it."""
        held = {node: self.held(node) or frozenset() for node in nodes}
        return {
            image.name: frozenset(n for n, refs in held.items() if image.reference in refs)
            for image in images
        }
