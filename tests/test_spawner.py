"""FGPUSpawner end to end: a real hub, a real Docker engine, requests through the REST API."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest
import requests
from traitlets.config import Config

from fgpu_spawner.gpu_sharing import build_gpu_settings
from fgpu_spawner.grant import Grant
from fgpu_spawner.spawner import FGPUSpawner

from .harness import containers_with, docker_client, free_port, in_terminal, running_hub

GIB = 1024**3
pytestmark = [pytest.mark.docker, pytest.mark.hub]


@pytest.fixture(scope="class")
def running_session(hub):
    """A server started with cpu=1.5 and mem=1G, and its container (read-only checks share it).

    Class-scoped: it holds 1.5 of this machine's 2 cores, so it ends with TestOneSession."""
    username = f"student-{secrets.token_hex(4)}"
    response = hub.start_server(username, {"image": "scikit-learn-1.5", "cpu": 1.5, "mem": "1G"})
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(username)
    (container,) = containers_with({"fgpu.user": username})
    yield username, container
    hub.stop_server(username)


def exec_text(container, command: str) -> str:
    result = container.exec_run(["sh", "-c", command])
    assert result.exit_code == 0, result.output
    return result.output.decode().strip()


def cgroup_limits(container) -> tuple[str, str]:
    """(cpu quota/period, memory limit) as the kernel shows them inside the container."""
    v2 = container.exec_run(["test", "-f", "/sys/fs/cgroup/cpu.max"]).exit_code == 0
    if v2:
        quota, period = exec_text(container, "cat /sys/fs/cgroup/cpu.max").split()
        return f"{quota}/{period}", exec_text(container, "cat /sys/fs/cgroup/memory.max")
    quota = exec_text(container, "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us")
    period = exec_text(container, "cat /sys/fs/cgroup/cpu/cpu.cfs_period_us")
    return f"{quota}/{period}", exec_text(
        container, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
    )


class TestOneSession:
    """Read-only checks on one running session."""

    def test_cgroup_shows_exactly_the_requested_slice(self, running_session):
        _, container = running_session
        assert cgroup_limits(container) == ("150000/100000", str(GIB))

    def test_container_is_locked_down_and_labelled(self, running_session):
        username, container = running_session
        host = container.attrs["HostConfig"]
        assert (host["CpuQuota"], host["CpuPeriod"]) == (150_000, 100_000)
        assert host["Memory"] == host["MemorySwap"] == GIB
        assert host["PidsLimit"] == 1024
        assert host["Privileged"] is False
        mounts = json.dumps(container.attrs["Mounts"]) + json.dumps(host.get("Binds") or [])
        assert "docker.sock" not in mounts
        assert exec_text(container, "id -u") == "1000"
        labels = container.labels
        assert labels["fgpu.user"] == username
        assert labels["fgpu.image"] == "scikit-learn-1.5"
        grant = json.loads(labels["fgpu.grant"])
        assert grant["session_id"] == labels["fgpu.session_id"] and grant["gpus"] == {}
        assert exec_text(container, "echo $FGPU_CPU $FGPU_MEM") == f"1.5 {GIB}"

    def test_the_chosen_image_holds_its_framework_version(self, running_session):
        _, container = running_session
        version = exec_text(container, "python -c 'import sklearn; print(sklearn.__version__)'")
        assert version == "1.5.2"

    @pytest.mark.parametrize("path", ["api/status", "lab", "tree", "tensorboard/"])
    def test_apps_answer_through_the_hub_proxy(self, hub, running_session, path):
        username, _ = running_session
        headers = {"Authorization": f"token {hub.user_token(username)}"}
        response = requests.get(f"{hub.url}/user/{username}/{path}", headers=headers, timeout=60)
        assert response.status_code == 200, (path, response.status_code, response.text[:300])

    def test_terminal_runs_commands_through_the_hub_proxy(self, hub, running_session):
        username, _ = running_session
        output = in_terminal(hub, username, "echo fgpu-$((6*7)) $(id -un)")
        assert "fgpu-42 jovyan" in output

    def test_jupyterlabs_resource_usage_reads_the_slice(self, hub, running_session):
        """jupyter-resource-usage's API, which JupyterLab's status bar polls, measures against the
        session's CPU_LIMIT and MEM_LIMIT."""
        username, _ = running_session
        headers = {"Authorization": f"token {hub.user_token(username)}"}
        url = f"{hub.url}/user/{username}/api/metrics/v1"
        response = requests.get(url, headers=headers, timeout=60)
        assert response.status_code == 200, response.text
        metrics = response.json()
        assert metrics["limits"]["memory"]["rss"] == GIB
        # In percent of one core, as it measures the use (1.5 cores = 150 %): it warns only
        # near the limit, not at any use (test_session_status shows the item).
        assert metrics["limits"]["cpu"] == {"cpu": 150.0, "warn": False}, metrics
        assert "cpu_percent" in metrics

    def test_the_terminal_is_the_images_environment(self, hub, running_session):
        """A terminal is a login shell, whose /etc/profile resets PATH: the framework image must
        still give it its own /opt/venv (python, pip, jupyter, tensorboard and the framework)."""
        username, _ = running_session
        command = (
            "command -v python pip jupyter tensorboard nvidia-smi; "
            "python -c 'import sys, sklearn; print(sys.prefix, sklearn.__version__)'"
        )
        lines = in_terminal(hub, username, command).splitlines()
        expected = [f"/opt/venv/bin/{tool}" for tool in ("python", "pip", "jupyter", "tensorboard")]
        assert [line for line in lines if line in expected] == expected, lines
        assert "/usr/local/bin/nvidia-smi" in lines
        assert "/opt/venv 1.5.2" in lines


