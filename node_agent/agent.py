"""The fGPU node agent: what one Swarm node runs, read on that node and reported to the queue service.

The manager of a Swarm cannot `docker stats` a container on another node, nor read another node's
NVML, so every worker node runs this agent (a global Swarm service, as cAdvisor or Portainer's agent
are deployed; `queue_service/engine/node_agent_deploy.py` builds and deploys it). Every `FGPU_AGENT_INTERVAL`
seconds it:

1. lists the node's live session containers (label `fgpu.session_id`, and `fgpu.deployment` when
   the agent is given its hub's id) through the node's engine socket, and reads each one's stats
   once (one-shot): CPU % between two of its own samples, memory as `docker stats` shows it;
2. reads the node's GPUs through NVML (`libnvidia-ml.so.1`, by ctypes) when the driver is there:
   uuid, name, memory total and used, utilisation. Without the library `gpus` is null (no NVML on
   this node: a node with simulated GPUs, whose GPUs are the manager's node labels);
3. reads the settings of its node's engine that keep sessions apart (`daemon_settings`): `icc` from
   the default bridge, `no-new-privileges` from its own /proc/self/status (the engine's /info does
   not say it on 20.10); null when it cannot tell;
4. POSTs the report, as JSON, to `<FGPU_AGENT_URL>api/nodes/<hostname>/report` with the hub API
   token of the node-agent service (a Swarm secret), signed with its node's own key (another
   secret, given to this node's agent alone: `signed_headers`), and carries out the orders of an
   answer the service signed with the same key (commit a session container, push the image;
   pull a catalog image before any session there needs it), reporting each order's result in
   the next report, whose `images` lists what the node's engine holds (its repository digests). An answer without the right signature is
   dropped: whoever sits on the node network can neither report for this node nor give it orders.

It is ONE file that needs only Python's standard library (no docker SDK, no pynvml), so it is shipped
as a Swarm config and run by the session base image's `python3`, with no image of its own to build.
The functions above `Engine` are pure (engine JSON in, report out) and unit-tested; `Engine`, `Nvml`,
`post_report` and `main` do the I/O.

Environment: FGPU_AGENT_URL (the queue service's base URL, ending in /), FGPU_AGENT_TOKEN_FILE,
FGPU_AGENT_KEY_FILE (this node's key), FGPU_NODE_ID (its Swarm node id), FGPU_AGENT_INTERVAL
(seconds, default 5), FGPU_NODE_NAME (default: the engine's name for its host), FGPU_DEPLOYMENT
(only containers of this hub), FGPU_DOCKER_SOCKET (default /var/run/docker.sock),
FGPU_AGENT_REGISTRY_AUTH_FILE (the registry's credentials, the JSON object
`{"username", "password", "serveraddress"}` that fgpu_shared/registry_auth.py reads too; the
engine pushes with them; unset: without credentials).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import hashlib
import hmac
import http.client
import json
import os
import secrets
import select
import signal
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime

SESSION_LABEL = "fgpu.session_id"
DEPLOYMENT_LABEL = "fgpu.deployment"
#: The shape of a report and of its answer; the queue service refuses versions it does not know.
#: Version 2 carries results in `order_results` and orders in `orders`; version 1 had other keys.
REPORT_VERSION = 2
#: dockerd 20.10's API; newer engines serve it too.
ENGINE_API = "v1.41"
#: The orders the queue service may give an agent in its answer to a report (see `run_order`).
ORDER_KINDS = ("commit", "pull")
#: The orders of its shell channel (`ExecChannel`): a process in a session, a terminal's size.
EXEC_ORDER_KINDS = ("exec", "exec_resize")
#: A process in a session runs as the images' session user, in its home, whatever the order says.
SESSION_USER = "1000"
SESSION_HOME = "/home/jovyan"
#: The shell channel's long poll: the service holds it up to 20 s; this is the agent's patience.
EXEC_POLL_TIMEOUT = 60.0
#: How long an ended process's exit code is waited for on the engine.
EXEC_EXIT_WAIT = 5.0
NVML_LIBRARY = "libnvidia-ml.so.1"
#: The default bridge's option that mirrors the engine's `"icc"` setting.
ICC_OPTION = "com.docker.network.bridge.enable_icc"
#: The headers that carry a report's signature (the queue service's node_identity.py reads them).
NODE_ID_HEADER = "X-Fgpu-Node-Id"
TIME_HEADER = "X-Fgpu-Time"
NONCE_HEADER = "X-Fgpu-Nonce"
SIGNATURE_HEADER = "X-Fgpu-Signature"


# -- pure: engine JSON to a report ---------------------------------------------------------------


def cpu_times(stats):
    """(container CPU ns, host CPU ns, online CPUs) of one one-shot stats answer, or None."""
    cpu = stats.get("cpu_stats") or {}
    usage = cpu.get("cpu_usage") or {}
    total, system = usage.get("total_usage"), cpu.get("system_cpu_usage")
    if total is None or system is None:
        return None
    online = cpu.get("online_cpus") or len(usage.get("percpu_usage") or [1])
    return int(total), int(system), int(online)


def cpu_percent(previous, current):
    """Docker's CPU % between two samples: 100 % is one core busy, N × 100 % all N cores."""
    if previous is None or current is None:
        return None
    container_delta, system_delta = current[0] - previous[0], current[1] - previous[1]
    if system_delta <= 0 or container_delta < 0:
        return None
    return round(container_delta / system_delta * current[2] * 100.0, 2)


