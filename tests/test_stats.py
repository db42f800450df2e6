"""Live stats: the pure arithmetic on recorded answers, then a real container sampled on the engine."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from queue_service.engine.session_containers import SESSION_LABEL
from queue_service.engine.stats import (
    GpuUse,
    StatsSampler,
    container_id_of_cgroup,
    containers_of_pids,
    cpu_percent,
    cpu_times,
    gpu_use_by_container,
    latest_per_pid,
    memory,
    read_nvml_processes,
)

from .harness import TEST_LABEL, remove_containers

CONTAINER_ID = "fa2fd6a207176ff101e9a437c81cbf20f95546ec79a7136a288600860c728445"

#: A one-shot answer of dockerd 20.10 on cgroup v1 (trimmed): no precpu_stats.
V1_STATS = {
    "cpu_stats": {
        "cpu_usage": {"total_usage": 43253988, "percpu_usage": [38312004, 4941984]},
        "system_cpu_usage": 6972220000000,
        "online_cpus": 2,
    },
    "precpu_stats": {"cpu_usage": {"total_usage": 0}},
    "memory_stats": {
        "usage": 9_089_536,
        "stats": {"cache": 4_000_000, "total_inactive_file": 1_000_000},
        "limit": 268435456,
    },
}
#: The same fields as cgroup v2 reports them.
V2_STATS = {
    "cpu_stats": {"cpu_usage": {"total_usage": 5_000}, "system_cpu_usage": 10_000},
    "memory_stats": {"usage": 5_000_000, "stats": {"inactive_file": 2_000_000}, "limit": 1 << 30},
}


def test_cpu_times_of_a_one_shot_answer():
    assert cpu_times(V1_STATS) == (43253988, 6972220000000, 2)
    # No online_cpus: one core per percpu entry, or one.
    assert cpu_times(V2_STATS) == (5_000, 10_000, 1)
    assert cpu_times({"cpu_stats": {}}) is None


def test_cpu_percent_is_docker_s_formula_between_two_samples():
    # Half of the host's CPU time on a 2-CPU host: one core busy, 100 %.
    assert cpu_percent((1_000, 10_000, 2), (6_000, 20_000, 2)) == 100.0
    assert cpu_percent((0, 0, 4), (1_000, 4_000, 4)) == 100.0
    assert cpu_percent(None, (1, 2, 2)) is None
    # A restarted container's counter goes back; the host's did not move: no figure, not garbage.
    assert cpu_percent((9_000, 10_000, 2), (1_000, 20_000, 2)) is None
    assert cpu_percent((1_000, 10_000, 2), (2_000, 10_000, 2)) is None


def test_memory_leaves_out_the_inactive_page_cache():
    assert memory(V1_STATS) == (8_089_536, 268435456)
    assert memory(V2_STATS) == (3_000_000, 1 << 30)
    assert memory({"memory_stats": {"usage": 10, "stats": {"cache": 4}, "limit": 100}}) == (6, 100)
    assert memory({}) == (0, 0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"12:memory:/docker/{CONTAINER_ID}\n11:cpu:/docker/{CONTAINER_ID}\n", CONTAINER_ID),
        (f"0::/system.slice/docker-{CONTAINER_ID}.scope\n", CONTAINER_ID),
        ("0::/user.slice/user-1000.slice/session-2.scope\n", None),
        ("12:memory:/\n", None),
    ],
)
def test_the_container_of_a_process_comes_from_its_cgroup(text, expected):
    assert container_id_of_cgroup(text) == expected


def test_gpu_use_is_summed_per_container():
    owner = {10: "c1", 11: "c1", 20: "c2"}
    processes = [(10, 1_000), (11, 500), (20, 2_000), (99, 7_000)]  # 99: not in a container
    utilisation = [(10, 30), (11, 20), (99, 80)]
    assert gpu_use_by_container(processes, utilisation, owner) == {
        "c1": GpuUse(1_500, 50.0),
        "c2": GpuUse(2_000, 0.0),
    }


def test_only_the_newest_nvml_sample_of_a_process_counts():
    samples = [(10, 100, 90.0), (10, 300, 20.0), (10, 200, 70.0), (11, 50, 5.0)]
    assert sorted(latest_per_pid(samples)) == [(10, 20.0), (11, 5.0)]


def test_without_a_gpu_there_are_no_gpu_figures():
    # This machine has no NVIDIA driver: NVML's library is missing, and that is not an error.
    assert read_nvml_processes() is None


def test_a_process_outside_any_container_has_no_container(tmp_path):
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(f"0::/system.slice/docker-{CONTAINER_ID}.scope\n")
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "cgroup").write_text("0::/init.scope\n")
    assert containers_of_pids([7, 8, 9], proc=tmp_path) == {7: CONTAINER_ID}


# -- a real container ------------------------------------------------------------------------------


@pytest.fixture
def busy_session(docker_engine):
    """A container labelled as a session, keeping one core busy, limited to 256 MiB."""
    run, session_id = secrets.token_hex(6), secrets.token_hex(16)
    container = docker_engine.containers.run(
        "fgpu/jupyter-base:py3.11",
        ["sh", "-c", "while :; do :; done"],
        detach=True,
        mem_limit="256m",
        labels={SESSION_LABEL: session_id, TEST_LABEL: run},
    )
    # A container of another hub on the same engine, which must never be sampled.
    docker_engine.containers.run(
        "fgpu/jupyter-base:py3.11",
        ["sleep", "300"],
        detach=True,
        labels={SESSION_LABEL: secrets.token_hex(16), TEST_LABEL: run},
    )
    yield session_id, container
    remove_containers({TEST_LABEL: run})


@pytest.mark.docker
async def test_a_running_session_is_sampled_once_per_round(docker_engine, busy_session):
    session_id, _ = busy_session
    sampler = StatsSampler(docker_engine, lambda: {session_id}, read_gpus=True)

    await sampler.sample()
    first = sampler.usage(session_id)
    # One list and one stats call: the other hub's container cost nothing.
    assert sampler.engine_calls == 2
    assert first["cpu_percent"] is None  # a rate needs two samples
    await asyncio.sleep(1.5)
    await sampler.sample()
    usage = sampler.usage(session_id)

    print(f"busy container: {usage}")
    assert sampler.engine_calls == 4
    # One busy loop; idle is near 0. Other work on a loaded 2-core host can take most of a core.
    assert usage["cpu_percent"] > 10
    assert 0 < usage["mem_bytes"] < usage["mem_limit_bytes"] == 256 * 1024**2
    assert usage["gpu_mem_bytes"] is None and usage["gpu_util_percent"] is None
    assert usage["sampled_at"] > first["sampled_at"]
    assert len(sampler._usage) == 1


@pytest.mark.docker
async def test_nothing_running_costs_the_engine_nothing(docker_engine, busy_session):
    session_id, container = busy_session
    running = {session_id}
    sampler = StatsSampler(docker_engine, lambda: set(running))
    await sampler.sample()
    calls = sampler.engine_calls
    running.clear()  # the session ended
    for _ in range(3):
        await sampler.sample()
        assert sampler.usage(session_id) is None
    assert sampler.engine_calls == calls
