import docker
import pytest
from docker.types import Mount

from fgpu_spawner.gpu_sharing import (
    MODES,
    GpuPaths,
    GpuSettings,
    build_gpu_settings,
    hami_preload_text,
    session_command,
)
from fgpu_spawner.grant import Grant

GIB = 1024**3
MEMORY = {"GPU-a": 16 * GIB, "GPU-b": 16 * GIB}
ONE_AND_A_HALF = Grant("sess-1", "node1", {"GPU-a": 1.0, "GPU-b": 0.5})
QUARTER = Grant("sess-2", "node1", {"GPU-a": 0.25})

HAMI_BINDS_SESS_2 = {
    "/var/lib/fgpu-hub/vgpu/sess-2": {"bind": "/usr/local/vgpu/cache", "mode": "rw"},
    # The session's own lock folder, never the host's /tmp/vgpulock: no session can hold the
    # lock another session's GPU start-up waits for.
    "/var/lib/fgpu-hub/vgpu/sess-2/vgpulock": {"bind": "/tmp/vgpulock", "mode": "rw"},
}
# Read-only bind mounts, which the engine refuses when the host file is missing (fail closed).
HAMI_MOUNTS = [
    Mount("/usr/local/vgpu/libvgpu.so", "/usr/local/lib/libvgpu.so", "bind", read_only=True),
    Mount("/etc/ld.so.preload", "/var/lib/fgpu-hub/ld.so.preload", "bind", read_only=True),
    Mount("/usr/local/vgpu/shrreg-tool", "/usr/local/lib/hami-shrreg-tool", "bind", read_only=True),
]
# HAMi-core's default region path leads to the session's region, HAMi-core's tool creates that
# region from the spawner's limits, then the command runs.
HAMI_PREFIX = [
    "/bin/sh",
    "-c",
    "ln -sfn /usr/local/vgpu/cache/cudevshr.cache /tmp/cudevshr.cache"
    ' && "$0" --create_new && exec "$@"',
    "/usr/local/vgpu/shrreg-tool",
]


def request_for(*uuids):
    return [{"driver": "nvidia", "device_ids": list(uuids), "capabilities": [["gpu"]]}]


# --- hami -----------------------------------------------------------------------------------------


def test_hami_one_and_a_half_gpus():
    settings = build_gpu_settings(ONE_AND_A_HALF, MEMORY, "hami")
    assert settings == GpuSettings(
        env={
            "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_DEVICE_MEMORY_LIMIT_0": "16384m",
            "CUDA_DEVICE_SM_LIMIT_0": "100",
            "CUDA_DEVICE_MEMORY_LIMIT_1": "8192m",
            "CUDA_DEVICE_SM_LIMIT_1": "50",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache/cudevshr.cache",
        },
        device_requests=request_for("GPU-a", "GPU-b"),
        binds={
            "/var/lib/fgpu-hub/vgpu/sess-1": {"bind": "/usr/local/vgpu/cache", "mode": "rw"},
            "/var/lib/fgpu-hub/vgpu/sess-1/vgpulock": {"bind": "/tmp/vgpulock", "mode": "rw"},
        },
        labels={"fgpu.gpu_sharing": "hami"},
        mounts=HAMI_MOUNTS,
        command_prefix=HAMI_PREFIX,
    )


def test_hami_core_is_preloaded_by_the_loader_not_by_the_environment():
    """/etc/ld.so.preload, a read-only bind of a host file naming the library: no variable to
    unset, nothing the session user can rewrite."""
    settings = build_gpu_settings(QUARTER, MEMORY, "hami")
    preload = next(m for m in settings.mounts if m["Target"] == "/etc/ld.so.preload")
    assert preload["Source"] == "/var/lib/fgpu-hub/ld.so.preload"
    assert (preload["Type"], preload["ReadOnly"]) == ("bind", True)
    library = next(m for m in settings.mounts if m["Source"] == "/usr/local/lib/libvgpu.so")
    assert hami_preload_text() == f"{library['Target']}\n"
    assert library["ReadOnly"] is True
    assert not any(name.startswith("LD_") for name in settings.env)
    # Not a -v bind: for a missing host path that would make an empty folder and start unlimited.
    assert not any("libvgpu" in path or "preload" in path for path in settings.binds)


