"""The shipped jupyterhub_config.py (DESIGN.md, contract 2), loaded as JupyterHub loads it."""

import pytest
from traitlets.config.loader import PyFileConfigLoader

from fgpu_spawner import FGPUSpawner

from .harness import ROOT


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """The config keeps state in the directory the hub starts from: here, a fresh one."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def load_shipped_config():
    return PyFileConfigLoader("jupyterhub_config.py", path=str(ROOT)).load_config()


def test_the_spawner_and_the_service_share_the_deployment_id_kept_in_the_state_dir(state_dir):
    config = load_shipped_config()
    kept = (state_dir / "fgpu_deployment_id").read_text().strip()
    assert kept and config.FGPUSpawner.deployment_id == kept
    (queue,) = [s for s in config.JupyterHub.services if s["name"] == "queue"]
    assert f"--QueueService.deployment_id={kept}" in queue["command"]
    # Read again at the next start, not made anew.
    assert load_shipped_config().FGPUSpawner.deployment_id == kept


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
