"""The fGPU hub's JupyterHub configuration (docs/source/explanation/contracts.md, contract 2).

Run it with `jupyterhub -f jupyterhub_config.py`, or extend it from another file with
`load_subconfig("jupyterhub_config.py")`. State (hub DB, cookie secret) lives in the directory the hub
is started from, as JupyterHub's own default has it.

Environment variables (every one the file reads, with its default: docs/source/reference/environment.md):
  FGPU_HUB_PORT        public port of the hub (default 8000)
  FGPU_HUB_IP          public address of the hub (default 127.0.0.1)
  FGPU_SIMULATED_GPUS  simulated GPUs for hosts without any, e.g. "2x8GiB"
  FGPU_UNITS_PER_GPU   fGPU units in one physical GPU (default 1)
  FGPU_DUMMY_PASSWORD  shared password for the demo login (default: none asked)
  FGPU_DEMO_LOGIN_ON_NETWORK  1: let the demo login run on a non-loopback FGPU_HUB_IP
  FGPU_QUEUE_PORT      port of the queue service on 127.0.0.1 (default 10101)
  FGPU_SSH_PORT        port of SSH and SFTP into the hub, on FGPU_HUB_IP (default 8022; 0: none)
  FGPU_HUB_DB_URL      the hub's database, e.g. postgresql://fgpu:secret@db/fgpu_hub (default:
                       jupyterhub.sqlite in the state directory)
  FGPU_QUEUE_DB_URL    the queue service's database (default: fgpu_queue.sqlite there)
  FGPU_CATALOG_PATH    catalog.yaml that seeds the image catalog (default: the shipped one)
  FGPU_BUILD_IMAGES    0: do not build the heavy framework images (TensorFlow, PyTorch) behind the
                       hub; build them yourself with `python -m image_catalog build --heavy`
  FGPU_USER_QUOTA      per-user quota as JSON, merged on the default {"sessions": 3, "pending": 2,
                       "fgpu": FGPU_MAX_PER_SESSION}; null lifts a limit
  FGPU_PRESETS         site-wide resource presets as a JSON list, e.g. '[{"name": "CPU small",
                       "cpu": 1, "mem": "2G"}, {"name": "half GPU", "cpu": 2, "mem": "4G",
                       "fgpu": 1}]' (a hub group adds its own: `fgpu_presets`, docs/source/explanation/sessions-and-queue.md)
  FGPU_CLASS_SIZE      students expected at once, to size the hub's spawn slots (default 200)
  FGPU_IDLE_TIMEOUT    seconds without activity after which jupyterhub-idle-culler stops a
                       session, named ones included (0 or unset: 3600); `off` runs no culler
  FGPU_IDLE_CULL_EVERY seconds between the culler's rounds (default 60)
  FGPU_END_WARNING     seconds before an automatic end (idle, a group's max_session_lifetime)
                       that the session and the Sessions page warn (default 600)

Swarm mode (`eval "$(scripts/swarm-lab up --nodes 3 --gpus 1x8GiB)"` sets these for the local lab):
  FGPU_ENGINE          `swarm`: sessions are Swarm services on the nodes of the Swarm whose manager
                       DOCKER_HOST names (with DOCKER_TLS_VERIFY, DOCKER_CERT_PATH); default `docker`
  FGPU_SWARM_REGISTRY  registry the nodes pull session images from (host:port)
  FGPU_SWARM_REGISTRY_AUTH_FILE  its credentials (JSON: username, password, serveraddress; not
                       readable by every user), given to the nodes with each session's service
                       and to the queue service, which lists the registry's images with them
  FGPU_SWARM_REGISTRY_CA  the CA that signed the registry's TLS certificate, when not a public one
                       (the queue service checks the registry with it; the nodes trust it through
                       /etc/docker/certs.d)
  FGPU_HUB_CONNECT_IP  this host's address as the nodes reach it: the hub's API listens there
  FGPU_SWARM_HOME_ROOT shared storage mounted at this path on every node and here: home folders
  FGPU_FOLDERS_ROOT    where storage folders keep their files (default: fgpu-folders in the state
                       directory; with FGPU_SWARM_HOME_ROOT, its .folders, on the shared storage)
  FGPU_SWARM_HUB_CONTAINER  the container on the manager in whose network the hub and its proxy
                       run; the spawner joins it to the sessions' overlays, and the hub's API and
                       the queue service then listen there, not at FGPU_HUB_CONNECT_IP
  FGPU_SWARM_ENDPOINT  `overlay` (default with FGPU_SWARM_HUB_CONTAINER: a hub on the overlay),
                       `vip`, or `host_port` (default without it: a hub beside the Swarm)
  FGPU_SWARM_NETWORK_PER_SESSION  1 (default): an overlay of its own per session, so that sessions
                       cannot reach one another; 0: one overlay shared by all
  FGPU_SWARM_REACHABLE_SESSIONS  1: accept an endpoint where sessions reach one another's servers
                       (`host_port`, or a shared overlay); without it such a hub does not start
  FGPU_NODE_AGENT_URL  the queue service as nodes reach it (default in Swarm mode: the service's
                       own address at FGPU_HUB_CONNECT_IP); the node agent is deployed to report there
  FGPU_NODE_AGENT_SOCKET  each node's engine socket (default /var/run/docker.sock)
"""

