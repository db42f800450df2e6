"""Session-wide hubs that one failing test cannot topple.

Most hub-level tests share a few hubs (`hub`, `gpu_hub`, `one_gpu_hub` in conftest.py), and each
test or module stops what it started. A server whose stop the hub refuses or never finishes (a
frozen container once did this) would stay on the shared hub, holding its slice, and make every
later test on it wait and fail, far from the cause. `SharedHub.end_servers` therefore replaces the
hub with a fresh one when its leftovers will not stop, and fails the test that left them, with
why: the first failure is reported as the cause, and the tests after it run on a clean hub.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest

from .harness import Hub


class SharedHub:
    """Stands in for the running `Hub` (attributes are the current hub's), replaceable."""

    def __init__(self, name: str, start: Callable[[], AbstractContextManager[Hub]]):
        vars(self).update(name=name, _start=start, _extras={}, replaced=0)
        self._open()

    def __getattr__(self, name: str):
        return getattr(vars(self)["_hub"], name)

    def __setattr__(self, name: str, value) -> None:
        # Set on the hub, and again on each replacement (a fixture's scraper token, say).
        self._extras[name] = value
        setattr(self._hub, name, value)

    def end_servers(
        self, servers: set[tuple[str, str]], cause: str, request_timeout: float = 120
    ) -> None:
        """Stop `servers`, which `cause` left; when the hub will not, replace it and fail."""
        if not servers:
            return
        try:
            self._hub.stop_servers(servers, request_timeout=request_timeout)
            left = servers & self._hub.active_servers()
            problem = f"{sorted(left)} still listed after their stop" if left else None
        except Exception as e:  # a refused stop (500), or a stop that never answered
            problem = f"{type(e).__name__}: {e}"
        if problem is None:
            return
        self.replace()
        pytest.fail(
            f"{cause} left servers on the shared hub {self.name} that it could not stop"
            f" ({problem}). The hub was replaced by a fresh one, so the tests after this one"
            " run on a clean hub: this is the failure to look at.",
            pytrace=False,
        )

    def replace(self) -> None:
        self.close()
        vars(self)["replaced"] += 1
        self._open()

    def close(self) -> None:
        vars(self)["_context"].__exit__(None, None, None)

    def _open(self) -> None:
        context = self._start()
        hub = context.__enter__()
        for name, value in self._extras.items():
            setattr(hub, name, value)
        vars(self).update(_context=context, _hub=hub)
