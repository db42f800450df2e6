"""The shipped jupyterhub_config.py (docs/source/explanation/contracts.md, contract 2), loaded as JupyterHub loads it."""

import json
import re
import resource
import time

import pytest
from jupyterhub.auth import PAMAuthenticator
from jupyterhub.services import service as hub_services
from traitlets.config.loader import PyFileConfigLoader

from fgpu_shared import site_config
from fgpu_spawner import FGPUSpawner, managed_services
from fgpu_spawner.demo_login import DemoAuthenticator
from fgpu_spawner.lti_login import LTICourseAuthenticator
from fgpu_spawner.managed_services import ManagedServiceSpawner
from fgpu_spawner.network import ICC_OPTION
from queue_service.core.scopes import ADMIN_SCOPE, MANAGE_SCOPE, check_roles
from queue_service.quotas import QuotaError

from .harness import ROOT


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """The config keeps state in the directory the hub starts from: here, a fresh one."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def load_shipped_config():
    return PyFileConfigLoader("jupyterhub_config.py", path=str(ROOT)).load_config()


def guide_site_recipe() -> str:
    """The guide's site file (howto/configure.md): the Python block that extends the shipped config."""
    blocks = re.findall(
        r"```python\n(.*?)```", (ROOT / "docs/source/howto/configure.md").read_text(), re.S
    )
    (recipe,) = [block for block in blocks if "load_subconfig" in block]
    return recipe


def handed(config, section: str = "QueueService") -> dict:
    """The queue service's settings (or its engine backend's `section`) as the hub hands them to
    it (fgpu_shared/site_config.py); {} for a section it hands none of."""
    return json.loads(site_config.service_config_text(config)).get(section, {})


def load_site_config(tmp_path, text: str):
    """A site file in its own folder that loads the shipped config, as JupyterHub loads it."""
    (tmp_path / "site_config.py").write_text(text)
    return PyFileConfigLoader("site_config.py", path=[str(tmp_path), str(ROOT)]).load_config()


def test_the_spawner_and_the_service_share_the_deployment_id_kept_in_the_state_dir(state_dir):
    config = load_shipped_config()
    kept = (state_dir / "fgpu_deployment_id").read_text().strip()
    assert kept and config.FGPUSpawner.deployment_id == kept
    assert handed(config)["deployment_id"] == kept
    # Read again at the next start, not made anew.
    assert load_shipped_config().FGPUSpawner.deployment_id == kept


async def test_the_hubs_services_are_polled_every_few_seconds_once_they_have_run_a_while(
    monkeypatch,
):
    """A killed queue service is started again within seconds (fgpu_spawner/managed_services.py);
    one that dies at its start is not tried again sooner than JupyterHub's half minute."""
    monkeypatch.setattr(hub_services, "_ServiceSpawner", hub_services._ServiceSpawner)
    load_shipped_config()
    assert hub_services._ServiceSpawner is ManagedServiceSpawner
    spawner = ManagedServiceSpawner()
    assert spawner.poll_interval == managed_services.POLL_SECONDS <= 5
    polls = []

    async def poll():
        polls.append(time.monotonic())
        return 1  # exited

    monkeypatch.setattr(spawner, "poll", poll)
    spawner.started_at = time.monotonic()
    assert await spawner.poll_and_notify() is None and polls == []
    spawner.started_at -= managed_services.MIN_UPTIME
    assert await spawner.poll_and_notify() == 1 and len(polls) == 1


def test_environment_variables_set_port_and_fgpu_units(monkeypatch):
    monkeypatch.setenv("FGPU_HUB_PORT", "8123")
    monkeypatch.setenv("FGPU_UNITS_PER_GPU", "5")
    config = load_shipped_config()
    assert config.JupyterHub.bind_url == "http://127.0.0.1:8123"
    assert config.FGPUSpawner.units_per_gpu == 5


