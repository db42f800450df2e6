"""The images' `nvidia-smi` stand-in (image_catalog/recipes/jupyter-base/nvidia_smi.py).

Run on the host with the environment the spawner's pure builder gives a `simulated` session, so the
two are tested together; then once in a real container of the base image.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from fgpu_admin.gpu_node import Gpu, parse_smi
from fgpu_spawner.gpu_sharing import build_gpu_settings
from fgpu_spawner.grant import Grant
from image_catalog.catalog import DEFAULT_CATALOG_PATH

from .harness import TEST_LABEL

SCRIPT = DEFAULT_CATALOG_PATH.parent / "recipes" / "jupyter-base" / "nvidia_smi.py"
BASE_IMAGE = "fgpu/jupyter-base:py3.11"
GIB = 1024**3
GPU = "GPU-sim-node1-0"
# The seeds' example: 0.5 fGPU at 2 units per GPU is a quarter of the GPU, which the queue grants.
QUARTER = Grant("sess-1", "node1", {GPU: 0.25})
SPANNING = Grant("sess-2", "node1", {"GPU-sim-node1-0": 1.0, "GPU-sim-node1-1": 0.5})
EIGHT_GIB = {GPU: 8 * GIB, "GPU-sim-node1-1": 8 * GIB}

_spec = importlib.util.spec_from_file_location("nvidia_smi", SCRIPT)
nvidia_smi = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nvidia_smi)


def session_env(grant: Grant, mode: str = "simulated") -> dict[str, str]:
    return build_gpu_settings(grant, EIGHT_GIB, mode).env


def run_script(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """The script as a session runs it, isolated from this process's environment."""
    command = [sys.executable, "-I", str(SCRIPT), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)


def test_the_table_shows_the_quarter_slice_of_an_8_gib_gpu_marked_simulated():
    result = run_script([], session_env(QUARTER))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "NVIDIA-SMI SIMULATED" in lines[2]
    (device,) = [line for line in lines if "Simulated GPU (8 GiB)" in line and "Off" in line]
    assert device.split()[1] == "0"  # the GPU index column
    assert "0MiB /   2048MiB" in result.stdout
    assert "25% of Simulated GPU (8 GiB): 2048 MiB of 8192 MiB, 25% of its SMs" in result.stdout
    # Every framed line is as wide as nvidia-smi's, so the layout reads like the real one.
    assert {len(line) for line in lines if line.startswith(("|", "+"))} == {89}


def test_query_gpu_csv_for_scripts():
    fields = "--query-gpu=name,memory.total,memory.used,index,uuid"
    result = run_script([fields, "--format=csv"], session_env(QUARTER))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "name, memory.total [MiB], memory.used [MiB], index, uuid",
        f"Simulated GPU (8 GiB), 2048 MiB, 0 MiB, 0, {GPU}",
    ]
    bare = run_script([fields, "--format=csv,noheader,nounits"], session_env(QUARTER))
    assert bare.stdout == f"Simulated GPU (8 GiB), 2048, 0, 0, {GPU}\n"


def test_list_and_selection_across_a_grant_spanning_two_gpus():
    env = session_env(SPANNING)
    assert run_script(["-L"], env).stdout.splitlines() == [
        "GPU 0: Simulated GPU (8 GiB) (UUID: GPU-sim-node1-0)",
        "GPU 1: Simulated GPU (8 GiB) (UUID: GPU-sim-node1-1)",
    ]
    query = ["--query-gpu", "index,memory.total", "--format", "csv,noheader,nounits"]
    assert run_script(query, env).stdout.splitlines() == ["0, 8192", "1, 4096"]
    assert run_script([*query, "-i", "1"], env).stdout == "1, 4096\n"
    table = run_script([], env).stdout
    assert "100% of Simulated GPU (8 GiB): 8192 MiB of 8192 MiB, 100% of its SMs" in table
    assert "50% of Simulated GPU (8 GiB): 4096 MiB of 8192 MiB, 50% of its SMs" in table


