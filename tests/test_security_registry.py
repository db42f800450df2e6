"""The registry the nodes pull from, on the run's Swarm lab (tests/swarm_lab.py).

The lab's registry is kept as a site keeps its own (scripts/swarm-lab;
docs/source/howto/adding-nodes.md, "The registry"): every pull and push wants the one user's
password, the nodes' listener speaks TLS with a certificate of the lab's CA, and each node's
DOCKER-USER chain rejects its containers' traffic to it. Here, from the hub's side (the root namespace) and from inside containers on a node. What a real
session sees, and that a tag moved behind the hub's back does not change what the next session
runs, is checked on the Swarm hub (tests/test_swarm_hub.py), whose sessions are already there.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import urllib.error
import urllib.request

import pytest

from fgpu_shared.registry_auth import basic_authorization, read_registry_auth
from queue_service.engine.registry_images import RegistryUnreachable, registry_digests

from .swarm_lab import IMAGE, LAB_DIR, LAB_NAME, LAB_NET, Lab

pytestmark = [pytest.mark.docker]

GATEWAY = f"{LAB_NET}.0.1"
#: The loopback listener the machine's engine pushes to (scripts/swarm-lab, PUSH_PORT).
PUSH_LISTENER = f"127.0.0.1:{15000 + int(LAB_NET.split('.')[1])}"
#: An image manifest with no layers, as a push of a backdoored image would end.
MANIFEST = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
    "config": {
        "mediaType": "application/vnd.docker.container.image.v1+json",
        "size": 2,
        "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
    },
    "layers": [],
}


def ask(url: str, auth: str | None = None, method: str = "GET", cafile: str | None = None):
    """The status the registry answers (or the error that stood in its way), and its body."""
    headers = {"Authorization": auth} if auth else {}
    data = None
    if method == "PUT":
        data = json.dumps(MANIFEST).encode()
        headers["Content-Type"] = MANIFEST["mediaType"]
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    context = ssl.create_default_context(cafile=cafile) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_registry_wants_the_password_for_reads_and_pushes_and_tls_on_the_nodes_side(lab: Lab):
    registry, ca = lab.env["FGPU_SWARM_REGISTRY"], lab.env["FGPU_SWARM_REGISTRY_CA"]
    assert registry == f"{GATEWAY}:5000"
    auth = read_registry_auth(lab.env["FGPU_SWARM_REGISTRY_AUTH_FILE"])
    assert auth["serveraddress"] == registry
    catalog = f"https://{registry}/v2/_catalog"
    manifest = f"https://{registry}/v2/fgpu/jupyter-base/manifests/evil"

    # Without the password nothing is read or written, on either listener.
    assert ask(catalog, cafile=ca)[0] == 401
    assert ask(manifest, method="PUT", cafile=ca)[0] == 401
    assert ask(f"http://{PUSH_LISTENER}/v2/_catalog")[0] == 401
    assert ask(f"http://{PUSH_LISTENER}/v2/fgpu/x/manifests/evil", method="PUT")[0] == 401
    wrong = basic_authorization({**auth, "password": "guessed"})
    assert ask(catalog, wrong, cafile=ca)[0] == 401
    # With it, the catalog; the nodes' listener speaks TLS only.
    status, body = ask(catalog, basic_authorization(auth), cafile=ca)
    assert status == 200 and "fgpu/jupyter-base" in json.loads(body)["repositories"]
    assert (
        ask(f"http://{registry}/v2/")[0] == 400
    )  # "client sent an HTTP request to an HTTPS server"

    # The queue service's listing: with the credentials and the CA, the digest; without, nothing.
    found = registry_digests(registry, {IMAGE}, auth, ca)
    assert found[IMAGE].startswith("sha256:")
    with pytest.raises(RegistryUnreachable, match="refused the credentials"):
        registry_digests(registry, {IMAGE}, {**auth, "password": "guessed"}, ca)
    with pytest.raises(RegistryUnreachable, match="did not answer"):
        registry_digests(registry, {IMAGE}, auth)  # a certificate no public CA signed


def test_every_node_trusts_the_registry_by_its_ca_not_as_insecure(lab: Lab):
    for node in [f"{LAB_NAME}-manager", *lab.nodes]:
        etc = LAB_DIR / "nodes" / node / "etc"
        assert "insecure-registries" not in json.loads((etc / "daemon.json").read_text()), node
        ca = etc / "certs.d" / f"{GATEWAY}:5000" / "ca.crt"
        assert ca.read_bytes() == (LAB_DIR / "tls" / "ca.pem").read_bytes(), node
    info = lab.manager().info()
    assert f"{GATEWAY}:5000" not in str(info["RegistryConfig"]["IndexConfigs"])


#: Run in a container: each URL's status, or the error that stood in its way, as JSON.
PROBE = """
import json, ssl, sys, urllib.request
context = ssl._create_unverified_context()
found = {}
for method, url in zip(sys.argv[1::2], sys.argv[2::2]):
    request = urllib.request.Request(url, data=b"{}" if method == "PUT" else None, method=method)
    try:
        with urllib.request.urlopen(request, timeout=3, context=context) as reply:
            found[method + " " + url] = reply.status
    except urllib.error.HTTPError as e:
        found[method + " " + url] = e.code
    except Exception as e:
        found[method + " " + url] = type(getattr(e, "reason", e)).__name__
