"""Swarm home folders on shared storage are their owner's only: every
session runs as the same uid:gid (`run_as`), so a group or other bit would let any account of
that gid on a node or storage client read every student's home."""

import stat
from datetime import UTC, datetime
from types import SimpleNamespace

from fgpu_spawner.swarm_spawner import FGPUSwarmSpawner


def _spawner(home_root, user="ann") -> FGPUSwarmSpawner:
    spawner = FGPUSwarmSpawner(home_root=str(home_root), run_as="1000:100")
    spawner.user = SimpleNamespace(name=user, created=datetime(2026, 11, 1, tzinfo=UTC))
    return spawner


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_shared_home_folder_is_0700_and_owned_by_the_session_user(tmp_path):
    spawner = _spawner(tmp_path)
    spawner.prepare_home_folder()
    # A new account's own folder (`ann_u<creation time>`, service_spec.home_folder).
    (home,) = tmp_path.iterdir()
    assert home.name.startswith("ann")
    assert _mode(home) == 0o700
    assert (home.stat().st_uid, home.stat().st_gid) == (1000, 100)


def test_a_home_folder_an_older_hub_made_0750_is_closed_at_the_next_spawn(tmp_path):
    home = tmp_path / "ann"
    home.mkdir(mode=0o750)
    (home / "notes.txt").write_text("kept")
    _spawner(tmp_path).prepare_home_folder()
    assert _mode(home) == 0o700
    assert (home / "notes.txt").read_text() == "kept"
