"""`scripts/gpu-node`, as far as it runs on a machine without a GPU.

Every run points the script at a temporary root (`--root DIR`), so that no test reads or writes
the machine's /etc. What is not run here, for want of a GPU, an NVIDIA driver and a registry:
installing the NVIDIA container toolkit, restarting dockerd with it, building HAMi-core, and the
self-check's CUDA container. Past the driver check, the script is run with a stand-in
`nvidia-smi` that replays what a real driver printed (tests/test_gpu_node.py's sample).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fgpu_spawner.gpu_sharing import GpuPaths, hami_preload_text

from .harness import ROOT
from .test_gpu_node import CSV_NOHEADER_NOUNITS

SCRIPT = ROOT / "scripts" / "gpu-node"
DEBIAN_12 = (
    'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\n'
    'VERSION_ID="12"\nVERSION_CODENAME=bookworm\nID=debian\n'
)


def path_without_nvidia_smi() -> str:
    """This machine's PATH, less any folder that holds an nvidia-smi."""
    folders = os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    return os.pathsep.join(f for f in folders if not (Path(f) / "nvidia-smi").exists())


def run(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path or path_without_nvidia_smi()}
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file and folder under `root`: mode, and content for files."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            relative = str(path.relative_to(root))
            content = path.read_bytes() if path.is_file() else None
            found[relative] = (path.stat().st_mode, content)
    return found


@pytest.fixture
def node_root(tmp_path) -> Path:
    """A root with Debian 12's os-release and a site's daemon.json."""
    root = tmp_path / "root"
    (root / "etc" / "docker").mkdir(parents=True)
    (root / "etc" / "os-release").write_text(DEBIAN_12)
    (root / "etc" / "docker" / "daemon.json").write_text(
        json.dumps({"log-driver": "json-file", "log-opts": {"max-size": "10m"}, "icc": True})
    )
    return root


@pytest.fixture
def stand_in_driver(tmp_path) -> str:
    """A PATH whose nvidia-smi prints what a real 535 driver printed for the script's query."""
    folder = tmp_path / "driver-bin"
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s' '{CSV_NOHEADER_NOUNITS}'\n")
    smi.chmod(0o755)
    return f"{folder}{os.pathsep}{path_without_nvidia_smi()}"


def test_help_lists_every_option_and_exits_0():
    result = run("--help")
    assert result.returncode == 0
    for option in ("--check-only", "--hami-version", "--yes", "--root", "--build-in", "--image"):
        assert option in result.stdout
    assert result.stderr == ""


