"""fgpu_shared/site_config.py: what the hub hands its queue service of the site's config, and
the service's loading of it (QueueService.initialize), the command line still winning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from traitlets.config import Config

from fgpu_shared import site_config
from fgpu_shared.site_config import SiteConfigError, service_config, service_config_text
from image_catalog.launch_options import SESSION_LIMITS
from queue_service.app import QueueService


def handed(config: Config) -> dict:
    return json.loads(service_config_text(config))["QueueService"]


def test_the_services_own_section_is_handed_as_json():
    c = Config()
    c.QueueService.pending_timeout = 7200
    c.QueueService.user_quota = {"sessions": 2, "fgpu": None}
    c.QueueService.folders_root = Path("/srv/folders")
    c.QueueService.presets = ({"name": "small", "cpu": 1},)
    c.JupyterHub.default_url = lambda handler: "/x"  # not the service's: never looked at
    assert handed(c) == {
        "pending_timeout": 7200,
        "user_quota": {"sessions": 2, "fgpu": None},
        "folders_root": "/srv/folders",
        "presets": [{"name": "small", "cpu": 1}],
    }


def test_a_shared_setting_comes_from_the_spawner_and_the_more_specific_section_wins():
    c = Config()
    c.FGPUSpawner.units_per_gpu = 4
    c.FGPUSpawner.home_volume = "cs101-home-{username}"
    c.FGPUSpawner.idle_timeout = 900
    c.FGPUSwarmSpawner.idle_timeout = 1800
    c.FGPUSwarmSpawner.home_root = "/mnt/homes"
    c.FGPUSpawner.docker_threads = 16  # the spawner's alone: not handed
    assert handed(c) == {
        "units_per_gpu": 4,
        "home_volume": "cs101-home-{username}",
        "idle_timeout": 1800,
        "home_root": "/mnt/homes",
    }


def test_the_session_limits_are_the_spawners_settings_of_the_same_names():
    c = Config()
    c.FGPUSpawner.fgpu_max = 2
    c.FGPUSpawner.mem_max = "32G"
    c.FGPUSpawner.default_image_name = "python-3.11"
    assert handed(c) == {
        "session_limits": {"fgpu_max": 2, "mem_max": "32G", "default_image_name": "python-3.11"}
    }
    assert set(site_config.LIMITS) == set(SESSION_LIMITS)


@pytest.mark.parametrize(
    ("service", "spawner", "message"),
    [
        (
            {"units_per_gpu": 2},
            {"units_per_gpu": 4},
            "c.QueueService.units_per_gpu = 2 and c.FGPUSpawner.units_per_gpu = 4 differ: set it"
            " once, as c.FGPUSpawner.units_per_gpu",
        ),
        (
            {"session_limits": {"fgpu_max": 1}},
            {"fgpu_max": 2},
            "c.QueueService.session_limits['fgpu_max'] = 1 and c.FGPUSpawner.fgpu_max = 2 differ",
        ),
    ],
)
def test_one_setting_set_two_ways_differently_is_refused_with_both_named(service, spawner, message):
    c = Config()
    for name, value in service.items():
        c.QueueService[name] = value
    for name, value in spawner.items():
        c.FGPUSpawner[name] = value
    with pytest.raises(SiteConfigError) as refused:
        service_config_text(c)
    assert message in str(refused.value)


def test_the_same_value_on_both_sides_is_no_conflict():
    c = Config()
    c.QueueService.units_per_gpu = 4
    c.FGPUSpawner.units_per_gpu = 4
    assert handed(c) == {"units_per_gpu": 4}


def test_a_class_goes_by_its_import_name():
    c = Config()
    c.QueueService.some_class = QueueService
    assert handed(c) == {"some_class": "queue_service.app.QueueService"}


def test_a_value_json_cannot_hold_and_a_change_in_place_are_refused_with_the_setting_named():
    c = Config()
    c.QueueService.presets = [{"name": "x", "when": object()}]
    with pytest.raises(SiteConfigError, match=r"c.QueueService.presets\[0\]\['when'\] = <object"):
        service_config_text(c)
    c = Config()
    c.QueueService.presets.append({"name": "x"})
    with pytest.raises(SiteConfigError, match=r"c.QueueService.presets is changed in place"):
        service_config_text(c)


@pytest.mark.parametrize("text", ["{", "[1]"])
def test_what_is_not_an_object_of_sections_is_refused(text):
    with pytest.raises(SiteConfigError, match=site_config.ENV):
        service_config(text)


def test_the_service_takes_the_handed_settings_and_its_command_line_wins(monkeypatch):
    c = Config()
    c.QueueService.pending_timeout = 7200
    c.QueueService.reconcile_interval = 10
    c.FGPUSpawner.units_per_gpu = 4
    c.FGPUSpawner.mem_max = "32G"
    monkeypatch.setenv(site_config.ENV, service_config_text(c))
    service = QueueService()
    service.initialize(["--QueueService.reconcile_interval=3"])
    assert service.pending_timeout == 7200
    assert service.units_per_gpu == 4
    assert service.session_limits == {**SESSION_LIMITS, "mem_max": 32 * 1024**3}
    assert service.reconcile_interval == 3
    assert service.settings_in_effect()["pending_timeout"] == 7200


@pytest.mark.parametrize(
    ("section", "name", "value", "message"),
    [
        ("QueueService", "pending_timeout", "soon", "pending_timeout"),
        ("QueueService", "session_limits", {"gpu_max": 2}, "session_limits has no 'gpu_max'"),
        ("FGPUSpawner", "mem_max", "lots", "session_limits['mem_max']: 'lots' is not a size"),
    ],
)
def test_a_bad_handed_setting_stops_the_service_naming_it(
    monkeypatch, section, name, value, message
):
    c = Config()
    c[section][name] = value
    monkeypatch.setenv(site_config.ENV, service_config_text(c))
    with pytest.raises(SystemExit) as stopped:
        QueueService().initialize([])
    assert "The site's settings for the queue service" in str(stopped.value)
    assert message in str(stopped.value)


def test_the_database_password_is_hidden_in_the_settings_in_effect(monkeypatch):
    monkeypatch.delenv(site_config.ENV, raising=False)
    service = QueueService()
    service.initialize(["--QueueService.db_url=postgresql://fgpu:s3cret@db/fgpu_queue"])
    shown = service.settings_in_effect()
    assert "s3cret" not in json.dumps(shown)
    assert shown["db_url"].startswith("postgresql+psycopg://fgpu:***@db")