def test_hami_quarter_gpu():
    settings = build_gpu_settings(QUARTER, MEMORY, "hami")
    assert settings.env == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a",
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CUDA_DEVICE_SM_LIMIT_0": "25",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache/cudevshr.cache",
    }
    assert settings.device_requests == request_for("GPU-a")
    assert settings.binds == HAMI_BINDS_SESS_2
    assert settings.mounts == HAMI_MOUNTS


def test_hami_limits_follow_the_container_device_order_not_the_grant_order():
    grant = Grant("sess-3", "node1", {"GPU-b": 0.5, "GPU-a": 1.0})
    settings = build_gpu_settings(grant, MEMORY, "hami", gpu_order=["GPU-a", "GPU-b", "GPU-c"])
    assert settings.device_requests == request_for("GPU-a", "GPU-b")
    assert settings.env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "16384m"
    assert settings.env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "8192m"
    assert settings.env["CUDA_DEVICE_SM_LIMIT_1"] == "50"


def test_hami_memory_is_floored_to_whole_mib_and_never_zero():
    fifth = build_gpu_settings(Grant("s", "n", {"GPU-a": 0.2}), MEMORY, "hami").env
    # 0.2 × 16 GiB = 3276.8 MiB: the slice never rounds up past its share.
    assert fifth["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3276m"
    assert fifth["CUDA_DEVICE_SM_LIMIT_0"] == "20"
    tiny = build_gpu_settings(Grant("s", "n", {"GPU-a": 0.001}), {"GPU-a": 512 * 1024}, "hami")
    # HAMi-core reads 0 as "no limit", so the smallest slice is 1 MiB and 1%.
    assert tiny.env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1m"
    assert tiny.env["CUDA_DEVICE_SM_LIMIT_0"] == "1"


def test_hami_uses_the_configured_host_paths():
    paths = GpuPaths(
        hami_library_path="/opt/hami/libvgpu.so",
        hami_cache_base="/srv/vgpu/",
        hami_lock_dir="/run/vgpulock",
        hami_preload_path="/etc/fgpu/ld.so.preload",
        hami_shrreg_tool_path="/opt/hami/shrreg-tool",
    )
    settings = build_gpu_settings(QUARTER, MEMORY, "hami", paths=paths)
    assert settings.binds == {
        "/srv/vgpu/sess-2": {"bind": "/usr/local/vgpu/cache", "mode": "rw"},
        "/srv/vgpu/sess-2/vgpulock": {"bind": "/run/vgpulock", "mode": "rw"},
    }
    assert {m["Source"]: m["Target"] for m in settings.mounts} == {
        "/opt/hami/libvgpu.so": "/usr/local/vgpu/libvgpu.so",
        "/etc/fgpu/ld.so.preload": "/etc/ld.so.preload",
        "/opt/hami/shrreg-tool": "/usr/local/vgpu/shrreg-tool",
    }


def test_hami_session_command_runs_behind_the_region_creating_prefix():
    settings = build_gpu_settings(QUARTER, MEMORY, "hami")
    command = session_command(["jupyterhub-singleuser", "--debug"], settings)
    assert command == [*HAMI_PREFIX, "jupyterhub-singleuser", "--debug"]


def test_hami_prefix_without_a_command_to_hand_over_to_is_refused():
    settings = build_gpu_settings(QUARTER, MEMORY, "hami")
    with pytest.raises(ValueError, match="needs the session's command"):
        session_command([], settings)


@pytest.mark.parametrize("mode", ["mps", "none", "simulated"])
def test_other_modes_leave_the_command_alone(mode):
    settings = build_gpu_settings(QUARTER, MEMORY, mode)
    assert settings.command_prefix == []
    assert session_command(["jupyterhub-singleuser"], settings) == ["jupyterhub-singleuser"]


@pytest.mark.parametrize("session_id", ["..", "../etc", "a/b", "", ".hidden"])
def test_a_session_id_cannot_climb_out_of_the_cache_base(session_id):
    with pytest.raises(ValueError, match="cannot name a cache directory"):
        build_gpu_settings(Grant(session_id, "n", {"GPU-a": 0.5}), MEMORY, "hami")


# --- mps ------------------------------------------------------------------------------------------


def test_mps_one_and_a_half_gpus_takes_the_fractions_thread_share():
    settings = build_gpu_settings(ONE_AND_A_HALF, MEMORY, "mps")
    assert settings == GpuSettings(
        env={
            "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b",
            "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "GPU-a=16384M,GPU-b=8192M",
            "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        },
        device_requests=request_for("GPU-a", "GPU-b"),
        binds={"/tmp/nvidia-mps": {"bind": "/tmp/nvidia-mps", "mode": "rw"}},
        labels={"fgpu.gpu_sharing": "mps"},
    )


def test_mps_quarter_gpu_with_a_configured_pipe_directory():
    settings = build_gpu_settings(QUARTER, MEMORY, "mps", paths=GpuPaths(mps_pipe_dir="/run/mps"))
    assert settings.env == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a",
        "CUDA_VISIBLE_DEVICES": "GPU-a",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "GPU-a=4096M",
        "CUDA_MPS_PIPE_DIRECTORY": "/run/mps",
    }
    assert settings.binds == {"/run/mps": {"bind": "/run/mps", "mode": "rw"}}
    assert settings.device_requests == request_for("GPU-a")


# --- none -----------------------------------------------------------------------------------------


def test_none_requests_whole_devices_without_limits():
    settings = build_gpu_settings(ONE_AND_A_HALF, {}, "none")
    assert settings == GpuSettings(
        env={
            "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b",
            "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        },
        device_requests=request_for("GPU-a", "GPU-b"),
        binds={},
        labels={"fgpu.gpu_sharing": "none"},
    )
    assert build_gpu_settings(QUARTER, {}, "none").device_requests == request_for("GPU-a")


# --- mig -----------------------------------------------------------------------------------------

MIG_A = "MIG-4f1c3e2a-0b5d-5e6f-8a9b-1c2d3e4f5a6b"
MIG_B = "MIG-9e8d7c6b-5a4f-5e3d-8c2b-1a0f9e8d7c6b"


def test_mig_requests_whole_instances_and_nothing_else():
    settings = build_gpu_settings(Grant("sess-5", "node1", {MIG_A: 1.0, MIG_B: 1.0}), {}, "mig")
    assert settings == GpuSettings(
        env={
            "NVIDIA_VISIBLE_DEVICES": f"{MIG_A},{MIG_B}",
            "CUDA_VISIBLE_DEVICES": f"{MIG_A},{MIG_B}",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        },
        device_requests=request_for(MIG_A, MIG_B),
        binds={},
        labels={"fgpu.gpu_sharing": "mig"},
    )


def test_mig_never_shares_an_instance():
    # Two sessions in one instance would have no limit between them: refused, not started.
    with pytest.raises(ValueError, match="a MIG instance is given whole"):
        build_gpu_settings(Grant("sess-6", "node1", {MIG_A: 0.5}), {}, "mig")


def test_mig_refuses_a_whole_card_labelled_by_mistake():
    with pytest.raises(ValueError, match="GPU-a is not a MIG instance"):
        build_gpu_settings(Grant("sess-7", "node1", {"GPU-a": 1.0}), {}, "mig")


# --- simulated ------------------------------------------------------------------------------------


def test_simulated_requests_no_device_but_shows_the_limits_and_the_grant():
    settings = build_gpu_settings(ONE_AND_A_HALF, MEMORY, "simulated")
    assert settings.device_requests == []
    assert settings.binds == {}
    assert settings.mounts == []
    assert settings.labels == {"fgpu.gpu_sharing": "simulated"}
    assert settings.env == {
        "NVIDIA_VISIBLE_DEVICES": "void",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "16384m",
        "CUDA_DEVICE_SM_LIMIT_0": "100",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "8192m",
        "CUDA_DEVICE_SM_LIMIT_1": "50",
        "FGPU_SIMULATED": "1",
        "FGPU_GRANT": ONE_AND_A_HALF.to_json(),
        # What the image's nvidia-smi stand-in shows besides the slice: the GPUs themselves.
        "FGPU_GPU_UUID_0": "GPU-a",
        "FGPU_GPU_NAME_0": "Simulated GPU (16 GiB)",
        "FGPU_GPU_MEMORY_MIB_0": "16384",
        "FGPU_GPU_UUID_1": "GPU-b",
        "FGPU_GPU_NAME_1": "Simulated GPU (16 GiB)",
        "FGPU_GPU_MEMORY_MIB_1": "16384",
    }
    assert Grant.from_json(settings.env["FGPU_GRANT"]) == ONE_AND_A_HALF


def test_simulated_quarter_gpu():
    env = build_gpu_settings(QUARTER, MEMORY, "simulated").env
    assert env == {
        "NVIDIA_VISIBLE_DEVICES": "void",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CUDA_DEVICE_SM_LIMIT_0": "25",
        "FGPU_SIMULATED": "1",
        "FGPU_GRANT": QUARTER.to_json(),
        "FGPU_GPU_UUID_0": "GPU-a",
        "FGPU_GPU_NAME_0": "Simulated GPU (16 GiB)",
        "FGPU_GPU_MEMORY_MIB_0": "16384",
    }


def test_simulated_half_fgpu_of_an_8_gib_gpu_at_two_units_per_gpu_is_2_gib():
    """The seeds' check: 0.5 fGPU with 2 units per GPU is a quarter of the GPU (the queue grants
    the fraction), so 2 GiB of 8 GiB and 25% of the SMs, as nvidia-smi then shows."""
    grant = Grant("sess-3", "node1", {"GPU-sim-node1-0": 0.25})
    env = build_gpu_settings(grant, {"GPU-sim-node1-0": 8 * GIB}, "simulated").env
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"
    assert env["CUDA_DEVICE_SM_LIMIT_0"] == "25"
    assert env["FGPU_GPU_NAME_0"] == "Simulated GPU (8 GiB)"
    assert env["FGPU_GPU_MEMORY_MIB_0"] == "8192"


def test_simulated_devices_follow_the_nodes_gpu_order():
    grant = Grant("sess-5", "node1", {"GPU-b": 0.5, "GPU-a": 1.0})
    env = build_gpu_settings(grant, MEMORY, "simulated", gpu_order=["GPU-a", "GPU-b"]).env
    assert (env["FGPU_GPU_UUID_0"], env["FGPU_GPU_UUID_1"]) == ("GPU-a", "GPU-b")
    assert (env["CUDA_DEVICE_SM_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT_1"]) == ("100", "50")


# --- common ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_grant_without_gpus_gets_no_gpu(mode):
    settings = build_gpu_settings(Grant("sess-4", "node1"), {}, mode)
    # Only the guard that keeps an image's NVIDIA_VISIBLE_DEVICES=all from reaching a GPU.
    assert settings == GpuSettings(
        env={"NVIDIA_VISIBLE_DEVICES": "void"},
        device_requests=[],
        binds={},
        labels={"fgpu.gpu_sharing": mode},
    )


@pytest.mark.parametrize("mode", ["hami", "mps", "none"])
def test_device_requests_are_valid_docker_py_kwargs(mode):
    [kwargs] = build_gpu_settings(ONE_AND_A_HALF, MEMORY, mode).device_requests
    request = docker.types.DeviceRequest(**kwargs)
    assert request["Driver"] == "nvidia"
    assert request["DeviceIDs"] == ["GPU-a", "GPU-b"]
    assert request["Capabilities"] == [["gpu"]]
    assert request["Count"] == 0


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="Unknown gpu_sharing mode 'vgpu'"):
        build_gpu_settings(QUARTER, MEMORY, "vgpu")


@pytest.mark.parametrize("mode", ["hami", "mps", "simulated"])
def test_a_gpu_of_unknown_memory_cannot_be_sliced(mode):
    with pytest.raises(ValueError, match="No memory size known for granted GPU GPU-a"):
        build_gpu_settings(QUARTER, {"GPU-b": 16 * GIB}, mode)


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5])
def test_impossible_fractions_are_refused(fraction):
    with pytest.raises(ValueError, match="must be in"):
        build_gpu_settings(Grant("s", "n", {"GPU-a": fraction}), MEMORY, "hami")


def test_a_granted_gpu_missing_from_the_node_order_is_refused():
    with pytest.raises(ValueError, match="not in the node's GPU order"):
        build_gpu_settings(ONE_AND_A_HALF, MEMORY, "hami", gpu_order=["GPU-a"])
