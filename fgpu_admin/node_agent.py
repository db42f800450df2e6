"""Manage the node agents: `fgpu-hub node-agent rotate NODE` gives a node's agent a new key.

Each Swarm node's agent signs its reports with a key of its own (docs/source/howto/adding-nodes.md, "Node
agents and their keys"). `rotate` asks the running queue service for a new key for NODE (its
hostname or Swarm node id): the old key is refused from that moment, and the node's agent service
moves to a Swarm secret holding the new one (its task restarts, and reports again within seconds).
Run it when a node may have been compromised, or when a node is rebuilt.

It needs an admin's hub API token in FGPU_ADMIN_TOKEN (the hub's Token page), and the hub's
address (default: where the shipped config listens; --hub-url otherwise).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from urllib.parse import quote

import requests

from .cli import AdminError
from .doctor import ADMIN_TOKEN_ENV, default_hub_url


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    rotate = actions.add_parser("rotate", help="a new key for one node's agent")
    rotate.add_argument("node", help="the node's hostname or Swarm node id")
    rotate.add_argument("--hub-url", help="the hub's address (default: the shipped config's)")
    rotate.add_argument("--timeout", type=float, default=120.0, help="seconds to wait (120)")


def run(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> int:
    token = environ.get(ADMIN_TOKEN_ENV)
    if not token:
        raise AdminError(f"set {ADMIN_TOKEN_ENV} to an admin's API token (the hub's Token page)")
    hub = (args.hub_url or default_hub_url(environ)).rstrip("/")
    url = f"{hub}/services/queue/api/nodes/{quote(args.node, safe='')}/key"
    try:
        response = requests.post(
            url, headers={"Authorization": f"token {token}"}, timeout=args.timeout
        )
    except requests.RequestException as e:
        raise AdminError(f"no hub answers at {hub}: {e}") from None
    if response.status_code != 200:
        raise AdminError(
            f"the queue service refused ({response.status_code}): {_message(response)}"
        )
    rotated = response.json()
    print(
        f"node {rotated['node']} ({rotated['node_id']}): new agent key made {rotated['made']}; "
        "the old key is refused, and the agent restarts with the new one"
    )
    return 0


def _message(response: requests.Response) -> str:
    try:
        return str(response.json().get("message"))
    except ValueError:
        return response.text[:300]