import json
import os
import resource
import secrets
import sys

import docker

from fgpu_shared import site_config
from fgpu_shared.sqlite_pragmas import on_every_sqlite_engine
from fgpu_spawner.network import SESSION_NETWORK, ensure_session_network
from queue_service.store.state_dir import (
    DEFAULT_FOLDERS_ROOT,
    HUB_DB_ENV,
    QUEUE_DB_ENV,
    db_url_problem,
    hub_db_url,
    queue_db_url,
)
from queue_service.store.state_dir import folders_root as site_folders_root

c = get_config()  # noqa: F821 (injected by traitlets when JupyterHub loads this file)


def session_network_gateway(name: str, default: str = "172.17.0.1") -> str:
    """The gateway of the session network (created here when missing): where sessions reach the
    hub. Without an engine, the default bridge's usual gateway, which they reach through the host."""
    try:
        return ensure_session_network(docker.from_env(timeout=5).api, name).gateway
    except Exception as e:
        print(f"WARNING: no session network {name!r} ({e}); hub API on {default}", file=sys.stderr)
        return default


# The public side: students open this URL.
c.JupyterHub.bind_url = (
    f"http://{os.environ.get('FGPU_HUB_IP', '127.0.0.1')}:{os.environ.get('FGPU_HUB_PORT', '8000')}"
)
engine = os.environ.get("FGPU_ENGINE", "docker")
if engine not in ("docker", "swarm"):
    raise SystemExit(f"FGPU_ENGINE must be docker or swarm, not {engine!r}")
if engine == "swarm":
    # Sessions run on other machines and reach the hub's API at this host's address on their
    # network (the lab's gateway); the spawner builds Swarm services instead of containers.
    c.JupyterHub.hub_ip = os.environ.get("FGPU_HUB_CONNECT_IP", "0.0.0.0")
    c.FGPUSwarmSpawner.registry = os.environ.get("FGPU_SWARM_REGISTRY", "")
    c.FGPUSwarmSpawner.registry_auth_file = os.environ.get("FGPU_SWARM_REGISTRY_AUTH_FILE", "")
    c.FGPUSwarmSpawner.home_root = os.environ.get("FGPU_SWARM_HOME_ROOT", "")
else:
    # Sessions run on their own bridge, where they cannot reach one another; the hub's API
    # listens on its gateway, so sessions can call it and nothing outside can.
    c.FGPUSpawner.network_name = SESSION_NETWORK
    c.JupyterHub.hub_ip = session_network_gateway(SESSION_NETWORK)
hub_container = os.environ.get("FGPU_SWARM_HUB_CONTAINER", "") if engine == "swarm" else ""
if hub_container:
    # The hub runs in that container's network, which joins every session's overlay: sessions
    # reach the hub's API at the container's name there; the proxy, beside the hub, at loopback.
    c.JupyterHub.hub_ip = "0.0.0.0"
    c.JupyterHub.hub_connect_ip = "127.0.0.1"
    c.FGPUSwarmSpawner.hub_container = hub_container
