"""The fGPU hub's JupyterHub configuration (DESIGN.md, contract 2).

Run it with `jupyterhub -f jupyterhub_config.py`, or extend it from another file with
`load_subconfig("jupyterhub_config.py")`. State (hub DB, cookie secret) lives in the directory the hub
is started from, as JupyterHub's own default has it.

Environment variables:
  FGPU_HUB_PORT        public port of the hub (default 8000)
  FGPU_HUB_IP          public address of the hub (default 127.0.0.1)
  FGPU_SIMULATED_GPUS  simulated GPUs for hosts without any, e.g. "2x8GiB"
  FGPU_UNITS_PER_GPU   fGPU units in one physical GPU (default 1)
  FGPU_DUMMY_PASSWORD  shared password for the demo login (default: none asked)
  FGPU_QUEUE_PORT      port of the queue service on 127.0.0.1 (default 10101)
  FGPU_CATALOG_PATH    catalog.yaml that seeds the image catalog (default: the shipped one)
"""

import os
import secrets
import sys

import docker

c = get_config()  # noqa: F821 (injected by traitlets when JupyterHub loads this file)


def docker_bridge_gateway(default: str = "172.17.0.1") -> str:
    """The engine's bridge gateway: where session containers reach the hub."""
    try:
        bridge = docker.from_env(timeout=5).networks.get("bridge")
        return bridge.attrs["IPAM"]["Config"][0]["Gateway"]
    except Exception:
        return default


# The public side: students open this URL.
c.JupyterHub.bind_url = (
    f"http://{os.environ.get('FGPU_HUB_IP', '127.0.0.1')}:{os.environ.get('FGPU_HUB_PORT', '8000')}"
)
# The hub's API listens on the bridge, so containers can call it and nothing outside can.
c.JupyterHub.hub_ip = docker_bridge_gateway()
c.JupyterHub.allow_named_servers = True
# Sessions outlive a hub restart; the queue service's reconciler owns their clean-up.
c.JupyterHub.cleanup_servers = False

# A demo login: any user name; `admin` is an admin. A real site sets its own authenticator in a
# config file that loads this one.
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {"admin"}
if os.environ.get("FGPU_DUMMY_PASSWORD"):
    c.DummyAuthenticator.password = os.environ["FGPU_DUMMY_PASSWORD"]

# The queue service owns every allocation. The spawner talks to it with a token of its own,
# whose only scope is access to that service.
units_per_gpu = int(os.environ.get("FGPU_UNITS_PER_GPU", "1"))
simulated_gpus = os.environ.get("FGPU_SIMULATED_GPUS", "")
queue_url = f"http://127.0.0.1:{os.environ.get('FGPU_QUEUE_PORT', '10101')}"
spawner_token = secrets.token_hex(32)
catalog_path = os.environ.get("FGPU_CATALOG_PATH", "")
# Which hub a session container belongs to, kept in the state directory (outside the service's
# DB): hubs sharing an engine then adopt or stop only their own sessions.
from queue_service.deployment import deployment_id  # noqa: E402

fgpu_deployment_id = deployment_id(os.getcwd())
DOCKER_ENV = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")
c.JupyterHub.services = [
    {
        "name": "queue",
        "display": True,
        "url": queue_url,
        "oauth_no_confirm": True,
        "cwd": os.getcwd(),
        "command": [
            sys.executable,
            "-m",
            "queue_service",
            f"--QueueService.units_per_gpu={units_per_gpu}",
            f"--QueueService.simulated_gpus={simulated_gpus}",
            f"--QueueService.catalog_path={catalog_path}",
            f"--QueueService.deployment_id={fgpu_deployment_id}",
        ],
        # The hub passes services only a few variables: the service must reach the same engine
        # as the spawner (DOCKER_HOST...), or it would count and stop containers of another.
        "environment": {key: os.environ[key] for key in DOCKER_ENV if key in os.environ},
        # The service sees this scope on the tokens of users who hold it (instructors).
        "oauth_client_allowed_scopes": ["custom:images:manage"],
    },
    {"name": "fgpu-spawner", "api_token": spawner_token},
]
c.JupyterHub.load_roles = [
    {"name": "user", "scopes": ["self", "access:services!service=queue"]},
    {
        "name": "fgpu-queue",
        "description": "The queue service: reads users and groups, starts and stops servers",
        "scopes": ["list:users", "read:users", "read:groups", "servers", "access:servers"],
        "services": ["queue"],
    },
    {
        "name": "instructor",
        "description": "Curates the image catalog: adds, edits, hides, restricts, deletes images",
        "scopes": ["custom:images:manage"],
        "groups": ["instructors"],
    },
    {
        "name": "fgpu-spawner",
        "description": "The spawner's identity towards the queue service, and nothing else",
        "scopes": ["access:services!service=queue"],
        "services": ["fgpu-spawner"],
    },
]

# Instructors: members of this group manage the image catalog (the role above). Admins add
# members in the admin panel; loading the group only adds, never removes members.
c.JupyterHub.custom_scopes = {
    "custom:images:manage": {"description": "Add, edit, hide, restrict and delete catalog images"}
}
c.JupyterHub.load_groups = {"instructors": {"users": []}}

c.JupyterHub.spawner_class = "fgpu"
c.FGPUSpawner.units_per_gpu = units_per_gpu
c.FGPUSpawner.queue_url = f"{queue_url}/services/queue/"
c.FGPUSpawner.queue_token = spawner_token
c.FGPUSpawner.catalog_path = catalog_path
c.FGPUSpawner.deployment_id = fgpu_deployment_id
# Up to 4 fGPU per session by default; the queue refuses what no node could ever hold.
c.FGPUSpawner.fgpu_max = float(os.environ.get("FGPU_MAX_PER_SESSION", "4"))
c.FGPUSpawner.gpu_sharing = "simulated" if simulated_gpus else "hami"
c.Spawner.default_url = "/lab"
# A spawn may wait in the queue; the queue's own pending timeout (an hour) ends it first.
c.Spawner.start_timeout = 3600 + 120
c.JupyterHub.concurrent_spawn_limit = 500
c.Spawner.http_timeout = 60

# The hub's pages carry the queue's Sessions (and, for admins, Cluster) links, the resource
# indicator on the home page and spawn form, and the queue position on the spawn-pending page.
from templates import TEMPLATES_DIR  # noqa: E402

c.JupyterHub.template_paths = [str(TEMPLATES_DIR / "hub")]