def memory(stats):
    """(used bytes, limit bytes) as `docker stats` shows them: usage less inactive page cache."""
    mem = stats.get("memory_stats") or {}
    usage = int(mem.get("usage") or 0)
    detail = mem.get("stats") or {}
    # cgroup v1 reports total_inactive_file, v2 inactive_file; older engines only cache.
    for key in ("total_inactive_file", "inactive_file", "cache"):
        if key in detail:
            usage -= int(detail[key])
            break
    return max(0, usage), int(mem.get("limit") or 0)


def session_of(container):
    """The session id a container of `GET /containers/json` carries, or None."""
    return (container.get("Labels") or {}).get(SESSION_LABEL) or None


def session_usage(containers, stats_by_id, previous_cpu):
    """Usage of each session container, and the CPU samples to keep for the next round.

    `containers` is the engine's list answer, `stats_by_id` a one-shot stats answer per container id
    (missing when the container went away meanwhile), `previous_cpu` last round's samples by id.
    """
    sessions, samples = {}, {}
    for container in containers:
        session_id, container_id = session_of(container), container.get("Id")
        stats = stats_by_id.get(container_id)
        if not session_id or stats is None:
            continue
        samples[container_id] = cpu_times(stats)
        used, limit = memory(stats)
        sessions[session_id] = {
            "container": container_id,
            "state": container.get("State"),
            "cpu_percent": cpu_percent(previous_cpu.get(container_id), samples[container_id]),
            "mem_bytes": used,
            "mem_limit_bytes": limit,
        }
    return sessions, samples


def build_report(
    node, sampled_at, sessions, gpus, results=(), agent=None, daemon=None, images=None
):
    """The JSON body the agent POSTs (the queue service's `node_reports.parse_report` reads it)."""
    return {
        "images": images,
        "version": REPORT_VERSION,
        "node": node,
        "sampled_at": sampled_at,
        "sessions": sessions,
        "gpus": gpus,
        "order_results": list(results),
        "agent": agent or {},
        "daemon": daemon or {"icc": None, "no_new_privileges": None},
    }


def bridge_icc(bridge):
    """Whether the node's engine lets containers of its default bridge reach one another (its
    `"icc"` setting, which the default bridge carries as an option); None when it does not say."""
    value = ((bridge or {}).get("Options") or {}).get(ICC_OPTION)
    return {"true": True, "false": False}.get(value)


def no_new_privileges(status_text):
    """Whether this process runs with no-new-privileges (`NoNewPrivs` in /proc/self/status).
    The agent is a Swarm task like the sessions, and API 1.41 lets no task ask for it: it has it
    exactly when the node's engine sets it for every container (`"no-new-privileges": true`),
    which the engine's /info does not show."""
    for line in status_text.splitlines():
        if line.startswith("NoNewPrivs:"):
            return line.split()[1] == "1"
    return None


def daemon_settings(bridge, status_text):
    """The node engine's settings that keep sessions apart, as the report carries them."""
    return {"icc": bridge_icc(bridge), "no_new_privileges": no_new_privileges(status_text)}


def repo_digests(images):
    """The repository digests (`<repo>@sha256:...`) of the engine's `GET /images/json` answer,
    sorted: what a node holds, as a pull by digest names it."""
    return sorted({d for image in images or [] for d in image.get("RepoDigests") or [] if "@" in d})


def session_filters(deployment=None):
    """The engine's list filter for live session containers (of one hub, when named)."""
    labels = [SESSION_LABEL]
    if deployment:
        labels.append(f"{DEPLOYMENT_LABEL}={deployment}")
    return {"label": labels, "status": ["running", "paused"]}


def orders_of(answer):
    """The well-formed orders in the queue service's answer to a report (others are skipped)."""
    orders = answer.get("orders") if isinstance(answer, dict) else None
    if not isinstance(orders, list):
        return []
    return [
        order
        for order in orders
        if isinstance(order, dict)
        and order.get("kind") in ORDER_KINDS
        and isinstance(order.get("id"), str)
    ]


def _strings(value):
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def exec_orders_of(answer):
    """The well-formed orders of the shell channel's answer (others are skipped)."""
    orders = answer.get("orders") if isinstance(answer, dict) else None
    found = []
    for order in orders if isinstance(orders, list) else []:
        if not isinstance(order, dict) or not isinstance(order.get("token"), str):
            continue
        if order.get("kind") == "exec_resize":
            size = (order.get("width"), order.get("height"))
            if all(isinstance(n, int) and 0 < n < 10_000 for n in size):
                found.append(order)
        elif order.get("kind") == "exec":
            command = order.get("command")
            if (
                isinstance(order.get("container"), str)
                and isinstance(order.get("session_id"), str)
                and isinstance(command, list)
                and command
                and all(isinstance(part, str) for part in command)
                and isinstance(order.get("tty"), bool)
                and _strings(order.get("env"))
            ):
                found.append(order)
    return found


def exec_config(order):
    """The engine's exec of an order: its command, as the session's user in its home."""
    return {
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "Tty": order["tty"],
        "Cmd": order["command"],
        "Env": [f"{key}={value}" for key, value in order["env"].items()],
        "User": SESSION_USER,
        "WorkingDir": SESSION_HOME,
    }