if engine == "swarm":
    # Isolation must not rest on a default: an endpoint where sessions reach one another's
    # servers is refused here, at start, unless the site says it accepts it.
    from fgpu_spawner.service_spec import reachable_sessions

    endpoint = os.environ.get("FGPU_SWARM_ENDPOINT") or (
        "overlay" if hub_container else "host_port"
    )
    if endpoint not in ("host_port", "overlay", "vip"):
        raise SystemExit(f"FGPU_SWARM_ENDPOINT must be host_port, overlay or vip, not {endpoint!r}")
    # Only the hub's container can join an overlay per session (FGPUSwarmSpawner.hub_container).
    per_session = bool(hub_container) and os.environ.get("FGPU_SWARM_NETWORK_PER_SESSION") != "0"
    accepted = os.environ.get("FGPU_SWARM_REACHABLE_SESSIONS") == "1"
    reason = reachable_sessions(endpoint, per_session)
    if reason and not accepted:
        raise SystemExit(
            f"Swarm mode: sessions could reach one another ({reason}). Run the hub in a "
            "container on the manager (FGPU_SWARM_HUB_CONTAINER), where each session gets an "
            "overlay of its own, or set FGPU_SWARM_REACHABLE_SESSIONS=1 to accept it and "
            "firewall the nodes (docs/source/howto/adding-nodes.md, 'Adding nodes')."
        )
    c.FGPUSwarmSpawner.endpoint = endpoint
    c.FGPUSwarmSpawner.network_per_session = per_session
    c.FGPUSwarmSpawner.allow_reachable_sessions = accepted
c.JupyterHub.allow_named_servers = True
# Sessions outlive a hub restart; the queue service's reconciler owns their clean-up.
c.JupyterHub.cleanup_servers = False

# Both databases are configured in one place, the environment (FGPU_HUB_DB_URL,
# FGPU_QUEUE_DB_URL: queue_service/store/state_dir.py). A new JupyterHub's schema is applied at start,
# as the queue service applies its own, each after a backup (queue_service/store/db_upgrade.py).
for variable, url in ((HUB_DB_ENV, hub_db_url()), (QUEUE_DB_ENV, queue_db_url())):
    if problem := db_url_problem(url, variable):
        raise SystemExit(problem)
c.JupyterHub.db_url = hub_db_url()
c.JupyterHub.upgrade_db = True
# On SQLite, the hub's commits wait for no fsync, as the queue service's (fgpu_shared/sqlite_pragmas.py):
# a commit that waits for the disk holds the hub's only event loop.
on_every_sqlite_engine()

# A demo login: any user name; `admin` is an admin. It refuses to start on an address other than
# a loopback one unless FGPU_DEMO_LOGIN_ON_NETWORK=1. Its settings are the demo class's own, so a
# site that loads this file and sets a real authenticator inherits none of them.
c.JupyterHub.authenticator_class = "fgpu_spawner.demo_login.DemoAuthenticator"
c.DemoAuthenticator.allow_all = True
c.DemoAuthenticator.admin_users = {"admin"}
c.DemoAuthenticator.allow_non_loopback = os.environ.get("FGPU_DEMO_LOGIN_ON_NETWORK") == "1"
if os.environ.get("FGPU_DUMMY_PASSWORD"):
    c.DemoAuthenticator.password = os.environ["FGPU_DUMMY_PASSWORD"]
# A site's own config file (which loads this one) sets its real login instead: LMS launches
# that put students in their course's group (docs/source/howto/logins.md, "Logins"):
#   c.JupyterHub.authenticator_class = "fgpu_spawner.lti_login.LTICourseAuthenticator"
#   c.LTI13Authenticator.issuer = "https://canvas.instructure.com"
#   c.LTI13Authenticator.client_id = ["125900000000000123"]
#   c.LTI13Authenticator.authorize_url = "https://canvas.instructure.com/api/lti/authorize_redirect"
#   c.LTI13Authenticator.jwks_endpoint = "https://canvas.instructure.com/api/lti/security/jwks"
#   c.LTI11Authenticator.consumers = {"fgpu-hub": "a long random secret"}  # LTI 1.1, if any
# or OAuth ("github", "generic-oauth") or "pam", as that page shows.