print(json.dumps(found))
"""


def probe_registry(container) -> dict:
    """From inside `container`: read the catalog and push a manifest, over TLS and plain HTTP."""
    base = f"{GATEWAY}:5000"
    args = [
        *("GET", f"https://{base}/v2/_catalog"),
        *("PUT", f"https://{base}/v2/fgpu/jupyter-base/manifests/evil"),
        *("GET", f"http://{base}/v2/_catalog"),
    ]
    done = container.exec_run(["python3", "-c", PROBE, *args])
    return json.loads(done.output.decode().splitlines()[-1])


def unreachable(found: dict) -> bool:
    """Every try was turned away before the registry answered (DOCKER-USER's reset)."""
    return bool(found) and all(v == "ConnectionRefusedError" for v in found.values())


def test_a_container_on_a_node_cannot_reach_the_registry_which_its_engine_pulls_from(lab: Lab):
    node = lab.nodes[0]
    engine = lab.engine(f"tcp://{LAB_NET}.0.11:2376")
    # The node's engine pulls over the namespace's own stack (a login, then the image).
    image = engine.images.pull(f"{lab.env['FGPU_SWARM_REGISTRY']}/{IMAGE.split(':')[0]}", "py3.11")
    container = engine.containers.run(
        image.id, ["sleep", "60"], detach=True, user="1000", cap_drop=["ALL"]
    )
    try:
        found = probe_registry(container)
        assert unreachable(found), found
    finally:
        container.remove(force=True)
    # Not that the registry is away: the node's own stack reaches it (and wants the password).
    in_node = ["nsenter", f"--net=/run/netns/{node}"]
    code = subprocess.run(
        [*in_node, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5"]
        + ["--cacert", lab.env["FGPU_SWARM_REGISTRY_CA"], f"https://{GATEWAY}:5000/v2/_catalog"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert code == "401"
    rules = subprocess.run(
        [*in_node, "iptables", "-S", "DOCKER-USER"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert rules[1].startswith(
        f"-A DOCKER-USER -d {GATEWAY}/32 -p tcp -m tcp --dport 5000 -j REJECT"
    )


def test_the_credentials_file_is_the_labs_own_and_never_readable_by_others(lab: Lab):
    path = lab.env["FGPU_SWARM_REGISTRY_AUTH_FILE"]
    assert (LAB_DIR / "registry" / "nodes-auth.json").samefile(path)
    assert oct((LAB_DIR / "registry" / "nodes-auth.json").stat().st_mode & 0o777) == "0o600"
    # The machine's own docker CLI config is not where the lab's login lands.
    config = json.loads((LAB_DIR / "registry" / "docker-cli" / "config.json").read_text())
    (pair,) = [v["auth"] for k, v in config["auths"].items() if k == PUSH_LISTENER]
    assert base64.b64decode(pair).decode().startswith("fgpu-nodes:")