def test_the_script_defaults_are_the_spawners_paths():
    """The files the script installs are where FGPUSpawner looks for them by default."""
    help_text = run("--help").stdout
    defaults = GpuPaths()
    for path in (
        defaults.hami_library_path,
        defaults.hami_preload_path,
        defaults.hami_shrreg_tool_path,
        defaults.hami_lock_dir,
        defaults.hami_cache_base,
    ):
        assert f"(default {path})" in help_text


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bogus"], "unknown argument: --bogus"),
        (["--root"], "--root needs a value"),
        (["--root", "--yes"], "--root needs a value"),
        (["--hami-version", "v9.9"], "unknown --hami-version 'v9.9'; known: v2.8.0"),
        (["--hami-version", "5091a2f"], "unknown --hami-version '5091a2f'"),
        (["--build-in", "vm"], "--build-in is docker or host, not 'vm'"),
        (["--library-path", "lib/libvgpu.so"], "'lib/libvgpu.so' is not an absolute path"),
        (["--root", "/no/such/folder"], "--root /no/such/folder is not a directory"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(args, message):
    result = run(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert message in line and line.startswith("[gpu-node] error: ")


def test_without_nvidia_smi_it_stops_at_the_driver_check_and_changes_nothing(node_root):
    before = snapshot(node_root)
    result = run("--root", str(node_root), "--yes")
    assert result.returncode == 3
    assert "ok: system: Debian GNU/Linux 12 (bookworm)" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "no NVIDIA driver: nvidia-smi is not on PATH" in last
    assert "Nothing was changed" in last
    assert snapshot(node_root) == before


def test_check_only_without_a_driver_stops_the_same_way(node_root):
    before = snapshot(node_root)
    result = run("--root", str(node_root), "--check-only")
    assert result.returncode == 3 and "no NVIDIA driver" in result.stderr
    assert snapshot(node_root) == before


def test_a_system_that_is_not_debian_or_ubuntu_is_refused_before_anything(
    node_root, stand_in_driver
):
    (node_root / "etc" / "os-release").write_text(
        'ID=fedora\nVERSION_ID=40\nPRETTY_NAME="Fedora Linux 40"\n'
    )
    before = snapshot(node_root)
    result = run("--root", str(node_root), path=stand_in_driver)
    assert result.returncode == 3
    assert "Fedora Linux 40 is not Debian or Ubuntu" in result.stderr
    assert "nothing was changed" in result.stderr
    assert snapshot(node_root) == before


def test_a_driver_older_than_the_minimum_stops_the_script(node_root, tmp_path):
    folder = tmp_path / "old-driver"
    folder.mkdir()
    (folder / "nvidia-smi").write_text(
        "#!/bin/sh\necho '0, GPU-a, 32510, Tesla V100-SXM2-32GB, 470.82.01'\n"
    )
    (folder / "nvidia-smi").chmod(0o755)
    before = snapshot(node_root)
    result = run("--root", str(node_root), path=f"{folder}{os.pathsep}{path_without_nvidia_smi()}")
    assert result.returncode == 3
    assert "the NVIDIA driver is 470.82.01; CUDA 12 sessions need 525.60.13" in result.stderr
    assert snapshot(node_root) == before


def test_a_driver_that_does_not_answer_stops_the_script(node_root, tmp_path):
    folder = tmp_path / "broken-driver"
    folder.mkdir()
    message = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    (folder / "nvidia-smi").write_text(f'#!/bin/sh\necho "{message}"\nexit 9\n')
    (folder / "nvidia-smi").chmod(0o755)
    result = run("--root", str(node_root), path=f"{folder}{os.pathsep}{path_without_nvidia_smi()}")
    assert result.returncode == 3
    assert "the NVIDIA driver is not working" in result.stderr and message in result.stderr
    assert "-- nothing was changed." in result.stderr


def test_check_only_lists_what_is_not_done_and_changes_nothing(node_root, stand_in_driver):
    before = snapshot(node_root)
    result = run("--root", str(node_root), "--check-only", path=stand_in_driver)
    assert result.returncode == 1
    not_done = [line for line in result.stderr.splitlines() if "NOT DONE" in line]
    joined = "\n".join(not_done)
    assert "NVIDIA container toolkit is not installed" in joined or shutil.which("nvidia-ctk")
    assert '"default-runtime" is null, not "nvidia"' in joined
    assert '"no-new-privileges" is unset, not true' in joined
    assert '"icc" is true, not false' in joined
    assert "HAMi-core 5091a2fbe1816df1265490f771346730f29e2c8d (v2.9.0) is not at" in joined
    assert "/var/lib/fgpu-hub/ld.so.preload does not name /usr/local/vgpu/libvgpu.so" in joined
    assert "HAMi-core's shrreg-tool is not at /usr/local/lib/hami-shrreg-tool" in joined
    assert "8192 MiB NVIDIA GeForce RTX 3070" in result.stderr
    assert snapshot(node_root) == before


def test_a_staged_run_installs_the_files_and_a_second_run_changes_nothing(
    node_root, stand_in_driver
):
    first = run("--root", str(node_root), path=stand_in_driver)
    assert first.returncode == 0, first.stderr
    daemon = json.loads((node_root / "etc/docker/daemon.json").read_text())
    # The site's keys are kept; the two settings are set (the NVIDIA runtime needs nvidia-ctk,
    # which is not here).
    assert daemon == {
        "log-driver": "json-file",
        "log-opts": {"max-size": "10m"},
        "icc": False,
        "no-new-privileges": True,
    }
    assert json.loads((node_root / "etc/docker/daemon.json.before-gpu-node").read_text())["icc"]
    paths = GpuPaths()
    preload = node_root / paths.hami_preload_path.lstrip("/")
    assert preload.read_text() == hami_preload_text()
    lock = node_root / paths.hami_lock_dir.lstrip("/") / "lock"
    assert oct(lock.stat().st_mode & 0o777) == "0o666"
    assert (node_root / paths.hami_cache_base.lstrip("/")).is_dir()
    tmpfiles = (node_root / "etc/tmpfiles.d/fgpu-hami.conf").read_text()
    assert f"d {paths.hami_lock_dir} 0755 root root -" in tmpfiles
    assert f"f {paths.hami_lock_dir}/lock 0666 root root -" in tmpfiles
    assert "--root: not building HAMi-core" in first.stderr
    assert "--root: daemon.json changed; not restarting dockerd" in first.stderr

    after_first = snapshot(node_root)
    second = run("--root", str(node_root), path=stand_in_driver)
    assert second.returncode == 0, second.stderr
    assert snapshot(node_root) == after_first
    assert "daemon.json: unchanged" in second.stderr
    assert "not restarting dockerd" not in second.stderr

    check = run("--root", str(node_root), "--check-only", path=stand_in_driver)
    assert check.returncode == 1  # the toolkit, the runtime and HAMi-core are still missing
    assert "ok: /var/lib/fgpu-hub/ld.so.preload" in check.stderr
    assert '"icc"' not in check.stderr


def stage_hami_core(root: Path, with_tool: bool) -> None:
    """HAMi-core as an earlier run left it: the library and its commit stamp, and the tool or not."""
    paths = GpuPaths()
    library = root / paths.hami_library_path.lstrip("/")
    library.parent.mkdir(parents=True, exist_ok=True)
    library.write_bytes(b"\x7fELF")
    Path(f"{library}.fgpu-hami-core").write_text("5091a2fbe1816df1265490f771346730f29e2c8d\n")
    if with_tool:
        tool = root / paths.hami_shrreg_tool_path.lstrip("/")
        tool.write_bytes(b"\x7fELF")
        tool.chmod(0o755)


def test_a_node_with_the_library_but_not_hami_cores_tool_is_not_ready(node_root, stand_in_driver):
    # A node set up before sessions started with shrreg-tool: its hami sessions would not start.
    stage_hami_core(node_root, with_tool=False)
    check = run("--root", str(node_root), "--check-only", path=stand_in_driver)
    assert check.returncode == 1
    assert "NOT DONE: HAMi-core 5091a2fbe1816df1265490f771346730f29e2c8d (v2.9.0) is not at" in (
        check.stderr
    )
    assert "NOT DONE: HAMi-core's shrreg-tool is not at /usr/local/lib/hami-shrreg-tool" in (
        check.stderr
    )


def test_a_node_with_the_library_and_its_tool_has_hami_core(node_root, stand_in_driver):
    stage_hami_core(node_root, with_tool=True)
    check = run("--root", str(node_root), "--check-only", path=stand_in_driver)
    assert (
        "ok: HAMi-core 5091a2fbe1816df1265490f771346730f29e2c8d at /usr/local/lib/libvgpu.so"
        in (check.stderr)
    )
    assert "ok: HAMi-core's shrreg-tool at /usr/local/lib/hami-shrreg-tool" in check.stderr


def test_a_broken_daemon_json_stops_the_run_with_its_reason(node_root, stand_in_driver):
    daemon = node_root / "etc/docker/daemon.json"
    daemon.write_text('{"icc": true,')
    result = run("--root", str(node_root), path=stand_in_driver)
    assert result.returncode == 1
    assert "daemon.json is not valid JSON" in result.stderr
    assert daemon.read_text() == '{"icc": true,'


def test_a_staged_run_with_the_registry_keeps_sessions_off_it_and_trusts_its_ca(
    node_root, stand_in_driver, tmp_path
):
    ca = tmp_path / "registry-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nstand-in\n-----END CERTIFICATE-----\n")
    args = ("--root", str(node_root), "--registry", "10.0.0.5:5000")
    check = run(*args, "--check-only", path=stand_in_driver)
    assert "NOT DONE: /etc/systemd/system/docker.service.d/fgpu-registry.conf is missing" in (
        check.stderr
    )
    first = run(*args, "--registry-ca", str(ca), path=stand_in_driver)
    assert first.returncode == 0, first.stderr
    dropin = node_root / "etc/systemd/system/docker.service.d/fgpu-registry.conf"
    assert "iptables -I DOCKER-USER 1 -d 10.0.0.5/32 -p tcp --dport 5000 -j REJECT" in (
        dropin.read_text()
    )
    assert (node_root / "etc/docker/certs.d/10.0.0.5:5000/ca.crt").read_bytes() == ca.read_bytes()
    after = snapshot(node_root)
    second = run(*args, "--registry-ca", str(ca), path=stand_in_driver)
    assert second.returncode == 0 and snapshot(node_root) == after
    assert "ok: /etc/systemd/system/docker.service.d/fgpu-registry.conf unchanged" in second.stderr
    check = run(*args, "--check-only", path=stand_in_driver)
    assert "ok: /etc/systemd/system/docker.service.d/fgpu-registry.conf keeps sessions off" in (
        check.stderr
    )
    bad = run("--root", str(node_root), "--registry-ca", str(ca), path=stand_in_driver)
    assert bad.returncode == 2 and "--registry-ca needs --registry" in bad.stderr