def test_two_framework_versions_side_by_side(hub, username):
    """One user, two sessions at once, from the catalog's two scikit-learn releases."""
    versions = {"sk14": ("scikit-learn-1.4", "1.4.2"), "sk15": ("scikit-learn-1.5", "1.5.2")}
    for server, (image, _) in versions.items():
        options = {"image": image, "cpu": 0.5, "mem": "768M"}
        response = hub.start_server(username, options, server)
        assert response.status_code in (201, 202), response.text
    printed = {}
    for server in versions:
        hub.wait_ready(username, server)
        (container,) = containers_with({"fgpu.user": username, "fgpu.server_name": server})
        printed[server] = exec_text(
            container, "python -c 'import sklearn; print(sklearn.__version__)'"
        )
    assert printed == {server: version for server, (_, version) in versions.items()}
    for server in versions:
        hub.stop_server(username, server)


def test_stopping_the_server_removes_its_container(hub, username):
    response = hub.start_server(username, {"image": "python-3.11", "cpu": 0.5, "mem": "512M"})
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(username)
    assert len(containers_with({"fgpu.user": username})) == 1
    hub.stop_server(username)
    assert containers_with({"fgpu.user": username}) == []


#: Each with an image, so that the refusal is the value's own.
BAD_OPTIONS = [
    ({"image": "python-3.11", **bad}, message)
    for bad, message in [
        ({"cpu": -1}, "greater than zero"),
        ({"cpu": 0}, "greater than zero"),
        ({"cpu": "NaN"}, "finite"),
        ({"cpu": "two"}, "must be a number"),
        ({"cpu": 1000}, "limited to"),
        ({"mem": 0}, "greater than zero"),
        ({"mem": "-1G"}, "not a size"),
        ({"mem": "lots"}, "not a size"),
        ({"mem": "1T"}, "limited to"),
        ({"fgpu": -1}, "greater than zero"),
        ({"fgpu": 1}, "can never start"),
        ({"image": "no-such-image"}, "Unknown image"),
        ({"gpu_count": 2}, "Unknown option(s): gpu_count"),
    ]
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS, ids=lambda v: json.dumps(v))
def test_bad_input_is_a_400_and_leaves_nothing_behind(hub, username, options, message):
    response = hub.start_server(username, options)
    assert response.status_code == 400, response.text
    assert message in response.json()["message"]
    assert hub.server_model(username) is None
    assert containers_with({"fgpu.user": username}) == []


def test_container_exiting_early_names_image_and_exit_code(hub, username, broken_image):
    response = hub.start_server(username, {"image": "exits-early", "cpu": 0.5})
    assert response.status_code == 500, response.text
    message = response.json()["message"]
    assert broken_image in message and "exited with code 3" in message
    assert "boom" in message
    assert hub.server_model(username) is None
    assert containers_with({"fgpu.user": username}) == []