# The queue service owns every allocation. The spawner talks to it with a token of its own,
# whose only scope is access to that service.
units_per_gpu = int(os.environ.get("FGPU_UNITS_PER_GPU", "1"))
simulated_gpus = os.environ.get("FGPU_SIMULATED_GPUS", "")
# In Swarm mode the service also listens where the nodes reach this host, for its node agents'
# reports (every request is still authenticated with a hub token; sessions reach the hub's API
# there too).
queue_host = (
    os.environ.get("FGPU_HUB_CONNECT_IP", "127.0.0.1")
    if engine == "swarm" and not hub_container
    else "127.0.0.1"
)
# Storage folders: beside the homes on the shared storage in Swarm mode, so that every node
# binds the same directory; else the service's default, in the state directory. Read where
# `fgpu-hub backup` reads it, so a backup finds the folders the service writes.
folders_root = site_folders_root()
queue_url = f"http://{queue_host}:{os.environ.get('FGPU_QUEUE_PORT', '10101')}"
spawner_token = secrets.token_hex(32)
catalog_path = os.environ.get("FGPU_CATALOG_PATH", "")
fgpu_max = float(os.environ.get("FGPU_MAX_PER_SESSION", "4"))
# One session's limits and defaults, in one place: the spawner judges every start by them, and the
# queue service draws the Sessions dialog's sliders and checks the presets with the same.
from image_catalog.launch_options import SESSION_LIMITS  # noqa: E402

session_limits = {
    **SESSION_LIMITS,
    "fgpu_max": fgpu_max,
    # The image of a launch that names none (the admin panel's Start button), where the user may
    # start it; empty: the first the catalog offers them.
    "default_image_name": os.environ.get("FGPU_DEFAULT_IMAGE", ""),
}
site_presets = json.loads(os.environ.get("FGPU_PRESETS") or "[]")
# Seconds a request may wait in the queue before it ends as PENDING_TIMEOUT (the service's).
pending_timeout = 3600

# One student cannot hold the hub: every user gets this quota from the queue service, and the hub
# refuses a named server past it before the spawner runs (both answer 4xx with a message).
from queue_service.quotas import DEFAULT_USER_QUOTA, active_session_limit, parse_quota  # noqa: E402

user_quota = {**DEFAULT_USER_QUOTA, "fgpu": fgpu_max}
user_quota.update(json.loads(os.environ.get("FGPU_USER_QUOTA") or "{}"))
# A typo stops the hub here, with the key named.
pending_per_user = parse_quota(user_quota, "FGPU_USER_QUOTA").max_pending
# Batch jobs waiting per user (0: no limit): they count against this, not against `pending`.
from queue_service.jobs import JOBS_WAITING_PER_USER  # noqa: E402

try:
    jobs_waiting_per_user = int(
        os.environ.get("FGPU_JOBS_WAITING_PER_USER") or JOBS_WAITING_PER_USER
    )
    if jobs_waiting_per_user < 0:
        raise ValueError("negative")
except ValueError:
    raise SystemExit("FGPU_JOBS_WAITING_PER_USER must be a whole number, 0 or more") from None

# Which hub a session container belongs to, kept in the state directory (outside the service's
# DB): hubs sharing an engine then adopt or stop only their own sessions.
from queue_service.store.deployment import deployment_id  # noqa: E402  # noqa: E402

fgpu_deployment_id = deployment_id(os.getcwd())

# The node agents (one per Swarm node, queue_service/engine/node_agent_deploy.py) report to the service
# with a token of their own, kept in the state directory: the service hands the same file's token
# to them as a Swarm secret, and a hub restart leaves them as they were.
from queue_service.engine.node_agent_deploy import TOKEN_FILE, node_agent_token  # noqa: E402  # noqa: E402

node_agent_service_token = node_agent_token(os.path.join(os.getcwd(), TOKEN_FILE))

