"""Who sent a node report: the node's own key, a signature over the request, and a fresh time.

Every node agent presents the hub token of the node-agent service (one hub identity for all of
them), and signs its report with the key of its own node (node_credentials.py) over the method,
the path (which names the node), its Swarm node id, the time, a nonce and the body
(`node_agent.agent.request_signature`). `NodeIdentity.verify` takes a report only when:

- the node id has a key here (an unknown id, or a key rotated away, is refused);
- that node id is the one whose hostname the URL names: a node reports only for itself, so it
  takes only its own orders and answers only its own;
- the signature matches (a changed body, path or time is refused);
- the time is within `max_skew` seconds of the service's clock, and later than that node's last
  report taken: a report recorded on the wire and sent again is refused, then or later;
- the report's own `sampled_at` is within `max_skew` of its signed time.

The answer is signed back with the same key and the report's nonce (`answer_signature`), so the
agent carries out only orders this service gave its node. Refusals are 403 `Refusal`s saying which check
failed; nothing of a refused report is stored.
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Callable, Mapping
from datetime import datetime

from node_agent.agent import (
    NODE_ID_HEADER,
    NONCE_HEADER,
    SIGNATURE_HEADER,
    TIME_HEADER,
    request_signature,
)
from queue_service.core.errors import Refusal
from queue_service.engine.node_credentials import NodeCredential, NodeCredentials

#: How far a report's signed time may be from the service's clock (the nodes run NTP).
MAX_SKEW_SECONDS = 60.0


def _refuse(message: str) -> Refusal:
    return Refusal(message, "forbidden")


class NodeIdentity:
    """Checks reports against the nodes' keys; remembers each node's last signed time."""

    def __init__(
        self,
        credentials: NodeCredentials,
        max_skew: float = MAX_SKEW_SECONDS,
        clock: Callable[[], float] = time.time,
    ):
        self.credentials, self.max_skew, self.clock = credentials, max_skew, clock
        self._last: dict[str, float] = {}
        self._nonces: dict[tuple[str, str], float] = {}  # (node id, nonce) → its signed time

    def verify(
        self, hostname: str, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[NodeCredential, float]:
        """The credential of the node that signed this report, and its signed time."""
        credential, signed_at = self.signed(hostname, method, path, headers, body)
        last = self._last.get(credential.node_id)
        if last is not None and signed_at <= last:
            raise _refuse(
                f"A report of node {hostname} signed no later than the last one taken: a replay."
            )
        self._last[credential.node_id] = signed_at
        return credential, signed_at

    def verify_once(
        self, hostname: str, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> NodeCredential:
        """The credential of the node that signed this request of its shell channel
        (swarm_exec.py). Those requests overlap (a long poll, a shell's connection, a result),
        so they may arrive out of their signed order: each nonce is taken once instead, and
        remembered for as long as its time would pass the clock check."""
        credential, signed_at = self.signed(hostname, method, path, headers, body)
        now = self.clock()
        self._nonces = {n: t for n, t in self._nonces.items() if t > now - 2 * self.max_skew}
        nonce = (credential.node_id, headers.get(NONCE_HEADER) or "")
        if nonce in self._nonces:
            raise _refuse(f"A request of node {hostname} with a nonce already taken: a replay.")
        self._nonces[nonce] = signed_at
        return credential

    def signed(
        self, hostname: str, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[NodeCredential, float]:
        """The credential whose key signed this request, and its signed time (within
        `max_skew` of the clock); no replay check."""
        credential = self._credential(headers.get(NODE_ID_HEADER) or "", hostname)
        signed_at = self._signed_time(headers.get(TIME_HEADER) or "")
        expected = request_signature(
            credential.key,
            method,
            path,
            credential.node_id,
            headers.get(TIME_HEADER) or "",
            headers.get(NONCE_HEADER) or "",
            body,
        )
        # Bytes: a header is any latin-1 text, and compare_digest refuses non-ASCII strings.
        given = (headers.get(SIGNATURE_HEADER) or "").encode("latin-1", "replace")
        if not headers.get(NONCE_HEADER) or not hmac.compare_digest(expected.encode(), given):
            raise _refuse(f"The report's signature does not match node {hostname}'s key.")
        return credential, signed_at

    def check_sampled_at(self, sampled_at: str, signed_at: float) -> None:
        """The report's own time agrees with its signed time (a report kept back is stale)."""
        try:
            sampled = datetime.fromisoformat(sampled_at).timestamp()
        except (ValueError, TypeError):
            raise Refusal(f"sampled_at {sampled_at!r} is not an ISO time.", "invalid") from None
        if abs(sampled - signed_at) > self.max_skew:
            raise _refuse(
                f"The report was sampled {abs(sampled - signed_at):.0f} s away from when it was "
                f"signed (at most {self.max_skew:g} s): a stale report."
            )

    def _credential(self, node_id: str, hostname: str) -> NodeCredential:
        if not node_id:
            raise _refuse("The report is not signed with a node's key (no node id).")
        credential = self.credentials.get(node_id)
        if credential is None:
            raise _refuse(
                f"Node id {node_id[:64]!r} has no key here: its agent was not deployed by this "
                "hub, or its key was rotated."
            )
        if credential.hostname != hostname:
            raise _refuse(
                f"The key of node {credential.hostname} cannot report for node {hostname}: "
                "a node reports only for itself."
            )
        return credential

    def _signed_time(self, text: str) -> float:
        try:
            signed_at = float(text)
        except ValueError:
            raise _refuse(f"The report's signed time {text[:32]!r} is not a number.") from None
        if not math.isfinite(signed_at):
            raise _refuse("The report's signed time is not a number.")
        skew = abs(self.clock() - signed_at)
        if skew > self.max_skew:
            raise _refuse(
                f"The report was signed {skew:.0f} s away from this service's clock (at most "
                f"{self.max_skew:g} s): a stale or replayed report, or a node whose clock is off."
            )
        return signed_at