def upgrade_request(method, target, host, headers, body=b"", protocol="tcp"):
    """An HTTP/1.1 request asking to turn its connection into another protocol: a raw stream
    (`tcp`, as the docker CLI's `exec -i` asks its engine) or `websocket`."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: Upgrade"]
    lines.append(f"Upgrade: {protocol}")
    lines += [f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class UpgradeRefused(OSError):
    """The other end answered an upgrade with no raw stream."""


def upgraded(sock, request, statuses=(101,)):
    """Send `request` on `sock` and read the answer's head: the bytes of the raw stream that came
    after it. UpgradeRefused, with the answer's status line, for a status not in `statuses`."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk or len(data) > 65536:
            raise UpgradeRefused("the connection ended before an answer")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit() or int(parts[1]) not in statuses:
        raise UpgradeRefused(f"{status_line}: {rest[:500].decode(errors='replace')}")
    return rest


# -- pure: WebSocket frames (RFC 6455) of a shell's connection back to the service -------------

#: The connection back is a WebSocket (proxies pass it; configurable-http-proxy no other upgrade),
#: whose binary frames carry the process's bytes; a close frame ends one way, as a half-close.
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CONTINUATION, BINARY, CLOSE = 0x0, 0x2, 0x8
MAX_FRAME = 1 << 20


def websocket_accept(key):
    """The `Sec-WebSocket-Accept` that answers a handshake's `Sec-WebSocket-Key`."""
    digest = hashlib.sha1((key + WEBSOCKET_GUID).encode()).digest()
    return base64.b64encode(digest).decode()


def websocket_frame(payload, opcode=BINARY, mask=None):
    """One final frame of `payload`; masked with `mask` (4 bytes) as a client's must be."""
    size = len(payload)
    bit = 0x80 if mask else 0
    if size < 126:
        head = bytes([0x80 | opcode, bit | size])
    elif size < 1 << 16:
        head = bytes([0x80 | opcode, bit | 126]) + size.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, bit | 127]) + size.to_bytes(8, "big")
    return head + mask + _masked(payload, mask) if mask else head + payload