def test_image_missing_from_the_engine_is_not_offered(hub, username):
    """The catalog names it, the engine lacks it: the hub's form and REST path do not offer it
    (the queue service looks at the engine), and say which images they do offer."""
    response = hub.start_server(username, {"image": "never-built", "cpu": 0.5})
    assert response.status_code == 400, response.text
    message = response.json()["message"]
    assert "Unknown image 'never-built'. Available images: python-3.11" in message
    assert "never-built," not in message and "exits-early" in message
    assert containers_with({"fgpu.user": username}) == []


def test_an_unreachable_catalog_fails_the_spawn_clearly(tmp_path, docker_engine, username):
    """The spawner asks the queue service which images a user may start; without an answer it
    starts nothing and says why (no fallback to an unchecked list)."""
    dead = f"http://127.0.0.1:{free_port()}/services/queue/"
    extra = f"c.FGPUSpawner.queue_url = {dead!r}\n"
    with running_hub(tmp_path / "hub", extra_config=extra) as lonely:
        response = lonely.start_server(username, {"image": "python-3.11", "cpu": 0.5})
        assert response.status_code == 503, response.text
        assert "The image catalog is not available" in response.json()["message"]
        assert lonely.server_model(username) is None
        assert containers_with({"fgpu.user": username}) == []


def test_the_host_gpu_paths_are_config_and_reach_the_gpu_settings():
    config = Config()
    config.FGPUSpawner.hami_library_path = "/opt/hami/libvgpu.so"
    config.FGPUSpawner.hami_cache_base = "/srv/vgpu-cache"
    config.FGPUSpawner.mps_pipe_dir = "/run/mps"
    config.FGPUSpawner.hami_preload_path = "/etc/fgpu/ld.so.preload"
    config.FGPUSpawner.hami_shrreg_tool_path = "/opt/hami/shrreg-tool"
    paths = FGPUSpawner(config=config).gpu_paths
    grant = Grant("sess-9", "node-a", {"GPU-a": 0.5})
    hami = build_gpu_settings(grant, {"GPU-a": 2**34}, "hami", paths)
    sources = {mount["Source"]: mount["ReadOnly"] for mount in hami.mounts}
    assert sources == {
        "/opt/hami/libvgpu.so": True,
        "/etc/fgpu/ld.so.preload": True,
        "/opt/hami/shrreg-tool": True,
    }
    assert "/srv/vgpu-cache/sess-9" in hami.binds
    assert "/run/mps" in build_gpu_settings(grant, {"GPU-a": 2**34}, "mps", paths).binds


def test_a_stopped_hami_session_leaves_no_cache_folder(tmp_path):
    config = Config()
    config.FGPUSpawner.hami_cache_base = str(tmp_path)
    spawner = FGPUSpawner(config=config)
    grant = Grant("sess-10", "node-a", {"GPU-a": 0.5})
    # The cache folder, and the session's lock folder in it.
    cache, lock = sorted(
        path
        for path in build_gpu_settings(grant, {"GPU-a": 2**34}, "hami", spawner.gpu_paths).binds
        if path.startswith(str(tmp_path))
    )
    os.makedirs(lock)
    (tmp_path / "sess-10" / "cudevshr.cache").write_bytes(b"usage")
    spawner.remove_hami_cache("sess-10")
    assert not os.path.exists(cache)
    assert tmp_path.exists()


def test_a_hami_job_that_exited_by_itself_leaves_no_cache_folder(tmp_path):
    """A job whose container exited by itself is settled by the service (job_ends.py), and the
    hub, finding it exited, forgets the server without calling stop(): the post-stop hook, which
    the hub runs however a server ends, removes the cache folder. The site's own hook still runs,
    and a session of another GPU mode, or one stop() already cleared, touches nothing."""
    config = Config()
    config.FGPUSpawner.hami_cache_base = str(tmp_path / "vgpu")
    config.FGPUSpawner.gpu_sharing = "hami"
    hooked = []
    config.FGPUSpawner.post_stop_hook = lambda spawner: hooked.append(spawner.session_id)
    spawner = FGPUSpawner(config=config)
    spawner.session_id = "job12"  # its state, as the hub loaded it for the poll
    for name in ("job12", "other"):
        (tmp_path / "vgpu" / name).mkdir(parents=True)
        (tmp_path / "vgpu" / name / "cudevshr.cache").write_bytes(b"usage")
    spawner.run_post_stop_hook()
    assert not (tmp_path / "vgpu" / "job12").exists()
    assert (tmp_path / "vgpu" / "other" / "cudevshr.cache").exists()
    assert hooked == ["job12"]

    spawner.session_id = ""  # after stop(), whose clear_state ends it; stop() removed it
    spawner.run_post_stop_hook()
    assert (tmp_path / "vgpu" / "other").exists() and hooked == ["job12", ""]

    config.FGPUSpawner.gpu_sharing = "simulated"
    simulated = FGPUSpawner(config=config)
    simulated.session_id = "other"
    simulated.run_post_stop_hook()
    assert (tmp_path / "vgpu" / "other" / "cudevshr.cache").exists()


