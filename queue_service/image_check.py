"""Checks an image before it enters the catalog: is it on the engine, and does it start a server?

The engine's part, a short confined container that runs `jupyterhub-singleuser --version`, is
engine/image_check.py; this module words what it found for the catalog: an `ImageError` (a clear
400 for an image the engine lacks) or the `CheckResult` the catalog records. Blocking; the API
runs it in a thread.
"""

from __future__ import annotations

from queue_service.engine.errors import EngineRefusal
from queue_service.engine.image_check import run_singleuser
from queue_service.engine.local_images import ImageAbsent
from queue_service.engine.local_images import image_labels as labels_on_engine
from queue_service.store.images import CheckResult, ImageError
from queue_service.store.models import utcnow


def image_labels(client, reference: str) -> dict[str, str]:
    """The image's labels; a clear 400 when the engine does not have it (there is no registry)."""
    try:
        return labels_on_engine(client, reference)
    except ImageAbsent:
        raise ImageError(
            f"Image {reference} is not on this host's Docker engine. Build it first "
            "(python -m image_catalog build NAME), or load it with docker load.",
            "invalid",
        ) from None
    except EngineRefusal as e:
        raise engine_failed(reference, e) from None


def engine_failed(reference: str, refusal: EngineRefusal) -> ImageError:
    """The refusal of an image the engine could not look at."""
    return ImageError(f"The Docker engine could not inspect {reference}: {refusal}", "engine")


def check_singleuser(
    client, reference: str, timeout: float = 60, run_as: str = "1000:100"
) -> CheckResult:
    """Run the image's single-user server with --version; ok when it exits 0."""
    run = run_singleuser(client, reference, timeout, run_as)
    if run.problem is not None:
        return CheckResult(False, f"It cannot start a single-user server: {run.problem}.", utcnow())
    return CheckResult(True, f"jupyterhub-singleuser {run.output}".strip(), utcnow())
