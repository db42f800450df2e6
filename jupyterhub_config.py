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
"""

import os

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

c.JupyterHub.spawner_class = "fgpu"
c.FGPUSpawner.units_per_gpu = int(os.environ.get("FGPU_UNITS_PER_GPU", "1"))
c.Spawner.default_url = "/lab"
# A container start is seconds; the first start of an image after a build can take longer.
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 60