def _masked(payload, mask):
    size = len(payload)
    key = (mask * (size // 4 + 1))[:size]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(size, "big")


class WebSocketFrames:
    """Splits a WebSocket stream into (opcode, payload) pairs, unmasked, as bytes come; a frame
    larger than MAX_FRAME is a ValueError."""

    def __init__(self):
        self._buffer = bytearray()

    def feed(self, data):
        self._buffer += data
        found = []
        while (frame := self._next()) is not None:
            found.append(frame)
        return found

    def _next(self):
        buffer = self._buffer
        if len(buffer) < 2:
            return None
        size, at = buffer[1] & 0x7F, 2
        if size >= 126:
            at += 2 if size == 126 else 8
            if len(buffer) < at:
                return None
            size = int.from_bytes(buffer[2:at], "big")
        if size > MAX_FRAME:
            raise ValueError(f"a WebSocket frame of {size} bytes (at most {MAX_FRAME})")
        mask = bytes(buffer[at : at + 4]) if buffer[1] & 0x80 else None
        at += 4 if mask else 0
        if len(buffer) < at + size:
            return None
        payload = bytes(buffer[at : at + size])
        opcode = buffer[0] & 0x0F
        del buffer[: at + size]
        return opcode, _masked(payload, mask) if mask else payload


#: X-Registry-Auth without credentials: `{}`, base64 (the engine wants the header valid).
NO_REGISTRY_AUTH = "e30="
REGISTRY_AUTH_FIELDS = ("username", "password", "serveraddress")


def registry_auth_header(content):
    """The X-Registry-Auth header value (base64url JSON, as the docker CLI sends it) for a
    registry credentials file's content: a JSON object with a non-empty string for each of
    `REGISTRY_AUTH_FIELDS`. Raises ValueError, saying what is wrong, on anything else."""
    try:
        found = json.loads(content)
    except ValueError as e:
        raise ValueError(f"registry credentials are not JSON: {e}") from None
    if not isinstance(found, dict):
        raise ValueError("registry credentials are no JSON object")
    missing = [f for f in REGISTRY_AUTH_FIELDS if not isinstance(found.get(f), str) or not found[f]]
    if missing:
        raise ValueError(f"registry credentials lack {', '.join(missing)}")
    auth = json.dumps({f: found[f] for f in REGISTRY_AUTH_FIELDS}).encode()
    return base64.urlsafe_b64encode(auth).decode()


def split_image(reference):
    """(repository, tag) of an image reference; a registry's port is not a tag."""
    name, _, tag = reference.rpartition(":")
    if not name or "/" in tag:
        return reference, "latest"
    return name, tag


def commit_config(image_config, container_config, labels):
    """The `conf` of a commit: the source image's command, user and folder, the session's own
    variables and labels blanked (the engine merges the container's in), and `labels` added.
    The same as queue_service.engine.container_commits.commit_config, which the agent cannot
    import."""
    image_env = image_config.get("Env") or []
    image_keys = {item.split("=", 1)[0] for item in image_env}
    added = [item.split("=", 1)[0] for item in container_config.get("Env") or []]
    image_labels = image_config.get("Labels") or {}
    blanked = {key: "" for key in (container_config.get("Labels") or {}) if key not in image_labels}
    return {
        "Env": [*image_env, *(f"{key}=" for key in added if key not in image_keys)],
        "Labels": {**image_labels, **blanked, **labels},
        "Cmd": image_config.get("Cmd"),
        "Entrypoint": image_config.get("Entrypoint"),
        "User": image_config.get("User") or "",
        "WorkingDir": image_config.get("WorkingDir") or "",
    }


def own_usage(status_text, cpu_seconds):
    """The agent's own footprint (figures for the admin): resident memory and CPU time."""
    rss = 0
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return {"rss_bytes": rss, "cpu_seconds": round(cpu_seconds, 3)}


def now_iso():
    return datetime.now(UTC).isoformat()


# -- pure: the signature of a report and of its answer ---------------------------------------------


def _mac(key, *parts):
    message = "\n".join(parts).encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def request_signature(key, method, path, node_id, timestamp, nonce, body):
    """HMAC-SHA256 with the node's key over what a report must not lose or change: the method,
    the path (which names the node), the node id, the time, a nonce and the body's digest."""
    digest = hashlib.sha256(body).hexdigest()
    return _mac(key, "fgpu-node-report", method.upper(), path, node_id, timestamp, nonce, digest)


def signed_headers(key, node_id, method, path, body, now=None, nonce=None):
    """The headers that prove a report comes from `node_id` now (its time is checked, and never
    taken twice: a replay is refused)."""
    timestamp = f"{time.time() if now is None else now:.6f}"
    nonce = nonce or secrets.token_hex(16)
    return {
        NODE_ID_HEADER: node_id,
        TIME_HEADER: timestamp,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: request_signature(key, method, path, node_id, timestamp, nonce, body),
    }


def answer_signature(key, nonce, body):
    """The service's signature of its answer to the report that carried `nonce`: an answer cannot
    be moved to another report or node, nor its orders changed on the way."""
    return _mac(key, "fgpu-node-answer", nonce, hashlib.sha256(body).hexdigest())


def answer_is_genuine(key, nonce, body, signature):
    # Bytes: a header is any latin-1 text, and compare_digest refuses non-ASCII strings.
    expected = answer_signature(key, nonce, body).encode()
    return hmac.compare_digest(expected, (signature or "").encode("latin-1", "replace"))


# -- I/O: the node's engine, over its unix socket ------------------------------------------------


class EngineError(Exception):
    def __init__(self, status, message):
        super().__init__(f"engine answered {status}: {message}")
        self.status, self.message = status, message


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


class Engine:
    """The node's Docker engine through its bind-mounted socket: plain HTTP, one connection a call."""

    def __init__(self, socket_path="/var/run/docker.sock", timeout=30.0, registry_auth=None):
        self.socket_path, self.timeout = socket_path, timeout
        #: X-Registry-Auth of this engine's pushes (registry_auth_header).
        self.registry_auth = registry_auth or NO_REGISTRY_AUTH

    def call(self, method, path, query=None, body=None, headers=None, timeout=None):
        url = f"/{ENGINE_API}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        connection = _UnixConnection(self.socket_path, timeout or self.timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            sent = {"Content-Type": "application/json", **(headers or {})} if data else headers
            connection.request(method, url, body=data, headers=sent or {})
            reply = connection.getresponse()
            raw = reply.read()
        finally:
            connection.close()
        if reply.status >= 400:
            raise EngineError(reply.status, _engine_message(raw))
        return raw

    def json(self, method, path, **kwargs):
        raw = self.call(method, path, **kwargs)
        return json.loads(raw) if raw.strip() else None

    def info(self):
        return self.json("GET", "/info")

    def default_bridge(self):
        return self.json("GET", "/networks/bridge")

    def session_containers(self, deployment=None):
        query = {"filters": json.dumps(session_filters(deployment))}
        return self.json("GET", "/containers/json", query=query)

    def stats(self, container_id):
        """One-shot stats, or None when the container is gone."""
        try:
            query = {"stream": "false", "one-shot": "true"}
            return self.json("GET", f"/containers/{container_id}/stats", query=query)
        except EngineError as e:
            if e.status == 404:
                return None
            raise

    def inspect_container(self, container_id):
        return self.json("GET", f"/containers/{container_id}/json")

    def inspect_image(self, reference):
        return self.json("GET", f"/images/{urllib.parse.quote(reference, safe='/:@')}/json")

    def commit(self, container_id, repository, tag, conf=None, message=""):
        """Commit a container without pausing it: a pause can leave it frozen for good (see
        queue_service/engine/container_commits.py). Minutes for a large writable layer."""
        query = {"container": container_id, "repo": repository, "tag": tag, "author": "fgpu-hub"}
        query.update(comment=message, pause="false")
        return self.json("POST", "/commit", query=query, body=conf or {}, timeout=600)

    def images(self):
        return self.json("GET", "/images/json")

    def pull(self, reference):
        """Pull `reference` (`<repo>@sha256:...` or `<repo>:<tag>`) with the engine's registry
        credentials, failing on the first error line of the engine's progress stream. An hour
        at most: a large image over a slow link."""
        headers = {"X-Registry-Auth": self.registry_auth}
        repository, separator, rest = reference.partition("@")
        if not separator:
            repository, rest = split_image(reference)
        query = {"fromImage": repository, "tag": rest}
        push_digest(self.call("POST", "/images/create", query=query, headers=headers, timeout=3600))

    def push(self, repository, tag, registry_auth=None):
        """Push with the X-Registry-Auth header `registry_auth` (default: the engine's own),
        failing on the first error line of the engine's progress stream."""
        headers = {"X-Registry-Auth": registry_auth or self.registry_auth}
        path = f"/images/{urllib.parse.quote(repository, safe='/:')}/push"
        raw = self.call("POST", path, query={"tag": tag}, headers=headers, timeout=600)
        return push_digest(raw)

    # -- a process in a session (the shell channel) -----------------------------------------

    def exec_create(self, container_id, config):
        return self.json("POST", f"/containers/{container_id}/exec", body=config)["Id"]

    def exec_attach(self, exec_id, tty):
        """Start the exec, hijacked: (its connection, the stream's first bytes)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
            body = json.dumps({"Detach": False, "Tty": tty}).encode()
            headers = {"Content-Type": "application/json"}
            target = f"/{ENGINE_API}/exec/{exec_id}/start"
            # An engine that cannot upgrade answers 200 and streams on the same connection.
            rest = upgraded(
                sock, upgrade_request("POST", target, "docker", headers, body), (101, 200)
            )
            sock.settimeout(None)
            return sock, rest
        except BaseException:
            sock.close()
            raise

    def exec_resize(self, exec_id, width, height):
        self.call("POST", f"/exec/{exec_id}/resize", query={"h": height, "w": width})

    def exec_exit_code(self, exec_id, wait=EXEC_EXIT_WAIT):
        """The exec's exit code once it has ended; -1 when the engine does not say in time."""
        deadline = time.monotonic() + wait
        while True:
            found = self.json("GET", f"/exec/{exec_id}/json")
            if not found.get("Running") and found.get("ExitCode") is not None:
                return found["ExitCode"]
            if time.monotonic() > deadline:
                return -1
            time.sleep(0.05)


def push_digest(stream):
    """The digest an engine's push stream ends with; its error line raises EngineError."""
    digest = None
    for line in stream.decode(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("error"):
            raise EngineError(500, event["error"])
        digest = (event.get("aux") or {}).get("Digest") or digest
    return digest


def _engine_message(raw):
    try:
        return json.loads(raw).get("message") or raw.decode(errors="replace")
    except (ValueError, AttributeError):
        return raw.decode(errors="replace")


# -- I/O: NVML through ctypes ------------------------------------------------------------------


class NvmlError(Exception):
    pass


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Nvml:
    """The node's GPUs through NVML's C API. `library` is the loaded `libnvidia-ml.so.1` (a fake
    with the same functions in tests): every call returns an nvmlReturn_t, 0 for success."""

    def __init__(self, library):
        self.lib = library
        self.lib.nvmlErrorString.restype = ctypes.c_char_p

    @classmethod
    def load(cls, name=NVML_LIBRARY):
        """NVML, or None on a node without the NVIDIA driver (no library to load)."""
        try:
            return cls(ctypes.CDLL(name))
        except OSError:
            return None

    def _check(self, code, what):
        if code != 0:
            text = self.lib.nvmlErrorString(code)
            raise NvmlError(f"{what}: {text.decode() if isinstance(text, bytes) else text}")

    def gpus(self):
        """Every GPU in NVML index order: uuid, name, index, memory total/used, utilisation %."""
        self._check(self.lib.nvmlInit_v2(), "nvmlInit")
        try:
            count = ctypes.c_uint(0)
            self._check(self.lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), "device count")
            return [self._gpu(index) for index in range(count.value)]
        finally:
            self.lib.nvmlShutdown()

    def _gpu(self, index):
        handle = ctypes.c_void_p()
        self._check(
            self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)),
            f"GPU {index}",
        )
        uuid, name = ctypes.create_string_buffer(96), ctypes.create_string_buffer(96)
        self._check(self.lib.nvmlDeviceGetUUID(handle, uuid, ctypes.c_uint(96)), "uuid")
        self._check(self.lib.nvmlDeviceGetName(handle, name, ctypes.c_uint(96)), "name")
        mem, util = _Memory(), _Utilization()
        self._check(self.lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)), "memory")
        util_code = self.lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util))
        return {
            "uuid": uuid.value.decode(),
            "name": name.value.decode(),
            "index": index,
            "memory_total": mem.total,
            "memory_used": mem.used,
            # Not every GPU samples utilisation (NVML_ERROR_NOT_SUPPORTED): unknown, not an error.
            "util_percent": float(util.gpu) if util_code == 0 else None,
        }


