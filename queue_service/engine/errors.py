"""What the engine's failures look like to the modules above `engine/`, which never name docker-py.

- `ENGINE_ERRORS`: the engine did not answer (down, restarting, its socket gone) or failed a call;
  the reconciler says so and tries again next round, a batch job's notebook goes unchecked
  (job_files.py).
- `EngineRefusal`: the engine answered a call with an error; its text is docker-py's, so the
  messages people read are the engine's own words.
"""

from __future__ import annotations

import docker.errors
import requests

#: Errors that mean the engine does not answer (down, restarting, or its socket gone).
ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


class EngineRefusal(Exception):
    """The engine answered a call with an error (docker-py's `APIError`, the `__cause__`).

    `str()` is the whole answer as docker-py words it; `explanation` the engine's own words, or
    the whole answer when it gave none."""

    def __init__(self, error: docker.errors.APIError):
        super().__init__(str(error))
        self.explanation = error.explanation or str(error)
