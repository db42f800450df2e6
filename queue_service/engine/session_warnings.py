"""Warnings put inside a session's container on the engine the service talks to (one host): the
file `~/FGPU-WARNING.txt`, and for a lifetime's end its open terminals too. Automatic ends
(automatic_ends.py) decide when and what; this writes it, by `docker exec` as the session's user.
A file written so is no activity for jupyter-server, as terminal output would be (which is why an
idle warning goes to the file alone). In Swarm mode sessions run on other engines: there is no
notifier, and the page alone warns.
"""

from __future__ import annotations

import asyncio

from .container_calls import ContainerCalls, ContainerLocks
from .session_containers import running_session_containers

WARNING_FILE = "FGPU-WARNING.txt"

#: Writes the warning file in the session's home and, when $2 is 1, to each of its terminals (the
#: pseudo-terminals its user owns: Jupyter's terminals are not in utmp, so `wall` misses them).
#: The text comes as an argument, never as shell code.
_WARN_SCRIPT = (
    'printf "%s\\n" "$1" > "$HOME/' + WARNING_FILE + '"; '
    'if [ "$2" = 1 ]; then for t in /dev/pts/[0-9]*; do '
    '[ -w "$t" ] && printf "\\r\\n\\033[1;31m%s\\033[0m\\r\\n" "$1" > "$t"; done; fi; true'
)
_CLEAR_SCRIPT = 'rm -f "$HOME/' + WARNING_FILE + '"'


class DockerNotifier:
    """Puts a warning inside a session container on this engine (`docker exec` as its user).

    The exec goes through `calls` (bounded: a container that does not answer is skipped, not
    waited on) and only while no commit holds the container (`locks`): an exec that enters a
    container being committed is what froze a session for good (container_calls.py). A warning
    skipped so is tried again next round.
    """

    def __init__(self, docker_client, calls: ContainerCalls, locks: ContainerLocks):
        self.docker = docker_client
        self.calls = calls
        self.locks = locks

    async def warn(self, session_id: str, text: str, terminals: bool) -> bool:
        command = ["sh", "-c", _WARN_SCRIPT, "sh", text, "1" if terminals else "0"]
        return await self._exec(session_id, command)

    async def clear(self, session_id: str) -> bool:
        return await self._exec(session_id, ["sh", "-c", _CLEAR_SCRIPT])

    async def _exec(self, session_id: str, command: list[str]) -> bool:
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(
            None, running_session_containers, self.docker, session_id
        )
        container = found.get(session_id)
        if container is None:
            return False
        return await self.calls.call(
            container.id,
            session_id,
            "exec",
            self._exec_unless_committing,
            container,
            session_id,
            command,
        )

    def _exec_unless_committing(self, container, session_id: str, command: list[str]) -> bool:
        with self.locks.exec_unless_committing(session_id) as held:
            return held and container.exec_run(command).exit_code == 0