def test_defaults_are_a_local_hub_that_keeps_sessions_across_restarts(monkeypatch):
    for name in (
        "FGPU_HUB_PORT",
        "FGPU_HUB_IP",
        "FGPU_UNITS_PER_GPU",
        "FGPU_DUMMY_PASSWORD",
        "FGPU_HUB_DB_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    config = load_shipped_config()
    assert config.JupyterHub.bind_url == "http://127.0.0.1:8000"
    assert config.JupyterHub.spawner_class == "fgpu"
    assert config.JupyterHub.cleanup_servers is False
    assert config.JupyterHub.authenticator_class == "fgpu_spawner.demo_login.DemoAuthenticator"
    # State follows JupyterHub's convention: nothing moves the DB or cookie secret out of the cwd.
    assert config.JupyterHub.db_url == "sqlite:///jupyterhub.sqlite"
    assert "cookie_secret_file" not in config.JupyterHub


def test_both_databases_are_set_in_the_environment_and_no_password_reaches_a_command_line(
    monkeypatch,
):
    monkeypatch.setenv("FGPU_HUB_DB_URL", "postgresql://hub:hub-secret@db.example/fgpu_hub")
    monkeypatch.setenv("FGPU_QUEUE_DB_URL", "postgresql://queue:q-secret@db.example/fgpu_queue")
    config = load_shipped_config()
    assert config.JupyterHub.db_url == "postgresql+psycopg://hub:hub-secret@db.example/fgpu_hub"
    # A new JupyterHub's schema is applied at start, after the config's own backup.
    assert config.JupyterHub.upgrade_db is True
    (queue,) = [s for s in config.JupyterHub.services if s["name"] == "queue"]
    assert queue["environment"]["FGPU_QUEUE_DB_URL"] == (
        "postgresql+psycopg://queue:q-secret@db.example/fgpu_queue"
    )
    # `ps` shows every process's arguments to every user of the machine.
    assert not any("secret" in arg or "db_url" in arg for arg in queue["command"])


def test_a_database_url_that_cannot_serve_stops_the_hub_with_a_message(monkeypatch):
    monkeypatch.setenv("FGPU_HUB_DB_URL", "db.example/fgpu_hub")
    with pytest.raises(SystemExit, match="FGPU_HUB_DB_URL is not a database URL"):
        load_shipped_config()


def test_without_the_variables_the_queue_service_gets_its_sqlite_file(monkeypatch):
    monkeypatch.delenv("FGPU_QUEUE_DB_URL", raising=False)
    (queue,) = [s for s in load_shipped_config().JupyterHub.services if s["name"] == "queue"]
    assert queue["environment"]["FGPU_QUEUE_DB_URL"] == "sqlite:///fgpu_queue.sqlite"


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


def test_the_demo_login_lets_anyone_in_and_admin_is_an_admin(monkeypatch):
    monkeypatch.delenv("FGPU_DEMO_LOGIN_ON_NETWORK", raising=False)
    demo = DemoAuthenticator(config=load_shipped_config())
    assert demo.allow_all is True
    assert demo.admin_users == {"admin"}
    assert demo.allow_non_loopback is False


def test_the_demo_settings_reach_no_other_authenticator(tmp_path):
    site = load_site_config(
        tmp_path,
        'load_subconfig("jupyterhub_config.py")\nc.JupyterHub.authenticator_class = "pam"\n',
    )
    pam = PAMAuthenticator(config=site)
    assert pam.allow_all is False
    assert pam.admin_users == set()


def test_the_lms_login_takes_its_lti_lines_and_none_of_the_demo_settings(tmp_path):
    """The LMS login's lines, as docs/source/howto/logins.md shows them, after the shipped file."""
    site = load_site_config(
        tmp_path,
        'load_subconfig("jupyterhub_config.py")\n'
        'c.JupyterHub.authenticator_class = "fgpu_spawner.lti_login.LTICourseAuthenticator"\n'
        'c.LTI13Authenticator.client_id = ["125900000000000123"]\n'
        'c.LTI11Authenticator.consumers = {"fgpu-hub": "secret"}\n',
    )
    lti = LTICourseAuthenticator(config=site)
    assert lti.client_id == {"125900000000000123"}
    assert lti.lti11.consumers == {"fgpu-hub": "secret"}
    # The LMS decides who launches; nobody is a hub admin by the demo's list.
    assert lti.allow_all is True
    assert lti.admin_users == set()


def test_the_guide_site_recipe_lets_in_only_its_own_users(tmp_path):
    site = load_site_config(tmp_path, guide_site_recipe())
    assert site.JupyterHub.authenticator_class == "pam"
    pam = PAMAuthenticator(config=site)
    assert pam.allow_all is False
    assert "admin" not in pam.admin_users
    assert pam.allowed_users and "admin" not in pam.allowed_users


def test_the_guide_site_recipes_service_lines_and_spawner_limits_reach_the_service(tmp_path):
    service = handed(load_site_config(tmp_path, guide_site_recipe()))
    assert (service["policy"], service["job_time_limit"]) == ("drf", 7200)
    assert (service["session_limits"]["cpu_max"], service["session_limits"]["mem_max"]) == (
        8,
        "32G",
    )


def test_an_explicit_setting_lets_the_demo_login_on_the_network(monkeypatch):
    monkeypatch.setenv("FGPU_DEMO_LOGIN_ON_NETWORK", "1")
    assert DemoAuthenticator(config=load_shipped_config()).allow_non_loopback is True


def service_user_quota(config) -> dict:
    """The per-user quota the shipped config sets for the queue service."""
    return handed(config)["user_quota"]


def test_one_student_cannot_hold_the_hub_by_default(monkeypatch):
    for name in ("FGPU_USER_QUOTA", "FGPU_CLASS_SIZE", "FGPU_MAX_PER_SESSION"):
        monkeypatch.delenv(name, raising=False)
    config = load_shipped_config()
    assert service_user_quota(config) == {"sessions": 3, "pending": 2, "fgpu": 4.0}
    # In line with the quota: 3 running + 2 waiting named servers at once, and 5 waiting jobs.
    assert config.JupyterHub.named_server_limit_per_user.limit == 5
    assert config.JupyterHub.named_server_limit_per_user.jobs_waiting == 5
    # (2 + 5) waiting spawns × 200 students, and 100 slots for spawns that are starting.
    assert config.JupyterHub.concurrent_spawn_limit == 1500
    assert handed(config)["jobs_waiting_per_user"] == 5


def test_a_site_sets_the_jobs_waiting_per_user_for_the_queue_and_the_hub(monkeypatch):
    for name in ("FGPU_USER_QUOTA", "FGPU_CLASS_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FGPU_JOBS_WAITING_PER_USER", "3")
    config = load_shipped_config()
    assert handed(config)["jobs_waiting_per_user"] == 3
    assert config.JupyterHub.named_server_limit_per_user.limit == 3 + 2
    assert config.JupyterHub.named_server_limit_per_user.jobs_waiting == 3
    assert config.JupyterHub.concurrent_spawn_limit == (2 + 3) * 200 + 100
    monkeypatch.setenv("FGPU_JOBS_WAITING_PER_USER", "-1")
    with pytest.raises(SystemExit, match="FGPU_JOBS_WAITING_PER_USER must be a whole number"):
        load_shipped_config()


def test_a_site_raises_the_per_user_limits(monkeypatch):
    monkeypatch.setenv("FGPU_USER_QUOTA", '{"sessions": 6, "pending": 4}')
    monkeypatch.setenv("FGPU_MAX_PER_SESSION", "8")
    monkeypatch.setenv("FGPU_CLASS_SIZE", "50")
    config = load_shipped_config()
    assert service_user_quota(config) == {"sessions": 6, "pending": 4, "fgpu": 8.0}
    assert config.JupyterHub.named_server_limit_per_user.limit == 6 + 4
    assert config.JupyterHub.concurrent_spawn_limit == (4 + 5) * 50 + 100


def test_the_queue_ends_a_wait_before_the_hub_gives_up_on_the_start():
    """The hub's start timeout covers a whole wait in the queue and the start after the grant,
    so a request that waits too long ends as the queue's PENDING_TIMEOUT (a reason the student
    sees), never as the hub's bare timeout; both come from one number in the config."""
    config = load_shipped_config()
    pending_timeout = handed(config)["pending_timeout"]
    assert pending_timeout > 0
    assert config.Spawner.start_timeout >= pending_timeout + config.Spawner.http_timeout


@pytest.fixture
def open_file_limit():
    """The test process's limit on open files, put back afterwards (loading the config sets it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_hub_for_2000_waiting_spawns_raises_its_open_file_limit(monkeypatch, open_file_limit):
    """Started by a service manager with its usual soft limit of 1,024 open files, the hub
    raises its own (its services inherit it): each waiting spawn holds a long-poll to the service
    and a progress stream, so 1,024 stopped the hub accepting connections near 500 of them."""
    monkeypatch.setenv("FGPU_CLASS_SIZE", "1000")  # 2,100 spawn slots
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, open_file_limit))
    slots = load_shipped_config().JupyterHub.concurrent_spawn_limit
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == open_file_limit
    assert soft >= min(hard, 2 * slots + 1024)


def test_a_site_lifts_a_per_user_limit_with_null(monkeypatch):
    monkeypatch.setenv("FGPU_USER_QUOTA", '{"pending": null}')
    config = load_shipped_config()
    assert service_user_quota(config)["pending"] is None
    assert config.JupyterHub.named_server_limit_per_user.limit == 0  # no limit


def test_a_typo_in_the_per_user_quota_stops_the_hub_at_start(monkeypatch):
    monkeypatch.setenv("FGPU_USER_QUOTA", '{"sesions": 6}')
    with pytest.raises(QuotaError, match="FGPU_USER_QUOTA: unknown quota key.*sesions"):
        load_shipped_config()


def test_the_shipped_roles_pass_the_scope_check_and_the_service_sees_its_scopes():
    config = load_shipped_config()
    found = check_roles(config.JupyterHub.load_roles)
    assert found.refusals == [] and found.warnings == []
    (queue,) = [s for s in config.JupyterHub.services if s["name"] == "queue"]
    assert queue["oauth_client_allowed_scopes"] == [MANAGE_SCOPE, ADMIN_SCOPE]
    assert MANAGE_SCOPE in config.JupyterHub.custom_scopes


def test_swarm_mode_is_chosen_by_the_environment_the_lab_prints(monkeypatch):
    lab = {
        "FGPU_ENGINE": "swarm",
        "FGPU_SWARM_REGISTRY": "10.213.0.1:5000",
        "FGPU_SWARM_REGISTRY_AUTH_FILE": "/lab/registry/nodes-auth.json",
        "FGPU_SWARM_REGISTRY_CA": "/lab/tls/ca.pem",
        "FGPU_HUB_CONNECT_IP": "10.213.0.1",
        "FGPU_SWARM_HOME_ROOT": "/srv/homes",
        "FGPU_SWARM_REACHABLE_SESSIONS": "1",  # a hub beside the Swarm (the lab's)
    }
    for name, value in lab.items():
        monkeypatch.setenv(name, value)
    config = load_shipped_config()
    assert config.JupyterHub.spawner_class == "fgpu-swarm"
    assert config.JupyterHub.hub_ip == "10.213.0.1"
    assert config.FGPUSwarmSpawner.registry == "10.213.0.1:5000"
    assert config.FGPUSwarmSpawner.registry_auth_file == "/lab/registry/nodes-auth.json"
    assert config.FGPUSwarmSpawner.home_root == "/srv/homes"
    assert config.FGPUSwarmSpawner.endpoint == "host_port"
    assert config.FGPUSwarmSpawner.allow_reachable_sessions is True
    service = handed(config)
    assert service["engine_class"] == "swarm"
    # The service looks for a batch job's notebook in the same shared homes.
    assert service["home_root"] == "/srv/homes"
    # The queue service lists the registry's images with its credentials, over TLS with its CA.
    assert service["registry_auth_file"] == "/lab/registry/nodes-auth.json"
    assert handed(config, "SwarmEngine")["registry_ca"] == "/lab/tls/ca.pem"
    # No local session bridge is made on the manager: its engine runs no sessions.
    assert "network_name" not in config.FGPUSpawner


def test_a_hub_in_a_container_on_the_overlay_listens_there_and_sessions_reach_it_by_its_name(
    monkeypatch,
):
    for name, value in {
        "FGPU_ENGINE": "swarm",
        "FGPU_HUB_CONNECT_IP": "10.213.0.1",
        "FGPU_SWARM_ENDPOINT": "overlay",
        "FGPU_SWARM_HUB_CONTAINER": "fgpu-hub",
        "FGPU_SWARM_NETWORK_PER_SESSION": "1",
        "FGPU_QUEUE_PORT": "10101",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("FGPU_NODE_AGENT_URL", raising=False)
    config = load_shipped_config()
    # The hub's API on every address of the container (sessions come from their overlays), the
    # proxy beside it at loopback; the queue service only at loopback.
    assert (config.JupyterHub.hub_ip, config.JupyterHub.hub_connect_ip) == ("0.0.0.0", "127.0.0.1")
    assert config.FGPUSwarmSpawner.hub_container == "fgpu-hub"
    assert config.FGPUSwarmSpawner.network_per_session is True
    (queue,) = [s for s in config.JupyterHub.services if s["name"] == "queue"]
    assert queue["url"] == "http://127.0.0.1:10101"
    # No node agent can reach the service's loopback: none unless FGPU_NODE_AGENT_URL names one.
    assert not [name for name in handed(config, "SwarmEngine") if "node_agent" in name]
    monkeypatch.setenv("FGPU_NODE_AGENT_URL", "https://hub.example.org/services/queue/")
    service = handed(load_shipped_config(), "SwarmEngine")
    assert service["node_agent_url"] == "https://hub.example.org/services/queue/"


def test_single_host_stays_the_default_and_a_bad_engine_is_refused(monkeypatch):
    config = load_shipped_config()
    assert config.JupyterHub.spawner_class == "fgpu"
    assert handed(config)["engine_class"] == "docker"
    monkeypatch.setenv("FGPU_ENGINE", "kubernetes")
    with pytest.raises(SystemExit, match="FGPU_ENGINE must be docker or swarm, not 'kubernetes'"):
        load_shipped_config()


def test_the_node_agents_token_is_kept_in_the_state_dir_and_their_url_reaches_the_service(
    state_dir, monkeypatch
):
    monkeypatch.delenv("FGPU_NODE_AGENT_URL", raising=False)
    config = load_shipped_config()
    (agents,) = [s for s in config.JupyterHub.services if s["name"] == "fgpu-node-agent"]
    kept = (state_dir / "fgpu_node_agent_token").read_text().strip()
    assert agents["api_token"] == kept
    assert oct((state_dir / "fgpu_node_agent_token").stat().st_mode & 0o777) == "0o600"
    assert not [name for name in handed(config, "SwarmEngine") if name.startswith("node_agent")]
    (agents,) = [
        s for s in load_shipped_config().JupyterHub.services if s["name"] == agents["name"]
    ]
    assert agents["api_token"] == kept  # kept, not new

    monkeypatch.setenv("FGPU_NODE_AGENT_URL", "http://10.213.0.1:8000/services/queue/")
    monkeypatch.setenv("FGPU_SWARM_REGISTRY", "10.213.0.1:5000")
    service = handed(load_shipped_config(), "SwarmEngine")
    assert service["node_agent_url"] == "http://10.213.0.1:8000/services/queue/"
    assert service["node_agent_image"] == "10.213.0.1:5000/fgpu/jupyter-base:py3.11"
    assert service["node_agent_registry"] == "10.213.0.1:5000"


def culler_of(config) -> dict | None:
    found = [s for s in config.JupyterHub.services if s["name"] == "idle-culler"]
    return found[0] if found else None


def test_the_idle_culler_runs_as_a_hub_service_with_the_site_timeout(monkeypatch):
    for value in (None, "0"):  # unset or 0: the site default, an hour
        if value is None:
            monkeypatch.delenv("FGPU_IDLE_TIMEOUT", raising=False)
        else:
            monkeypatch.setenv("FGPU_IDLE_TIMEOUT", value)
        config = load_shipped_config()
        command = culler_of(config)["command"]
        assert command[1] == "-c" and "from jupyterhub_idle_culler import main" in command[2]
        assert {"--timeout=3600", "--cull-every=60", "--cull-named-servers=True"} <= set(command)
        assert config.FGPUSpawner.idle_timeout == 3600
    (role,) = [r for r in config.JupyterHub.load_roles if r["name"] == "idle-culler"]
    assert role["services"] == ["idle-culler"]
    assert set(role["scopes"]) == {
        "list:users",
        "read:users:activity",
        "read:servers",
        "delete:servers",
    }
    assert handed(config)["idle_timeout"] == 3600
    assert handed(config)["lifetime_warning"] == 600.0

    monkeypatch.setenv("FGPU_IDLE_TIMEOUT", "900")
    monkeypatch.setenv("FGPU_IDLE_CULL_EVERY", "30")
    config = load_shipped_config()
    assert {"--timeout=900", "--cull-every=30"} <= set(culler_of(config)["command"])
    assert config.FGPUSpawner.idle_timeout == 900

    monkeypatch.setenv("FGPU_IDLE_TIMEOUT", "off")
    config = load_shipped_config()
    assert culler_of(config) is None and config.FGPUSpawner.idle_timeout == 0
    assert not [r for r in config.JupyterHub.load_roles if r["name"] == "idle-culler"]


@pytest.mark.parametrize(
    ("name", "value"),
    [("FGPU_IDLE_TIMEOUT", "an hour"), ("FGPU_IDLE_TIMEOUT", "-5"), ("FGPU_IDLE_CULL_EVERY", "0")],
)
def test_a_bad_idle_setting_stops_the_hub_with_a_message(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit, match="FGPU_IDLE_TIMEOUT must be whole seconds"):
        load_shipped_config()


def test_storage_folders_live_on_the_shared_storage_in_swarm_mode_else_by_default(
    monkeypatch, state_dir
):
    def folders_root():
        return handed(load_shipped_config()).get("folders_root")

    # The service's own default (relative: its state directory); no path set.
    assert folders_root() is None
    monkeypatch.setenv("FGPU_FOLDERS_ROOT", "/data/folders")
    assert folders_root() == "/data/folders"
    monkeypatch.delenv("FGPU_FOLDERS_ROOT")
    monkeypatch.setenv("FGPU_SWARM_HOME_ROOT", "/srv/homes")
    assert folders_root() == "/srv/homes/.folders"
    # Homes on one host are volumes: no home root for the service then.
    assert "home_root" not in handed(load_shipped_config())
