"""SSH into a session on a Swarm worker: `ssh user@hub true` against `docker exec` on the node.

The hub runs in Swarm mode on a lab of its own (`scripts/swarm-lab`, as `swarm_spawn.py`: a lab
of that name that is up already is reused and left up, else it is made and taken down at the
end), with the node agents going through the hub's proxy, as tests/test_swarm_ssh_hub.py runs
it. One student holds a GPU session on a worker. Timed, interleaved so that a busy neighbour
slows both alike, median of `--rounds`:

- `ssh -p <port> sam@127.0.0.1 true` with Debian's OpenSSH client (the login included, the
  password by SSH_ASKPASS): the service hands the shell to the worker's node agent, which starts
  it on its engine and connects back (engine/exec_rendezvous.py);
- `docker exec <session container> true` against the worker's engine, from this machine.

Goal (issue's): ssh ≤ 2× docker exec.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from benchmarks.ssh_sftp import OPTIONS, OpenSSH, timed
from benchmarks.swarm_spawn import add_lab_arguments, lab, lab_settings, remove_services, uptime
from tests.harness import QueueUser, running_hub
from tests.swarm_lab import engine_client, swarm_lab
from tests.test_swarm_hub import EXTRA_CONFIG, GPU_SESSION, session_of
from tests.test_swarm_ssh_hub import THROUGH_THE_PROXY


def node_url(settings: dict[str, str], node: str) -> str:
    """The engine URL of the lab's worker `node` (`swarm-lab status`)."""
    lines = swarm_lab("status", lab_env=settings).stdout.splitlines()
    return {line.split()[0]: line.split()[1] for line in lines}[node]


def session_on_its_node(hub, lab_env: dict[str, str], settings: dict[str, str]) -> tuple:
    """sam's running GPU session: its token, and `docker exec` argv and environment on its node."""
    user = QueueUser(hub, "sam")
    response = hub.start_server(user.name, GPU_SESSION)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(user.name, timeout=600)  # the worker may pull the image first
    record = session_of(QueueUser(hub, "admin"), user.name, "")
    url = node_url(settings, record["grant"]["node"])
    engine = engine_client({**lab_env, "DOCKER_HOST": url})
    (container,) = engine.containers.list(filters={"label": f"fgpu.session_id={record['id']}"})
    token = user.http.headers["Authorization"].split()[1]
    env = {**os.environ, **lab_env, "DOCKER_HOST": url}
    return token, ["docker", "exec", container.id, "true"], env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="ssh and docker exec runs timed")
    add_lab_arguments(parser)
    args = parser.parse_args()
    settings = lab_settings(args)
    exports, take_down = lab(settings, args.keep_lab)
    lab_env = {**settings, **exports}
    env = {**exports, "FGPU_HUB_IP": "0.0.0.0", "FGPU_DEMO_LOGIN_ON_NETWORK": "1"}
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            running_hub(Path(tmp) / "hub", EXTRA_CONFIG + THROUGH_THE_PROXY, env=env) as hub,
        ):
            try:
                token, docker_exec, docker_env = session_on_its_node(hub, lab_env, settings)
                client = OpenSSH(hub.env["FGPU_SSH_PORT"], "sam", token, Path(tmp), OPTIONS)
                figures(client, docker_exec, docker_env, args.rounds)
            finally:
                remove_services(lab_env, hub.run_id)
                agents = engine_client(lab_env).services.list(filters={"name": "fgpu-node-agent"})
                for agent in agents:
                    agent.remove()
    finally:
        take_down()


def figures(client: OpenSSH, docker_exec: list[str], docker_env: dict, rounds: int) -> None:
    client.ssh("true")  # the first login warms the caches both sides keep
    ssh, engine = [], []
    for _ in range(rounds):
        ssh.append(client.ssh("true"))
        engine.append(timed(docker_exec, env=docker_env))
    load = uptime()
    ssh_ms, engine_ms = statistics.median(ssh) * 1000, statistics.median(engine) * 1000
    print(f"Swarm worker, {rounds} rounds   [{load}]")
    print(f"ssh true p50 {ssh_ms:.0f} ms (max {max(ssh) * 1000:.0f})")
    print(f"docker exec true on the node p50 {engine_ms:.0f} ms (max {max(engine) * 1000:.0f})")
    print(f"ratio ssh / docker exec: {ssh_ms / engine_ms:.2f} (goal <= 2)")


if __name__ == "__main__":
    main()