# Idle sessions end, the ecosystem's way: jupyterhub-idle-culler stops servers (named ones too)
# whose hub last_activity is older than the timeout. The default is an hour, Zero to JupyterHub's:
# the hub learns of activity only every 5 minutes (its last_activity_interval and the servers'
# activity reports), so the culler's own 10 minutes would stop a student who read a notebook for
# a while, and a class's pauses (a lecture part, a break) last well under an hour while a session
# forgotten over a night or a weekend is still reclaimed. The spawner, knowing the same timeout,
# ends the record of a culled session as `idle` (fgpu_spawner/idle.py), and its slice goes to the
# next request at once.
idle_setting = os.environ.get("FGPU_IDLE_TIMEOUT", "").strip()
try:
    idle_timeout = 0 if idle_setting == "off" else int(idle_setting or "0") or 3600
    cull_every = int(os.environ.get("FGPU_IDLE_CULL_EVERY") or "60")
    end_warning = float(os.environ.get("FGPU_END_WARNING") or "600")
    if idle_timeout < 0 or cull_every <= 0 or end_warning < 0:
        raise ValueError("negative")
except ValueError:
    raise SystemExit(
        "FGPU_IDLE_TIMEOUT must be whole seconds (0: 3600) or `off`, FGPU_IDLE_CULL_EVERY whole"
        " seconds above 0 and FGPU_END_WARNING seconds"
    ) from None

# The scopes the service reads (queue_service/core/scopes.py, where the choice of admin:servers for
# admin powers is explained).
from queue_service.core.scopes import ADMIN_SCOPE, MANAGE_SCOPE, check_roles  # noqa: E402  # noqa: E402

DOCKER_ENV = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")
# The build tool's own settings (image_catalog/build.py), for the builds behind the hub.
BUILD_ENV = ("FGPU_CACHE_DIR", "FGPU_WHEEL_DIR", "FGPU_DEBIAN_MIRROR", "PIP_CERT")
build_images = os.environ.get("FGPU_BUILD_IMAGES", "1") != "0"
# The queue service's settings are `c.QueueService` lines like any other (a site's file may set
# more, or change these); the hub hands them to the service as it starts it, with the settings
# both sides share from the spawner's lines (units_per_gpu, deployment_id, the session limits,
# idle_timeout...: fgpu_shared/site_config.py).
c.DockerEngine.simulated_gpus = simulated_gpus
c.QueueService.catalog_path = catalog_path
c.QueueService.user_quota = user_quota
c.QueueService.presets = site_presets
c.QueueService.engine_class = engine
c.QueueService.pending_timeout = pending_timeout
c.QueueService.jobs_waiting_per_user = jobs_waiting_per_user
# Sessions are told their planned end through the proxy (the status bar's time left).
c.QueueService.proxy_url = c.JupyterHub.bind_url.replace("//0.0.0.0:", "//127.0.0.1:")
c.QueueService.lifetime_warning = end_warning
# The heavy framework images are built behind the hub (queue_service/image_builds.py).
c.QueueService.build_in_background = build_images
# SSH and SFTP (queue_service/ssh/) on the hub's public address: ssh -p 8022 <user>@<hub>.
c.QueueService.ssh_port = int(os.environ.get("FGPU_SSH_PORT") or 8022)
c.QueueService.ssh_host = os.environ.get("FGPU_HUB_IP", "127.0.0.1")
c.JupyterHub.services = [
    {
        "name": "queue",
        "display": True,
        "url": queue_url,
        "oauth_no_confirm": True,
        "cwd": os.getcwd(),
        "command": [sys.executable, "-m", "queue_service"],
        # The hub passes services only a few variables: the service must reach the same engine
        # as the spawner (DOCKER_HOST...), or it would count and stop containers of another.
        # Its database URL goes there too, not on its command line, where `ps` would show a
        # password to every user of the machine.
        "environment": {
            **{key: os.environ[key] for key in (*DOCKER_ENV, *BUILD_ENV) if key in os.environ},
            QUEUE_DB_ENV: queue_db_url(),
            # Filled in with the c.QueueService settings as the hub starts the service.
            site_config.ENV: site_config.FROM_HUB,
        },
        # The service sees these scopes on the login of users who hold them: instructors curate
        # the catalog; admin:servers (hub admins) is the service's admin power.
        "oauth_client_allowed_scopes": [MANAGE_SCOPE, ADMIN_SCOPE],
    },
    {"name": "fgpu-spawner", "api_token": spawner_token},
    {"name": "fgpu-node-agent", "api_token": node_agent_service_token},
]
# A managed service that dies is started again within seconds, not at JupyterHub's next poll of it
# up to 30 s later, and the queue service gets its settings (fgpu_spawner/managed_services.py).
from fgpu_spawner import managed_services  # noqa: E402