# -- I/O: one round, the report, the orders ---------------------------------------------------


class Agent:
    def __init__(self, engine, nvml, node, deployment=None):
        self.engine, self.nvml, self.node, self.deployment = engine, nvml, node, deployment
        self.previous_cpu = {}
        self.results = []  # of orders carried out, for the next report
        self.running_orders = set()
        #: Sessions whose container a commit order holds: no process enters them meanwhile.
        self.committing = set()
        self.lock = threading.Lock()

    def collect(self):
        """One round's report (the results of the orders carried out since the last one included)."""
        containers = self.engine.session_containers(self.deployment)
        stats = {c["Id"]: self.engine.stats(c["Id"]) for c in containers}
        sessions, self.previous_cpu = session_usage(containers, stats, self.previous_cpu)
        gpus = self.read_gpus()
        with self.lock:
            results, self.results = self.results, []
        # Listed after the results are taken: a pull they report done is among the images.
        images = repo_digests(self.engine.images())
        status = _read("/proc/self/status")
        agent = own_usage(status, sum(os.times()[:2]))
        daemon = daemon_settings(self.read_bridge(), status)
        return build_report(self.node, now_iso(), sessions, gpus, results, agent, daemon, images)

    def read_bridge(self):
        """The default bridge, or None (reported as "unknown"): a node without one (`"bridge":
        "none"`) must not silence its sessions' usage."""
        try:
            return self.engine.default_bridge()
        except EngineError as e:
            log(f"no default bridge: {e}")
            return None

    def read_gpus(self):
        """The GPUs, or None: a GPU NVML cannot read (lost, say) must not silence the node's
        sessions' usage; the error goes to the agent's log."""
        if self.nvml is None:
            return None
        try:
            return self.nvml.gpus()
        except NvmlError as e:
            log(f"GPUs not read: {e}")
            return None

    def run_orders(self, orders, wait=False):
        """Each order in a thread of its own: a commit takes minutes, and the reports go on."""
        threads = []
        for order in orders:
            with self.lock:
                if order["id"] in self.running_orders:
                    continue  # given again while it runs
                self.running_orders.add(order["id"])
            threads.append(threading.Thread(target=self._run_order, args=(order,), daemon=True))
            threads[-1].start()
        for thread in threads if wait else ():
            thread.join()

    def _run_order(self, order):
        with self.lock:
            self.committing.add(order.get("session_id"))
        try:
            run = pull_order if order["kind"] == "pull" else run_order
            result = run(self.engine, order, self.node)
        except Exception as e:  # whatever went wrong, the order is answered and may run again
            result = {**result_head(order, self.node), "ok": False}
            result["error"] = f"{type(e).__name__}: {e}"
        with self.lock:
            self.results.append(result)
            self.running_orders.discard(order["id"])
            self.committing.discard(order.get("session_id"))

    def give_back(self, results):
        """Results a report failed to deliver go out with the next one."""
        with self.lock:
            self.results[:0] = results


