"""Which catalog images the site's registry holds: in Swarm mode, what "on the engine" means.

A Swarm's nodes pull each session's image from the site's registry when the session starts
(`FGPUSwarmSpawner.registry`), so an image every node can run is one the registry holds under its
catalog reference. The service asks the registry (its HTTP API v2: `HEAD /v2/<name>/manifests/<tag>`)
for each catalog image, as often as it lists the local engine's images in single-host mode, and
the launcher offers only the images found (images.py, `note_engine_images`).

Each image is also **pinned** to the digest its tag pointed at when the service first found it
(images.py, `pin_digests`), and Swarm sessions start from `<registry>/<name>@<digest>`: a tag
moved behind the hub's back (a push by someone else) does not change what the next session runs.
An admin's "Check" of the image pins it again to what the tag holds then.

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


def split_reference(reference: str) -> tuple[str, str]:
    """(name, tag or digest) of an image reference; the tag defaults to `latest`, and a
    registry's port is not a tag."""
    if "@" in reference:
        name, digest = reference.split("@", 1)
        return name, digest
    if ":" in reference.rsplit("/", 1)[-1]:
        name, tag = reference.rsplit(":", 1)
        return name, tag
    return reference, "latest"


def manifest_path(reference: str) -> str:
    """`/v2/<name>/manifests/<tag or digest>` of an image reference."""
    name, tag = split_reference(reference)
    return f"/v2/{name}/manifests/{tag}"


def pinned_reference(reference: str, digest: str | None) -> str:
    """What a session starts from: `<name>@<digest>` once pinned, else the reference itself."""
    return f"{split_reference(reference)[0]}@{digest}" if digest else reference


def registry_digests(registry: str, references: Iterable[str]) -> dict[str, str]:
    """Each reference the registry (host:port) holds, named as the catalog names it (a private
    image's reference starts with the registry's address), with the digest of the manifest it
    points at now. Blocking: run it in a thread."""
    base = _base_url(registry)
    found = {ref: _digest(base, ref.removeprefix(f"{registry}/")) for ref in references}
    return {ref: digest for ref, digest in found.items() if digest is not None}


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


def _digest(base: str, reference: str) -> str | None:
    status, headers = _head(base + manifest_path(reference))
    return headers.get("Docker-Content-Digest") if status == 200 else None


def _status(url: str) -> int:
    return _head(url)[0]


def _head(url: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, method="HEAD", headers={"Accept": MANIFEST_TYPES})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as e:
        if e.code in (401, 404):  # /v2/ of a registry that wants a login still answers
            return e.code, {}
        raise
