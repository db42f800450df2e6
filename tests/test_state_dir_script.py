"""Where `scripts/up` keeps the hub's state (scripts/lib/state_dir.sh): never in the checkout
unless asked, so that students' folders and the databases are not one `git add -A` away from a
commit; the directory it starts from anywhere else; FGPU_STATE_DIR above both."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def state_dir(started_from: Path, **env: str) -> str:
    script = f'. scripts/lib/state_dir.sh && hub_state_dir "$PWD" "{started_from}"'
    environ = {k: v for k, v in os.environ.items() if k != "FGPU_STATE_DIR"} | env
    done = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=environ, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_started_in_the_checkout_or_below_the_state_goes_to_the_users_state_directory(tmp_path):
    for inside in (ROOT, ROOT / "docs"):
        assert state_dir(inside, XDG_STATE_HOME=str(tmp_path)) == f"{tmp_path}/fgpu-hub"
    assert state_dir(ROOT, HOME=str(tmp_path)) == f"{tmp_path}/.local/state/fgpu-hub"


def test_started_elsewhere_the_state_stays_where_the_site_started_it(tmp_path):
    assert state_dir(tmp_path, XDG_STATE_HOME="/nowhere") == str(tmp_path.resolve())


def test_fgpu_state_dir_wins_even_inside_the_checkout(tmp_path):
    assert state_dir(ROOT, FGPU_STATE_DIR=str(tmp_path / "hub")) == str(tmp_path / "hub")


def test_a_checkout_reached_through_a_link_is_still_the_checkout(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(ROOT)
    assert state_dir(link, XDG_STATE_HOME=str(tmp_path)) == f"{tmp_path}/fgpu-hub"


def test_the_checkout_ignores_what_a_hub_started_in_it_would_write():
    names = ["fgpu-folders/ann/x", "fgpu_queue.sqlite", "fgpu_queue.sqlite-wal", "backups/a.tar"]
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *names], cwd=ROOT, capture_output=True, text=True
    )
    assert done.stdout.split() == names, done.stdout + done.stderr