def result_head(order, node):
    """What every result of `order` starts with: which order, of which kind, done by which node."""
    return {"id": order["id"], "kind": order["kind"], "node": node}


def run_order(engine, order, node):
    """Commit the order's session container (as the service commits one on its own engine: the
    source image's command, user and folder, the order's labels) and push the image to the
    registry its name starts with, so that any node can start it; the result says how it went."""
    result = result_head(order, node)
    try:
        found = engine.session_containers()
        container = next((c for c in found if session_of(c) == order.get("session_id")), None)
        if container is None:
            return {**result, "ok": False, "error": "no such session container on this node"}
        details = engine.inspect_container(container["Id"])
        source = engine.inspect_image(details["Image"])
        labels = {str(k): str(v) for k, v in (order.get("labels") or {}).items()}
        conf = commit_config(source.get("Config") or {}, details.get("Config") or {}, labels)
        repository, tag = split_image(str(order.get("image", "")))
        message = str(order.get("message", ""))[:256]
        committed = engine.commit(container["Id"], repository, tag, conf=conf, message=message)
        digest = engine.push(repository, tag) if order.get("push", True) else None
        image = f"{repository}:{tag}"
        return {**result, "ok": True, "image": image, "image_id": committed["Id"], "digest": digest}
    except (EngineError, OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as e:
        return {**result, "ok": False, "error": str(e)}


def pull_order(engine, order, node):
    """Pull the order's image (a catalog image, by digest) from its registry, before any session
    on this node needs it; the result says how it went."""
    result = {**result_head(order, node), "image": str(order.get("image", ""))}
    try:
        engine.pull(result["image"])
        return {**result, "ok": True}
    except (EngineError, OSError, http.client.HTTPException, ValueError) as e:
        return {**result, "ok": False, "error": str(e)}


class UnsignedAnswer(ValueError):
    """An answer not signed with this node's key: its orders are not carried out."""


def post_report(url, token, key, node_id, report, timeout=30.0):
    """POST the report, signed; the queue service's answer (orders, maybe) as a dict, once its
    signature is checked."""
    return post_signed(url, token, key, node_id, report, timeout)


def post_signed(url, token, key, node_id, data, timeout):
    """POST `data` as JSON, signed with the node's key; the answer, once its signature is
    checked."""
    body = json.dumps(data).encode()
    signed = signed_headers(key, node_id, "POST", urllib.parse.urlsplit(url).path, body)
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Authorization": f"token {token}", "Content-Type": "application/json", **signed},
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        answer = reply.read()
        signature = reply.headers.get(SIGNATURE_HEADER)
    if not answer_is_genuine(key, signed[NONCE_HEADER], answer, signature):
        raise UnsignedAnswer(
            "the answer is not signed with this node's key; its orders are dropped"
        )
    return json.loads(answer or b"{}")


def report_url(base, node):
    return node_url(base, node, "report")


def node_url(base, node, what):
    return f"{base.rstrip('/')}/api/nodes/{urllib.parse.quote(node, safe='')}/{what}"


# -- I/O: the shell channel ----------------------------------------------------------------------

CHANNEL_ERRORS = (OSError, http.client.HTTPException, EngineError, ValueError, KeyError)


class SessionBusy(Exception):
    """A commit holds the session's container: no process may enter it now."""


class ExecChannel:
    """Processes in this node's sessions for the queue service's shells (SSH). The service cannot
    reach this node's engine (queue_service/engine/exec_rendezvous.py), so the agent long-polls
    `exec-orders`, starts each `exec` order's process on its engine, hijacked, opens a connection
    back to the service (`exec/<token>`, signed with the node's key) and pipes bytes both ways;
    once the process's output ends, it posts the exit code, then closes. In threads of their own,
    beside the reports: a shell opens one round trip after it is asked for."""

    def __init__(self, agent, base, token, key, node_id):
        self.agent, self.engine, self.node = agent, agent.engine, agent.node
        self.base, self.token, self.key, self.node_id = base, token, key, node_id
        self.running = {}  # order token → exec id, for a terminal's resizes

    def poll_forever(self, pause):
        while True:
            try:
                self.post([], EXEC_POLL_TIMEOUT)
            except CHANNEL_ERRORS as e:  # the service may be restarting
                log(f"shell channel: {e}")
                time.sleep(pause)

    def post(self, results, timeout=30.0):
        """Post `results`, signed, and carry out the orders of the answer."""
        url = node_url(self.base, self.node, "exec-orders")
        answer = post_signed(url, self.token, self.key, self.node_id, {"results": results}, timeout)
        for order in exec_orders_of(answer):
            if order["kind"] == "exec":
                threading.Thread(target=self.run_exec, args=(order,), daemon=True).start()
            elif order["token"] in self.running:
                with contextlib.suppress(*CHANNEL_ERRORS):  # the process may have ended
                    self.engine.exec_resize(
                        self.running[order["token"]], order["width"], order["height"]
                    )

    def answer(self, result):
        try:
            self.post([result])
        except CHANNEL_ERRORS as e:
            log(f"shell channel: result of {result['token'][:8]}… not delivered: {e}")

    def run_exec(self, order):
        token = order["token"]
        try:
            exec_id, process, first = self.start(order)
        except (*CHANNEL_ERRORS, SessionBusy) as e:
            busy = isinstance(e, SessionBusy)
            return self.answer({"token": token, "ok": False, "error": str(e), "busy": busy})
        # Known before the service is: its first resize may come as soon as it has the connection.
        self.running[token] = exec_id
        try:
            back, back_first = self.dial_back(token)
        except CHANNEL_ERRORS as e:
            self.running.pop(token, None)
            process.close()
            return self.answer({"token": token, "ok": False, "error": f"no way back: {e}"})
        try:
            Pipe(process, first, back, back_first, order["tty"]).run()
            try:
                code = self.engine.exec_exit_code(exec_id)
            except CHANNEL_ERRORS:
                code = -1
            self.answer({"token": token, "exit_code": code})
            with contextlib.suppress(OSError):
                back.sendall(websocket_frame(b"", CLOSE, secrets.token_bytes(4)))
        finally:
            self.running.pop(token, None)
            for sock in (back, process):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def start(self, order):
        """The order's process, started and attached: (exec id, connection, first bytes). Only
        in a running session container of this hub, and never while a commit holds it."""
        with self.agent.lock:
            if order["session_id"] in self.agent.committing:
                raise SessionBusy(f"session {order['session_id']} is being saved as an image")
        details = self.engine.inspect_container(order["container"])
        labels = (details.get("Config") or {}).get("Labels") or {}
        deployment = self.agent.deployment
        if labels.get(SESSION_LABEL) != order["session_id"] or (
            deployment and labels.get(DEPLOYMENT_LABEL) != deployment
        ):
            raise ValueError("no such session container on this node")
        if not (details.get("State") or {}).get("Running"):
            raise ValueError("the session's container is not running")
        exec_id = self.engine.exec_create(order["container"], exec_config(order))
        return (exec_id, *self.engine.exec_attach(exec_id, order["tty"]))

    def dial_back(self, token):
        """The connection back to the service for `token`: (its socket, first bytes)."""
        url = urllib.parse.urlsplit(node_url(self.base, self.node, f"exec/{token}"))
        https = url.scheme == "https"
        sock = socket.create_connection((url.hostname, url.port or (443 if https else 80)), 30)
        try:
            if https:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=url.hostname)
            signed = signed_headers(self.key, self.node_id, "GET", url.path, b"")
            key = base64.b64encode(secrets.token_bytes(16)).decode()
            headers = {"Authorization": f"token {self.token}", **signed}
            headers.update({"Sec-WebSocket-Key": key, "Sec-WebSocket-Version": "13"})
            request = upgrade_request("GET", url.path, url.netloc, headers, protocol="websocket")
            first = upgraded(sock, request)
            sock.settimeout(None)
            return sock, first
        except BaseException:
            sock.close()
            raise


