"""The shipped jupyterhub_config.py (DESIGN.md, contract 2), loaded as JupyterHub loads it."""

from traitlets.config.loader import PyFileConfigLoader

from fgpu_spawner import FGPUSpawner
from fgpu_spawner.network import ICC_OPTION

from .harness import ROOT


def load_shipped_config():
    return PyFileConfigLoader("jupyterhub_config.py", path=str(ROOT)).load_config()


def test_environment_variables_set_port_and_fgpu_units(monkeypatch):
    monkeypatch.setenv("FGPU_HUB_PORT", "8123")
    monkeypatch.setenv("FGPU_UNITS_PER_GPU", "5")
    config = load_shipped_config()
    assert config.JupyterHub.bind_url == "http://127.0.0.1:8123"
    assert config.FGPUSpawner.units_per_gpu == 5


def test_defaults_are_a_local_hub_that_keeps_sessions_across_restarts(monkeypatch):
    for name in ("FGPU_HUB_PORT", "FGPU_HUB_IP", "FGPU_UNITS_PER_GPU", "FGPU_DUMMY_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    config = load_shipped_config()
    assert config.JupyterHub.bind_url == "http://127.0.0.1:8000"
    assert config.JupyterHub.spawner_class == "fgpu"
    assert config.JupyterHub.cleanup_servers is False
    assert config.Authenticator.allow_all is True
    # State follows JupyterHub's convention: nothing moves the DB or cookie secret out of the cwd.
    assert "db_url" not in config.JupyterHub and "cookie_secret_file" not in config.JupyterHub


def test_every_spawner_setting_explains_itself():
    own = FGPUSpawner.class_own_traits(config=True)
    assert own, "FGPUSpawner declares its settings"
    undocumented = [name for name, trait in own.items() if len((trait.help or "").strip()) < 10]
    assert undocumented == []


def test_the_hub_api_listens_on_the_isolated_session_networks_gateway(docker_engine):
    """Sessions reach the hub's API on their network's gateway and cannot reach one another."""
    config = load_shipped_config()
    network = docker_engine.api.inspect_network(config.FGPUSpawner.network_name)
    assert network["Options"][ICC_OPTION] == "false"
    assert config.JupyterHub.hub_ip == network["IPAM"]["Config"][0]["Gateway"]
