"""HAMi-core's lock file under `/tmp`: the spawner and `scripts/gpu-node` make
`LOCK_DIR/lock` mode 0666, and must never do it through a link another local user planted there
(`/tmp/vgpulock/lock -> /etc/ld.so.preload` would give everyone a writable preload file, then
root). The planted links here point at temporary files, never at a real system file: the target
must stay as it was, and the creation must refuse with a message that names the link."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest
from traitlets.config import Config

from fgpu_spawner import FGPUSpawner
from fgpu_spawner.gpu_sharing import GpuPaths, build_gpu_settings
from fgpu_spawner.grant import Grant
from fgpu_spawner.hami_lock import UnsafeLockPath, make_lock_file

from .harness import TEST_LABEL, remove_containers, wait_until
from .test_gpu_node_script import node_root, run, stand_in_driver  # noqa: F401

SECRET = b"root's own file\n"


@pytest.fixture
def target(tmp_path) -> Path:
    """The file a planted link points at: it stands in for /etc/ld.so.preload."""
    path = tmp_path / "stands-for-ld.so.preload"
    path.write_bytes(SECRET)
    path.chmod(0o644)
    return path


def assert_untouched(path: Path) -> None:
    assert path.read_bytes() == SECRET
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def spawner_with_cache_base(tmp_path: Path) -> FGPUSpawner:
    config = Config()
    config.FGPUSpawner.hami_cache_base = str(tmp_path / "vgpu")
    return FGPUSpawner(config=config)


def planted_lock_link(tmp_path, target):
    """A session's lock folder whose `lock` is a link someone planted (left by an earlier
    session of that id, say); a spawner that uses it for session `sess-1`."""
    lock_dir = tmp_path / "vgpu" / "sess-1" / "vgpulock"
    lock_dir.mkdir(mode=0o755, parents=True)
    (lock_dir / "lock").symlink_to(target)
    return lock_dir, spawner_with_cache_base(tmp_path)


def test_the_spawner_refuses_a_planted_lock_link_and_leaves_its_target_alone(tmp_path, target):
    lock_dir, spawner = planted_lock_link(tmp_path, target)
    with pytest.raises(UnsafeLockPath, match="not a plain file.*symbolic link"):
        spawner.prepare_hami_host_paths("sess-1")
    assert_untouched(target)
    assert (lock_dir / "lock").is_symlink()


def test_the_spawner_never_creates_the_missing_target_of_a_planted_link(tmp_path):
    """/etc/ld.so.preload is usually absent: a link to it must not bring it into being."""
    missing = tmp_path / "absent-ld.so.preload"
    _, spawner = planted_lock_link(tmp_path, missing)
    with pytest.raises(UnsafeLockPath, match="symbolic link"):
        spawner.prepare_hami_host_paths("sess-1")
    assert not os.path.lexists(missing)


def test_a_lock_folder_that_is_a_link_is_refused_and_nothing_is_made_in_its_target(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (tmp_path / "vgpulock").symlink_to(elsewhere)
    with pytest.raises(UnsafeLockPath, match="is a symbolic link"):
        make_lock_file(tmp_path / "vgpulock")
    assert list(elsewhere.iterdir()) == []


def test_a_lock_folder_others_may_write_or_own_is_refused(tmp_path):
    lock_dir = tmp_path / "vgpulock"
    lock_dir.mkdir()
    lock_dir.chmod(0o777)  # as another user's `mkdir /tmp/vgpulock` leaves it
    with pytest.raises(UnsafeLockPath, match="may be written by others"):
        make_lock_file(lock_dir)
    assert not (lock_dir / "lock").exists()
    if os.geteuid() == 0:
        lock_dir.chmod(0o755)
        os.chown(lock_dir, 1000, 100)
        with pytest.raises(UnsafeLockPath, match="belongs to uid 1000"):
            make_lock_file(lock_dir)
        assert not (lock_dir / "lock").exists()


def test_the_lock_file_is_made_0666_once_and_kept(tmp_path):
    lock_dir = tmp_path / "vgpulock"
    path = make_lock_file(lock_dir)
    assert path == lock_dir / "lock" and path.is_file() and not path.is_symlink()
    assert oct(path.stat().st_mode & 0o777) == "0o666"
    assert oct(lock_dir.stat().st_mode & 0o777) == "0o755"
    inode = path.stat().st_ino
    assert make_lock_file(lock_dir).stat().st_ino == inode


def test_gpu_node_refuses_a_planted_lock_link_and_leaves_its_target_alone(
    node_root,  # noqa: F811
    stand_in_driver,  # noqa: F811
    target,
):
    lock_dir = node_root / GpuPaths().hami_lock_dir.lstrip("/")
    lock_dir.mkdir(parents=True, mode=0o755)
    (lock_dir / "lock").symlink_to(target)
    result = run("--root", str(node_root), path=stand_in_driver)
    assert result.returncode == 1, result.stderr
    assert f"{GpuPaths().hami_lock_dir}/lock is a symbolic link (to {target})" in result.stderr
    assert_untouched(target)


def test_gpu_node_never_creates_the_missing_target_of_a_planted_link(
    node_root,  # noqa: F811
    stand_in_driver,  # noqa: F811
    tmp_path,
):
    missing = tmp_path / "absent-ld.so.preload"
    lock_dir = node_root / GpuPaths().hami_lock_dir.lstrip("/")
    lock_dir.mkdir(parents=True, mode=0o755)
    (lock_dir / "lock").symlink_to(missing)
    result = run("--root", str(node_root), path=stand_in_driver)
    assert result.returncode == 1, result.stderr
    assert "lock is a symbolic link" in result.stderr
    assert not os.path.lexists(missing)


def test_gpu_node_refuses_a_lock_folder_someone_else_made(
    node_root,  # noqa: F811
    stand_in_driver,  # noqa: F811
):
    if os.geteuid() != 0:
        pytest.fail("This test gives a folder away to uid 1000: run it as root, as CI does.")
    lock_dir = node_root / GpuPaths().hami_lock_dir.lstrip("/")
    lock_dir.mkdir(parents=True)
    os.chown(lock_dir, 1000, 100)
    result = run("--root", str(node_root), path=stand_in_driver)
    assert result.returncode == 1, result.stderr
    assert "belongs to uid 1000, not root" in result.stderr
    assert not (lock_dir / "lock").exists()


HOLD_LOCK = (
    "import fcntl, time; f = open('/tmp/vgpulock/lock', 'a'); fcntl.lockf(f, fcntl.LOCK_EX); "
    "print('held', flush=True); time.sleep(120)"
)
TRY_LOCK = (
    "import fcntl; f = open('/tmp/vgpulock/lock', 'a'); "
    "fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')"
)


@pytest.mark.docker
def test_a_session_holding_its_hami_lock_never_holds_another_sessions(docker_engine):
    """HAMi-core takes `/tmp/vgpulock/lock` (lockf) while a process starts on the GPU. Bound from
    one host folder into every session, it let one session hold it and stall the others' GPU
    start-up; each session now has its own, in its cache folder. Two sessions with the
    spawner's binds, in real containers: the first holds its lock, the second takes its own."""
    base = Path(tempfile.mkdtemp(prefix="fgpu-hami-lock-"))
    base.chmod(0o755)  # pytest's own temporary folders are root's alone
    spawner = spawner_with_cache_base(base)
    run_id = secrets.token_hex(4)
    try:
        binds = {}
        for session in ("sess-a", "sess-b"):
            spawner.prepare_hami_host_paths(session)
            grant = Grant(session, "node-a", {"GPU-a": 0.5})
            binds[session] = build_gpu_settings(
                grant, {"GPU-a": 2**33}, "hami", spawner.gpu_paths
            ).binds
        assert binds["sess-a"] != binds["sess-b"]

        def session(name, code, **options):
            return docker_engine.containers.run(
                "fgpu/jupyter-base:py3.11",
                ["python3", "-c", code],
                user="1000:100",
                cap_drop=["ALL"],
                network_mode="none",
                volumes=binds[name],
                labels={TEST_LABEL: run_id},
                **options,
            )

        holder = session("sess-a", HOLD_LOCK, detach=True)
        wait_until(lambda: b"held" in holder.logs(), 60, "the first session holds its lock")
        assert session("sess-b", TRY_LOCK, remove=True).decode().strip() == "free"
    finally:
        remove_containers({TEST_LABEL: run_id})
        shutil.rmtree(base)