managed_services.install()
# A stop from the hub's admin panel (or its REST API) by an admin ends the session with
# `end_reason` `admin`, as a stop from the Sessions page does (fgpu_spawner/stop_requests.py).
from fgpu_spawner import stop_requests  # noqa: E402

stop_requests.install()
# In Swarm mode the queue service deploys the node agent on every node (a service per node); the
# agents report to this URL, the service as a node reaches it: by default the service's own
# address on the nodes' network (above); a site may name its proxy instead, e.g.
# http://hub.example.org/services/queue/. Outside Swarm mode no agent is deployed unless set.
# With the hub in a container on the overlay, the nodes reach the service only through the proxy's
# public address, which only the site knows: no agent unless FGPU_NODE_AGENT_URL names it.
node_agent_url = os.environ.get("FGPU_NODE_AGENT_URL") or (
    f"{queue_url}/services/queue/" if engine == "swarm" and not hub_container else ""
)
if node_agent_url:
    c.SwarmEngine.node_agent_url = node_agent_url
    if os.environ.get("FGPU_SWARM_REGISTRY"):  # the nodes pull the agent's image from there
        c.SwarmEngine.node_agent_image = (
            f"{os.environ['FGPU_SWARM_REGISTRY']}/fgpu/jupyter-base:py3.11"
        )
        c.SwarmEngine.node_agent_registry = os.environ["FGPU_SWARM_REGISTRY"]
        # Its CA: the service lists the registry's images with it (and with the credentials,
        # c.FGPUSwarmSpawner.registry_auth_file, which it hands to the nodes with the agent).
        if os.environ.get("FGPU_SWARM_REGISTRY_CA"):
            c.SwarmEngine.registry_ca = os.environ["FGPU_SWARM_REGISTRY_CA"]
    if os.environ.get("FGPU_NODE_AGENT_SOCKET"):  # each node's engine socket (a Swarm template)
        c.SwarmEngine.node_agent_docker_socket = os.environ["FGPU_NODE_AGENT_SOCKET"]
if folders_root != DEFAULT_FOLDERS_ROOT:
    c.QueueService.folders_root = folders_root
# The hub stops its services with SIGINT, and with SIGTERM only 10 s later; a hub started by a
# shell's `cmd &` (scripts/up in the background) passes SIGINT on ignored, and the culler, which
# sets no handler of its own, would hold every shutdown up for those 10 s. So it gets Python's
# own SIGINT handler back before it starts (it ends on the KeyboardInterrupt). And it ends with
# its hub, as the queue service does: a hub killed outright (an OOM kill, kill -9) cannot stop it,
# and an orphaned culler would go on calling the next hub's API. The kernel sends it SIGTERM when
# the hub dies (Linux's parent-death signal); a hub gone before that was set is seen by its pid.
CULLER_MAIN = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
    " sys.platform.startswith('linux') and"
    " __import__('ctypes').CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0);"
    f" os.getppid() == {os.getpid()} or sys.exit('the hub that started the culler is gone');"
    " from jupyterhub_idle_culler import main; main()"
)
if idle_timeout:
    c.JupyterHub.services.append(
        {
            "name": "idle-culler",
            "command": [
                sys.executable,
                "-c",
                CULLER_MAIN,
                f"--timeout={idle_timeout}",
                f"--cull-every={cull_every}",
                "--cull-named-servers=True",
            ],
        }
    )