def test_a_hami_session_user_can_write_its_cache_and_the_lock_file():
    """The session (uid 1000, no capabilities) must create HAMi-core's shared-region file in its
    cache folder and open the lock file read-write; a folder the engine makes for a missing bind
    source is root's own and refuses both. Checked in a real container with the spawner's binds."""
    base = Path(tempfile.mkdtemp(prefix="fgpu-hami-test-"))
    base.chmod(0o755)  # pytest's own temporary folders are root's alone
    try:
        config = Config()
        config.FGPUSpawner.hami_cache_base = str(base / "vgpu")
        spawner = FGPUSpawner(config=config)
        spawner.prepare_hami_host_paths("sess-11")
        cache = base / "vgpu" / "sess-11"
        assert (cache.stat().st_uid, cache.stat().st_gid) == (1000, 100)
        assert oct(cache.stat().st_mode & 0o777) == "0o700"
        assert oct((cache / "vgpulock" / "lock").stat().st_mode & 0o777) == "0o666"
        spawner.prepare_hami_host_paths("sess-11")  # again: no error, nothing changes
        grant = Grant("sess-11", "node-a", {"GPU-a": 0.5})
        binds = build_gpu_settings(grant, {"GPU-a": 2**33}, "hami", spawner.gpu_paths).binds
        output = docker_client().containers.run(
            "fgpu/jupyter-base:py3.11",
            [
                "sh",
                "-c",
                "touch /usr/local/vgpu/cache/cudevshr.cache && : >>/tmp/vgpulock/lock && id -u",
            ],
            user="1000:100",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            network_mode="none",
            volumes=binds,
            remove=True,
        )
        assert output.decode().strip() == "1000"
        assert (cache / "cudevshr.cache").stat().st_uid == 1000
    finally:
        shutil.rmtree(base)


def test_the_preload_file_names_the_library_and_is_rewritten_only_when_wrong(tmp_path):
    config = Config()
    config.FGPUSpawner.hami_preload_path = str(tmp_path / "vgpu" / "ld.so.preload")
    spawner = FGPUSpawner(config=config)
    spawner.write_hami_preload_file()
    preload = tmp_path / "vgpu" / "ld.so.preload"
    assert preload.read_text() == "/usr/local/vgpu/libvgpu.so\n"
    assert oct(preload.stat().st_mode & 0o777) == "0o644"
    inode = preload.stat().st_ino
    spawner.write_hami_preload_file()
    assert preload.stat().st_ino == inode
    preload.write_text("/tmp/evil.so\n")
    spawner.write_hami_preload_file()
    assert preload.read_text() == "/usr/local/vgpu/libvgpu.so\n"
    assert sorted(p.name for p in preload.parent.iterdir()) == ["ld.so.preload"]


async def test_a_spawn_asked_to_cancel_or_just_ended_is_no_longer_pending():
    """The hub refuses a stop (500) while its spawner says pending. It clears its own flag a turn
    of its loop after the spawn ends, so a stop in that turn was refused (12 of 800 stops of
    waiting spawns at once, benchmarks/pending_spawns.py); so was one whose cancel took longer
    than the hub's one-second wait."""
    spawner = FGPUSpawner()
    waiting = asyncio.get_running_loop().create_future()
    spawner._spawn_pending = True
    spawner._spawn_future = asyncio.ensure_future(asyncio.wait_for(waiting, None))
    await asyncio.sleep(0)
    assert spawner.pending == "spawn"
    spawner._spawn_future.cancel()
    assert spawner.pending is None  # asked to cancel, not over yet
    spawner._spawn_future = asyncio.ensure_future(asyncio.sleep(0))
    await spawner._spawn_future
    assert spawner._spawn_pending and spawner.pending is None  # over; the hub's flag not cleared
    spawner._spawn_future = None
    assert spawner.pending == "spawn"  # no task to judge by: the hub's own word