def test_tools_that_read_the_real_nvidia_smi_read_the_stand_in_alike():
    """The project's own reader of nvidia-smi (fgpu_admin/gpu_node.py, written against drivers
    470 to 570) finds the same GPU and slice in the stand-in's table and CSV."""
    env = session_env(SPANNING)
    expected = [
        Gpu(0, "Simulated GPU (8 GiB)", 8192, 0),
        Gpu(1, "Simulated GPU (8 GiB)", 4096, 0),
    ]
    assert parse_smi(run_script([], env).stdout).gpus == expected
    fields = "index,name,memory.total,memory.used,uuid"
    report = parse_smi(run_script([f"--query-gpu={fields}", "--format=csv"], env).stdout)
    assert [(g.index, g.memory_total_mib, g.uuid) for g in report.gpus] == [
        (0, 8192, "GPU-sim-node1-0"),
        (1, 4096, "GPU-sim-node1-1"),
    ]


@pytest.mark.parametrize("args", [[], ["-L"], ["--query-gpu=name", "--format=csv"]])
def test_a_session_without_a_gpu_is_told_so_as_nvidia_smi_would(args):
    result = run_script(args, session_env(Grant("sess-3", "node1")))
    assert (result.returncode, result.stdout) == (6, "No devices were found\n")
    assert "holds no GPU" in result.stderr


def test_outside_simulated_mode_without_the_drivers_nvidia_smi_there_is_no_device():
    # A hami session is given the driver's nvidia-smi by the NVIDIA runtime; the slice variables
    # alone must not make the stand-in pretend to be it.
    env = session_env(QUARTER, mode="hami")
    assert nvidia_smi.run([], env)[0] == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--query-gpu=name,temperature.gpu", "--format=csv"], 'Field "temperature.gpu"'),
        (["--query-gpu=name"], "--format"),
        (["-q"], "Invalid combination of input arguments"),
        (["--query-gpu"], "Invalid combination of input arguments"),
    ],
)
def test_what_it_cannot_answer_is_exit_code_2_with_nvidia_smis_message(args, message):
    code, text = nvidia_smi.run(args, session_env(QUARTER))
    assert code == 2 and message in text


@pytest.mark.parametrize(
    ("limit", "mib"),
    [("2048m", 2048), ("2g", 2048), ("1048576k", 1024), ("3221225472", 3072), ("", 99)],
)
def test_memory_limits_in_hamis_syntax(limit, mib):
    # HAMi-core takes a binary k/m/g suffix or bytes; no limit falls back to the whole GPU (99).
    assert nvidia_smi._mib(limit, 99) == mib


# --- a real container of the base image ------------------------------------------------------


def run_in_image(docker_engine, script: str, env: dict[str, str], user: str = "1000:100") -> str:
    output = docker_engine.containers.run(
        BASE_IMAGE,
        ["bash", "-lc", script],
        environment=env,
        user=user,
        remove=True,
        labels={TEST_LABEL: "nvidia-smi"},
    )
    return output.decode()


@pytest.mark.docker
def test_in_the_image_it_is_on_the_login_path_and_shows_the_slice(docker_engine):
    script = (
        "command -v nvidia-smi; "
        "nvidia-smi --query-gpu=name,memory.total,index --format=csv,noheader; nvidia-smi"
    )
    output = run_in_image(docker_engine, script, session_env(QUARTER)).splitlines()
    assert output[:2] == ["/usr/local/bin/nvidia-smi", "Simulated GPU (8 GiB), 2048 MiB, 0"]
    assert any("NVIDIA-SMI SIMULATED" in line for line in output)


@pytest.mark.docker
def test_in_the_image_it_hands_over_to_the_drivers_nvidia_smi_outside_simulated_mode(
    docker_engine,
):
    # Where the NVIDIA runtime mounts the real one; root only to put a fake one there.
    fake = "printf '#!/bin/sh\\necho driver nvidia-smi \"$@\"\\n' > /usr/bin/nvidia-smi"
    script = f"{fake} && chmod +x /usr/bin/nvidia-smi && nvidia-smi -L"
    assert run_in_image(docker_engine, script, session_env(QUARTER, "hami"), user="root") == (
        "driver nvidia-smi -L\n"
    )
    simulated = run_in_image(docker_engine, script, session_env(QUARTER), user="root")
    assert simulated == f"GPU 0: Simulated GPU (8 GiB) (UUID: {GPU})\n"