#: Bytes a pipe holds for a side slow to take them before it stops reading the other side.
PIPE_BUFFER = 1 << 20
#: A non-blocking call that could not go on now (TLS says so in its own words).
WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class Pipe:
    """Bytes both ways between a process's connection and the service's (WebSocket frames on the
    service's side) until the process's output ends. One thread, no blocking call: a TLS
    connection must not be read and written from two threads at once. The service's end of input
    (its close frame) closes the process's input; with a terminal it is the shell's end (a
    terminal has no end of input), so the process's connection is closed whole."""

    def __init__(self, process, first, back, back_first, tty):
        self.process, self.back, self.tty = process, back, tty
        self.frames = WebSocketFrames()
        self.to_back, self.to_process = bytearray(), bytearray()
        self.output_open = self.input_open = True
        self.input_closed = False
        if first:
            self.output(first)
        self.input(back_first)

    def output(self, data):
        if data:
            self.to_back += websocket_frame(data, BINARY, secrets.token_bytes(4))
        self.output_open = bool(data)

    def input(self, data):
        for opcode, payload in self.frames.feed(data):
            if opcode == CLOSE:
                self.input_open = False
            elif opcode in (CONTINUATION, BINARY) and self.input_open:
                self.to_process += payload

    def run(self):
        for sock in (self.process, self.back):
            sock.setblocking(False)
        try:
            with contextlib.suppress(OSError, ValueError):
                while self.output_open or self.to_back:
                    self.close_input()
                    self.wait()
                    for move in (self.read_process, self.write_process, self.read_back):
                        with contextlib.suppress(*WOULD_BLOCK):
                            move()
                    with contextlib.suppress(*WOULD_BLOCK):
                        self.write_back()
        finally:
            for sock in (self.process, self.back):
                with contextlib.suppress(OSError):
                    sock.setblocking(True)

    def close_input(self):
        if not self.input_open and not self.to_process and not self.input_closed:
            self.input_closed = True
            self.process.shutdown(socket.SHUT_RDWR if self.tty else socket.SHUT_WR)

    def wait(self):
        reading = self.output_open and len(self.to_back) < PIPE_BUFFER
        reads = [self.process] if reading else []
        if self.input_open and len(self.to_process) < PIPE_BUFFER:
            if getattr(self.back, "pending", lambda: 0)():
                return  # TLS bytes read and decrypted already: no select would say so
            reads.append(self.back)
        writes = [
            s for s, data in ((self.process, self.to_process), (self.back, self.to_back)) if data
        ]
        select.select(reads, writes, [])

    def read_process(self):
        if self.output_open and len(self.to_back) < PIPE_BUFFER:
            self.output(self.process.recv(65536))

    def write_process(self):
        if self.to_process:
            del self.to_process[: self.process.send(self.to_process)]

    def read_back(self):
        if self.input_open and len(self.to_process) < PIPE_BUFFER:
            data = self.back.recv(65536)
            self.input_open = bool(data)
            self.input(data)

    def write_back(self):
        if self.to_back:
            del self.to_back[: self.back.send(self.to_back)]