c.FGPUSpawner.idle_timeout = idle_timeout
c.JupyterHub.load_roles = [
    {"name": "user", "scopes": ["self", "access:services!service=queue"]},
    {
        "name": "fgpu-queue",
        "description": "The queue service: reads users and groups, starts and stops servers,"
        " makes courses (groups, their members, the users a roster names), shares a"
        " student's session with the instructor who opens it",
        # admin:groups and admin:users for courses (queue_service/courses.py): a course is a
        # group the service creates and fills, and a roster creates missing users. The service
        # checks who asks (admins, the course's instructors) before it uses them.
        "scopes": [
            "list:users",
            "read:users",
            "read:groups",
            "servers",
            "access:servers",
            "admin:groups",
            "admin:users",
            # An instructor opens a student's session through a share of that one server
            # (queue_service/instructor_visits.py), granted and revoked by the service.
            "shares",
        ],
        "services": ["queue"],
    },
    {
        "name": "instructor",
        "description": "Curates the image catalog: adds, edits, hides, restricts, deletes images",
        "scopes": [MANAGE_SCOPE],
        "groups": ["instructors"],
    },
    {
        "name": "fgpu-spawner",
        "description": "The spawner's identity towards the queue service, and nothing else",
        "scopes": ["access:services!service=queue"],
        "services": ["fgpu-spawner"],
    },
    {
        "name": "fgpu-node-agent",
        "description": "The node agents' identity towards the queue service: they report nodes",
        "scopes": ["access:services!service=queue"],
        "services": ["fgpu-node-agent"],
    },
]

if idle_timeout:
    c.JupyterHub.load_roles.append(
        {
            "name": "idle-culler",
            "description": "Stops servers idle past FGPU_IDLE_TIMEOUT (jupyterhub-idle-culler)",
            # The scopes its README lists for culling servers (not users).
            "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
            "services": ["idle-culler"],
        }
    )

# Instructors: members of this group manage the image catalog (the role above). Admins add
# members in the admin panel; loading the group only adds, never removes members.
c.JupyterHub.custom_scopes = {
    MANAGE_SCOPE: {"description": "Add, edit, hide, restrict and delete catalog images"}
}
c.JupyterHub.load_groups = {"instructors": {"users": []}}


def check_roles_when_the_hub_starts() -> None:
    """A role granting a scope filter the service does not honour (`custom:images:manage!group=x`)
    stops the hub, naming the role and scope; a filtered admin:servers is logged as a warning.
    The check runs on the roles as the hub takes them, once every config file is read, so the
    roles a site file adds after `load_subconfig("jupyterhub_config.py")` are checked too. Read
    by a tool rather than a starting hub (no JupyterHub instance), this file checks nothing."""
    from jupyterhub.app import JupyterHub

    if not JupyterHub.initialized():
        return
    hub = JupyterHub.instance()

    def check(change) -> None:
        found = check_roles(change.new)
        for warning in found.warnings:
            hub.log.warning("Scope filter: %s", warning)
        for refusal in found.refusals:
            hub.log.critical("Refusing to start: %s", refusal)
        if found.refusals:
            # Before the proxy and services start: the process ends here, nothing is left running.
            raise SystemExit(1)

    hub.observe(check, names="load_roles")


check_roles_when_the_hub_starts()


def back_up_the_hub_db_before_its_upgrade() -> None:
    """JupyterHub upgrades its database at start (upgrade_db above) and backs up only SQLite, by
    copying the file; the hub's database is backed up here first, as the queue's is, PostgreSQL
    included (pg_dump), when it is behind the installed JupyterHub. Without a backup the hub does
    not start. Read by a tool rather than a starting hub, this file backs up nothing."""
    from jupyterhub.app import JupyterHub
    from sqlalchemy.exc import OperationalError

    from queue_service.store.db_upgrade import UpgradeRefused, backup_before_hub_upgrade

    if not JupyterHub.initialized():
        return
    hub = JupyterHub.instance()
    try:
        backup_before_hub_upgrade(c.JupyterHub.db_url, log=hub.log)
    except OperationalError:
        return  # unreachable: JupyterHub says so itself, with its advice
    except UpgradeRefused as e:
        hub.log.critical("Refusing to start: %s", e)
        raise SystemExit(1) from None


back_up_the_hub_db_before_its_upgrade()

