"""Which catalog images the site's registry holds: in Swarm mode, what "on the engine" means.

A Swarm's nodes pull each session's image from the site's registry when the session starts
(`FGPUSwarmSpawner.registry`), so an image every node can run is one the registry holds under its
catalog reference. The service asks the registry (its HTTP API v2: `HEAD /v2/<name>/manifests/<tag>`)
for each catalog image, as often as it lists the local engine's images in single-host mode, and
the launcher offers only the images found (images.py, `note_engine_images`).

As Docker does for a registry, HTTPS is tried first and plain HTTP after it (a registry the nodes
trust as insecure, as the lab's is). A registry that cannot be asked at all raises, and the last
answer stands.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterable

#: What a registry is asked to answer with: any image manifest or list (Docker's and OCI's).
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
    ]
)
TIMEOUT_S = 5.0


class RegistryUnreachable(RuntimeError):
    """The registry answered neither over HTTPS nor over HTTP."""


def manifest_path(reference: str) -> str:
    """`/v2/<name>/manifests/<tag>` of an image reference (the tag defaults to `latest`)."""
    if "@" in reference:  # a digest names the manifest itself
        name, tag = reference.split("@", 1)
        return f"/v2/{name}/manifests/{tag}"
    name, tag = reference, "latest"
    if ":" in reference.rsplit("/", 1)[-1]:  # a registry's port is not a tag
        name, tag = reference.rsplit(":", 1)
    return f"/v2/{name}/manifests/{tag}"


def registry_references(registry: str, references: Iterable[str]) -> set[str]:
    """The references that the registry (host:port) holds, named as the catalog names them (a
    private image's reference starts with the registry's address). Blocking: run it in a thread."""
    base = _base_url(registry)
    return {ref for ref in references if _holds(base, ref.removeprefix(f"{registry}/"))}


def _base_url(registry: str) -> str:
    errors = []
    for scheme in ("https", "http"):
        base = f"{scheme}://{registry}"
        try:
            _status(base + "/v2/")
            return base
        except (urllib.error.URLError, ssl.SSLError, OSError, ValueError) as e:
            errors.append(f"{scheme}: {getattr(e, 'reason', e)}")
    raise RegistryUnreachable(f"registry {registry} did not answer ({'; '.join(errors)})")


def _holds(base: str, reference: str) -> bool:
    return _status(base + manifest_path(reference)) == 200


def _status(url: str) -> int:
    request = urllib.request.Request(url, method="HEAD", headers={"Accept": MANIFEST_TYPES})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.status
    except urllib.error.HTTPError as e:
        if e.code in (401, 404):  # /v2/ of a registry that wants a login still answers
            return e.code
        raise