def _secret(environ, variable):
    value = _read(environ[variable]).strip()
    if not value:
        raise SystemExit(f"nothing in {environ[variable]} (${variable})")
    return value


def _read(path):
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return ""


def log(message):
    print(f"[fgpu-node-agent {now_iso()}] {message}", file=sys.stderr, flush=True)


def read_registry_auth(environ):
    """The X-Registry-Auth of the agent's pushes, from FGPU_AGENT_REGISTRY_AUTH_FILE; a file
    named but missing, empty or malformed stops the agent, saying so."""
    path = environ.get("FGPU_AGENT_REGISTRY_AUTH_FILE")
    if not path:
        return NO_REGISTRY_AUTH
    content = _read(path)
    if not content.strip():
        raise SystemExit(f"no registry credentials in {path} (FGPU_AGENT_REGISTRY_AUTH_FILE)")
    try:
        return registry_auth_header(content)
    except ValueError as e:
        raise SystemExit(f"{path} (FGPU_AGENT_REGISTRY_AUTH_FILE): {e}") from None


def main(environ=os.environ):
    # PID 1 of its container ignores SIGTERM unless it says otherwise: without this, every
    # update of the agent's service (a rotated key, a new agent) waited 10 s for the SIGKILL.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    socket_path = environ.get("FGPU_DOCKER_SOCKET", "/var/run/docker.sock")
    engine = Engine(socket_path, registry_auth=read_registry_auth(environ))
    token, key = _secret(environ, "FGPU_AGENT_TOKEN_FILE"), _secret(environ, "FGPU_AGENT_KEY_FILE")
    node_id = environ["FGPU_NODE_ID"]
    interval = float(environ.get("FGPU_AGENT_INTERVAL", "5"))
    node = environ.get("FGPU_NODE_NAME") or engine.info()["Name"]
    url = report_url(environ["FGPU_AGENT_URL"], node)
    nvml = Nvml.load()
    agent = Agent(engine, nvml, node, environ.get("FGPU_DEPLOYMENT") or None)
    channel = ExecChannel(agent, environ["FGPU_AGENT_URL"], token, key, node_id)
    threading.Thread(target=channel.poll_forever, args=(interval,), daemon=True).start()
    log(
        f"node {node}: reporting to {url} every {interval:g} s; NVML {'found' if nvml else 'absent'}"
    )
    while True:
        started = time.monotonic()
        report = None
        try:
            report = agent.collect()
            agent.run_orders(orders_of(post_report(url, token, key, node_id, report)))
        except (OSError, http.client.HTTPException, EngineError, NvmlError, ValueError) as e:
            # The queue service or the engine may be restarting: the next round tries again,
            # with the results this report did not deliver.
            agent.give_back(report["order_results"] if report else [])
            log(f"round failed: {e}")
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


if __name__ == "__main__":
    main()