c.JupyterHub.spawner_class = "fgpu-swarm" if engine == "swarm" else "fgpu"
c.FGPUSpawner.units_per_gpu = units_per_gpu
c.FGPUSpawner.queue_url = f"{queue_url}/services/queue/"
c.FGPUSpawner.queue_token = spawner_token
c.FGPUSpawner.deployment_id = fgpu_deployment_id
# Up to 4 fGPU per session by default; the queue refuses what no node could ever hold.
for limit_name, limit_value in session_limits.items():
    setattr(c.FGPUSpawner, limit_name, limit_value)
c.FGPUSpawner.gpu_sharing = "simulated" if simulated_gpus else "hami"
c.Spawner.default_url = "/lab"
# A spawn may wait in the queue; the queue's own pending timeout ends it first, with a reason the
# student sees. What is left is the start after the grant: the container, and its first answer
# within http_timeout.
c.Spawner.http_timeout = 60
c.Spawner.start_timeout = pending_timeout + 120
# Per user, at most sessions + pending named servers (3 + 2) may run or wait at once, besides the
# batch jobs waiting (5 more); stopped ones do not count. The queue's limits refuse the default
# server past the same numbers.
from fgpu_spawner.named_servers import ActiveNamedServerLimit  # noqa: E402

c.JupyterHub.named_server_limit_per_user = ActiveNamedServerLimit(
    active_session_limit(user_quota), jobs_waiting=jobs_waiting_per_user
)
# A spawn holds one of the hub's spawn slots from its start until its server answers, and so for
# as long as it waits in the queue, a batch job's too. The pending quota and the jobs' limit bound
# those waiting spawns at `pending` + jobs waiting per student ((2 + 5) × 200 students = 1,400 at
# worst), and the rest is room for spawns that are starting a container (100), so that a full
# queue never turns everyone else's start into a 429.
class_size = int(os.environ.get("FGPU_CLASS_SIZE", "200"))
waiting_per_user = (pending_per_user if pending_per_user is not None else 2) + (
    jobs_waiting_per_user or JOBS_WAITING_PER_USER
)
from fgpu_spawner.queue_client import open_files_needed, spawn_slots  # noqa: E402

c.JupyterHub.concurrent_spawn_limit = spawn_slots(class_size, waiting_per_user)


def raise_open_file_limit(needed: int) -> None:
    """Every waiting spawn keeps connections open for as long as it waits (its long-poll, one
    file in the hub and one in the service; its student's progress stream). A service manager's
    usual soft limit of 1,024 open files would stop the hub accepting connections at about 500
    waiting spawns; Python does not raise it. The hub raises its own, up to the hard limit, and
    its services (the queue service among them) inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        print(
            f"WARNING: {needed} open files needed for {c.JupyterHub.concurrent_spawn_limit} spawn"
            f" slots, and the hard limit allows {hard}: raise it (LimitNOFILE=)",
            file=sys.stderr,
        )


raise_open_file_limit(open_files_needed(c.JupyterHub.concurrent_spawn_limit))

# The hub's pages carry the queue's Sessions (and, for admins, Cluster) links, the resource
# indicator on the home page and spawn form, and the queue position on the spawn-pending page.
from templates import TEMPLATES_DIR  # noqa: E402

c.JupyterHub.template_paths = [str(TEMPLATES_DIR / "hub")]
# A course's message to its members (Course page) is the hub's announcement for them, read from
# their groups by the hub itself and escaped (fgpu_shared/course_messages.py). A site that sets
# its own announcement replaces this one.
from fgpu_shared.course_messages import announcement_of  # noqa: E402

c.JupyterHub.template_vars = {"announcement": announcement_of}

# After logging in, a student lands on the queue's Sessions page, where their sessions, the
# indicator and the launch dialog are (docs/source/explanation/sessions-and-queue.md, "Using the hub"), not on the hub's spawn form. This
# is only the default: a `next=` from a link the student followed (say /user/x/lab) still wins,
# as JupyterHub's get_next_url reads `next` first. A callable, so that a site which sets its
# own base_url after loading this file still lands under it.
from fgpu_spawner.landing import sessions_page_url  # noqa: E402

c.JupyterHub.default_url = sessions_page_url
