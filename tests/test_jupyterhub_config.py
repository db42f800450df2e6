"""The shipped jupyterhub_config.py (DESIGN.md, contract 2), loaded as JupyterHub loads it."""

import ast

import pytest
from traitlets.config.loader import PyFileConfigLoader

from fgpu_spawner import FGPUSpawner
from queue_service.quotas import QuotaError

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


def service_user_quota(config) -> dict:
    """The per-user quota the shipped config hands the queue service on its command line."""
    (queue,) = [s for s in config.JupyterHub.services if s["name"] == "queue"]
    (flag,) = [arg for arg in queue["command"] if arg.startswith("--QueueService.user_quota=")]
    return ast.literal_eval(flag.split("=", 1)[1])


def test_one_student_cannot_hold_the_hub_by_default(monkeypatch):
    for name in ("FGPU_USER_QUOTA", "FGPU_CLASS_SIZE", "FGPU_MAX_PER_SESSION"):
        monkeypatch.delenv(name, raising=False)
    config = load_shipped_config()
    assert service_user_quota(config) == {"sessions": 3, "pending": 2, "fgpu": 4.0}
    # In line with the quota: 3 running + 2 waiting named servers at once.
    assert config.JupyterHub.named_server_limit_per_user.limit == 5
    # 2 waiting spawns × 200 students, and 100 slots for spawns that are starting.
    assert config.JupyterHub.concurrent_spawn_limit == 500


def test_a_site_raises_the_per_user_limits(monkeypatch):
    monkeypatch.setenv("FGPU_USER_QUOTA", '{"sessions": 6, "pending": 4}')
    monkeypatch.setenv("FGPU_MAX_PER_SESSION", "8")
    monkeypatch.setenv("FGPU_CLASS_SIZE", "50")
    config = load_shipped_config()
    assert service_user_quota(config) == {"sessions": 6, "pending": 4, "fgpu": 8.0}
    assert config.JupyterHub.named_server_limit_per_user.limit == 10
    assert config.JupyterHub.concurrent_spawn_limit == 4 * 50 + 100


def test_a_site_lifts_a_per_user_limit_with_null(monkeypatch):
    monkeypatch.setenv("FGPU_USER_QUOTA", '{"pending": null}')
    config = load_shipped_config()
    assert service_user_quota(config)["pending"] is None
    assert config.JupyterHub.named_server_limit_per_user.limit == 0  # no limit


def test_a_typo_in_the_per_user_quota_stops_the_hub_at_start(monkeypatch):
    monkeypatch.setenv("FGPU_USER_QUOTA", '{"sesions": 6}')
    with pytest.raises(QuotaError, match="FGPU_USER_QUOTA: unknown quota key.*sesions"):
        load_shipped_config()
