"""HAMi-core's lock file under `/tmp` (issue 23, item 4): the spawner and `scripts/gpu-node` make
`LOCK_DIR/lock` mode 0666, and must never do it through a link another local user planted there
(`/tmp/vgpulock/lock -> /etc/ld.so.preload` would give everyone a writable preload file, then
root). The planted links here point at temporary files, never at a real system file: the target
must stay as it was, and the creation must refuse with a message that names the link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from traitlets.config import Config

from fgpu_spawner import FGPUSpawner
from fgpu_spawner.gpu_sharing import GpuPaths
from fgpu_spawner.hami_lock import UnsafeLockPath, make_lock_file

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


def spawner_with_lock_dir(lock_dir: Path, tmp_path: Path) -> FGPUSpawner:
    config = Config()
    config.FGPUSpawner.hami_lock_dir = str(lock_dir)
    config.FGPUSpawner.hami_cache_base = str(tmp_path / "vgpu")
    return FGPUSpawner(config=config)


def planted_lock_link(tmp_path, target):
    """A lock folder of ours whose `lock` is a link someone planted; a spawner that uses it."""
    lock_dir = tmp_path / "vgpulock"
    lock_dir.mkdir(mode=0o755)
    (lock_dir / "lock").symlink_to(target)
    return lock_dir, spawner_with_lock_dir(lock_dir, tmp_path)


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
        spawner.prepare_hami_host_paths("sess-2")
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
