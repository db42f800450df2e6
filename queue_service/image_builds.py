"""The heavy images (TensorFlow, PyTorch), built behind the hub: `BackgroundBuilds`.

`scripts/up` builds the light images (the Jupyter base, scikit-learn) and starts the hub at once;
the framework images take minutes each, so the service builds them afterwards, one at a time,
each with the project's own build tool (`python -m image_catalog build NAME`) in a subprocess.
The Images page shows each build's state and its last step; the launcher offers an image once it
is on the engine (`ImageStore.note_engine_images`).

Restart-safe by construction: nothing is stored. Every start queues the same images again, and
the build tool skips an image whose recipe-hash label is unchanged, in a second or two. A build
cut short by a stop ends with its subprocess (it dies with the service), and the next start
builds it again from the engine's layer cache.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

#: The engine's legacy builder announces each Dockerfile step as "Step 3/7 : RUN ...".
_STEP = re.compile(r"^\s*Step (\d+)/(\d+) : (.*)$")
_DETAIL_CHARS = 160


@dataclass
class BuildState:
    """One image's build, as the Images page shows it."""

    state: str = "queued"  # queued, building, built, failed
    step: str = ""  # "step 3 of 7", while building
    last_line: str = ""
    reason: str = ""  # why it failed
    cause: str = ""  # pip's own "ERROR: ..." line, which says why better than the engine's
    started: float | None = None
    seconds: float | None = None

    def view(self) -> dict:
        return asdict(self)


def read_line(state: BuildState, line: str) -> None:
    """Fold one line of the build tool's output into `state` (pure: no I/O)."""
    text = line.strip()
    if not text:
        return
    step = _STEP.match(text)
    if step:
        state.step = f"step {step[1]} of {step[2]}"
    if text.startswith("ERROR: ") and not state.cause:
        state.cause = _short(text)
    if text.startswith("error: "):
        state.reason = _short(text.removeprefix("error: "))
    state.last_line = _short(text)


def finish(state: BuildState, exit_code: int, now: float) -> None:
    """The state once the build tool has exited with `exit_code` (pure)."""
    state.seconds = round(now - state.started, 1) if state.started is not None else None
    if exit_code == 0:
        state.state, state.reason = "built", ""
        return
    state.state = "failed"
    state.reason = state.reason or f"the build tool exited with code {exit_code}: {state.last_line}"
    if state.cause:
        state.reason = f"{state.cause} ({state.reason})"


def build_command(name: str, catalog_path: str = "") -> list[str]:
    catalog = ["--catalog", catalog_path] if catalog_path else []
    return [sys.executable, "-m", "image_catalog", *catalog, "build", name]


def _short(text: str) -> str:
    first = text.splitlines()[0] if text else ""
    return first if len(first) <= _DETAIL_CHARS else first[: _DETAIL_CHARS - 1] + "…"


class BackgroundBuilds:
    """Builds `names` one after another; `view()` tells where each is.

    `built` is called after each build (success or not), so that the service looks at the
    engine again and offers what is now there.
    """

    def __init__(
        self,
        names: Iterable[str],
        catalog_path: str = "",
        built: Callable[[], object] | None = None,
        log=None,
        preexec: Callable[[], None] | None = None,
    ):
        self.names = list(names)
        self.catalog_path = catalog_path
        self.built = built
        self.log = log
        self.preexec = preexec
        self.states = {name: BuildState() for name in self.names}

    def view(self) -> dict[str, dict]:
        return {name: state.view() for name, state in self.states.items()}

    async def run(self) -> None:
        for name in self.names:
            await self.build_one(name)
            if self.built is not None:
                await asyncio.to_thread(self.built)

    async def build_one(self, name: str) -> None:
        state = self.states[name]
        state.state, state.started = "building", time.monotonic()
        try:
            process = await asyncio.create_subprocess_exec(
                *build_command(name, self.catalog_path),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                # The build dies with the service: a restart builds it again, never twice at once.
                preexec_fn=self.preexec,
                limit=1 << 20,
            )
        except OSError as e:
            state.last_line = f"error: the build tool did not start: {e}"
            read_line(state, state.last_line)
            finish(state, 1, time.monotonic())
            return
        async for raw in process.stdout:
            read_line(state, raw.decode(errors="replace"))
        finish(state, await process.wait(), time.monotonic())
        if self.log is not None:
            self.log.info(
                "Background build of %s: %s in %.0f s%s",
                name,
                state.state,
                state.seconds or 0,
                f" ({state.reason})" if state.reason else "",
            )
