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

A site's registry wants a login (QueueService.registry_auth_file: HTTP basic auth, as htpasswd
gives, or a bearer token its token service gives for those credentials, as Harbor's and GitLab's
do) and speaks TLS, its certificate checked against the system's CAs or the site's own
(SwarmEngine.registry_ca). Without credentials, as Docker does for a registry, HTTPS is tried
first and plain HTTP after it (a registry the nodes trust as insecure); with them, HTTPS only, so
that the password never travels in clear. A registry that cannot be asked at all raises, and the
last answer stands.
"""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass

from fgpu_shared.registry_auth import basic_authorization

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


@dataclass(frozen=True)
class Registry:
    """How to ask one registry: its base URL, its TLS context, its `Authorization` header."""

    base: str
    context: ssl.SSLContext | None = None
    authorization: str | None = None


def schemes_for(auth: dict | None) -> tuple[str, ...]:
    """The schemes to try, in order: credentials go over HTTPS only."""
    return ("https",) if auth else ("https", "http")


def bearer_challenge(header: str) -> dict[str, str] | None:
    """The parameters of a `WWW-Authenticate: Bearer realm="...",service="...",scope="..."`
    challenge (a registry with token auth), or None for any other scheme."""
    scheme, _, params = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return dict(re.findall(r'(\w+)="([^"]*)"', params))


def token_url(challenge: dict[str, str]) -> str:
    """Where the token for a challenge is asked for: its realm, with its service and scope."""
    query = {key: challenge[key] for key in ("service", "scope") if challenge.get(key)}
    return challenge["realm"] + ("?" + urllib.parse.urlencode(query) if query else "")


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


def registry_digests(
    registry: str,
    references: Iterable[str],
    auth: dict[str, str] | None = None,
    ca_file: str | None = None,
) -> dict[str, str]:
    """Each reference the registry (host:port) holds, named as the catalog names it (a private
    image's reference starts with the registry's address), with the digest of the manifest it
    points at now; asked with `auth` (fgpu_shared/registry_auth.py) when given, over TLS
    checked against `ca_file` when given. Blocking: run it in a thread."""
    target = _connect(registry, auth, ca_file)
    found = {ref: _digest(target, ref.removeprefix(f"{registry}/")) for ref in references}
    return {ref: digest for ref, digest in found.items() if digest is not None}


def _connect(registry: str, auth: dict[str, str] | None, ca_file: str | None) -> Registry:
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    authorization = basic_authorization(auth) if auth else None
    errors = []
    for scheme in schemes_for(auth):
        target = Registry(f"{scheme}://{registry}", context, authorization)
        try:
            status, headers = _head(target, "/v2/", authorization)
        except (urllib.error.URLError, ssl.SSLError, OSError, ValueError) as e:
            errors.append(f"{scheme}: {getattr(e, 'reason', e)}")
            continue
        # A token registry answers every request without its token so; the token comes later.
        if status == 401 and auth and not bearer_challenge(headers.get("WWW-Authenticate", "")):
            raise RegistryUnreachable(f"registry {registry} refused the credentials given")
        return target
    raise RegistryUnreachable(f"registry {registry} did not answer ({'; '.join(errors)})")


def _digest(target: Registry, reference: str) -> str | None:
    path = manifest_path(reference)
    status, headers = _head(target, path, target.authorization)
    challenge = bearer_challenge(headers.get("WWW-Authenticate", "")) if status == 401 else None
    # The credentials go to a token service over HTTPS only, as to the registry itself.
    if challenge and target.authorization and challenge.get("realm", "").startswith("https://"):
        status, headers = _head(target, path, f"Bearer {_token(target, challenge)}")
    return headers.get("Docker-Content-Digest") if status == 200 else None


def _token(target: Registry, challenge: dict[str, str]) -> str:
    """A pull token from the registry's token service, asked with the basic credentials."""
    request = urllib.request.Request(
        token_url(challenge), headers={"Authorization": target.authorization or ""}
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=target.context) as response:
        answer = json.loads(response.read())
    return answer.get("token") or answer["access_token"]


def _head(target: Registry, path: str, authorization: str | None) -> tuple[int, dict]:
    headers = {"Accept": MANIFEST_TYPES}
    if authorization:
        headers["Authorization"] = authorization
    request = urllib.request.Request(target.base + path, method="HEAD", headers=headers)
    context = target.context if target.base.startswith("https:") else None
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as e:
        if e.code in (401, 404):  # /v2/ of a registry that wants a login still answers
            return e.code, dict(e.headers)
        raise
