"""job_files.py against a real engine and disk: a batch job's notebook looked for at submission
in the account's home volume (its directory from the engine), in a shared home root (Swarm mode)
and in the storage folders the launch mounts; a missing one refused, what the service cannot see
(a link, a home elsewhere) let through, and never a link followed."""

from __future__ import annotations

import os
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

import docker.errors
import pytest

from fgpu_shared.homes import LABEL_ACCOUNT, account_tag, home_volume_name
from queue_service.core.errors import Refusal
from queue_service.engine.volumes import inspect_volume_with
from queue_service.job_files import HomeSettings, JobFiles
from queue_service.store.accounts import Account

pytestmark = [pytest.mark.docker]

TEMPLATE = "fgpu-test-home-{username}"
CREATED = datetime(2026, 11, 1, 9, 30, tzinfo=UTC)


@pytest.fixture
def user(docker_engine):
    """A fresh user name; every home volume made for it is removed afterwards."""
    name = f"jf-{secrets.token_hex(4)}"
    yield name
    for volume in docker_engine.volumes.list(filters={"name": home_volume_name(TEMPLATE, name)}):
        volume.remove(force=True)


def make_home(engine, user: str, tag: str = "", label: str = "", files=()) -> Path:
    """A home volume (the account's own with `tag`), labelled as the spawner labels it with its
    account's creation time (`label`), with `files` in it."""
    labels = {LABEL_ACCOUNT: label} if label else {}
    volume = engine.volumes.create(home_volume_name(TEMPLATE, user, tag), labels=labels)
    home = Path(volume.attrs["Mountpoint"])
    for name in files:
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text("{}")
    return home


def refusal(job_files: JobFiles, user: str, notebook: str, mounts=()) -> str | None:
    found = job_files.notebook_refusal(Account(user, account_tag(CREATED)), notebook, list(mounts))
    assert found is None or isinstance(found, Refusal) and found.cause == "invalid"
    return None if found is None else found.message


@pytest.fixture
def on_one_host(docker_engine):
    return JobFiles(HomeSettings(volume=TEMPLATE), inspect_volume_with(docker_engine))


def test_a_notebook_is_looked_for_in_the_accounts_home_volume(docker_engine, on_one_host, user):
    # The user's first session ever is still to come: no home yet, so no notebook in it.
    assert refusal(on_one_host, user, "work/train.ipynb") == (
        "notebook work/train.ipynb is not in your home folder."
    )
    make_home(docker_engine, user, label=account_tag(CREATED), files=["work/train.ipynb"])
    assert refusal(on_one_host, user, "work/train.ipynb") is None
    assert "not in your home folder" in refusal(on_one_host, user, "work/nope.ipynb")
    assert "not in your home folder" in refusal(on_one_host, user, "work")  # a directory
    # Under folders/ with no storage folder mounted there: said how to mount one.
    words = refusal(on_one_host, user, "folders/runs/a.ipynb")
    assert '"folders": ["runs"]' in words, words


def test_a_deleted_users_home_is_not_the_new_accounts(docker_engine, on_one_host, user):
    """A user deleted and created again under the same name gets a volume of its own: the notebook
    in the earlier account's volume is not the new account's."""
    earlier = account_tag(CREATED - timedelta(days=30))
    make_home(docker_engine, user, label=earlier, files=["old.ipynb"])
    assert "not in your home folder" in refusal(on_one_host, user, "old.ipynb")
    make_home(docker_engine, user, tag=account_tag(CREATED), files=["new.ipynb"])
    assert refusal(on_one_host, user, "new.ipynb") is None
    assert "not in your home folder" in refusal(on_one_host, user, "old.ipynb")


def test_a_planted_link_is_never_followed_and_what_is_behind_it_goes_through(
    docker_engine, on_one_host, user, tmp_path
):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "real.ipynb").write_text("{}")
    home = make_home(docker_engine, user, label=account_tag(CREATED))
    os.symlink(outside, home / "out")
    os.symlink("/etc", home / "etc")
    # Followed, the missing ones would be refused: behind a link the service cannot tell.
    for notebook in ("out/real.ipynb", "out/missing.ipynb", "etc/missing.ipynb"):
        assert refusal(on_one_host, user, notebook) is None, notebook


def test_a_home_the_service_cannot_see_lets_the_job_through(user):
    """An engine elsewhere (its volume's directory is not on this host), an engine that does not
    answer, a Swarm without a shared home root, or no persistent homes: the job runner says it."""
    elsewhere = JobFiles(
        HomeSettings(volume=TEMPLATE),
        lambda name: {"Name": name, "Mountpoint": f"/nonexistent/{name}/_data", "Labels": {}},
    )
    assert refusal(elsewhere, user, "a.ipynb") is None

    def no_engine(name):
        raise docker.errors.DockerException("no engine")

    assert refusal(JobFiles(HomeSettings(volume=TEMPLATE), no_engine), user, "a.ipynb") is None
    swarm_volumes = JobFiles(HomeSettings(volume=TEMPLATE, volumes_here=False), no_engine)
    assert refusal(swarm_volumes, user, "a.ipynb") is None
    assert refusal(JobFiles(HomeSettings(volume=""), no_engine), user, "a.ipynb") is None


def test_in_swarm_mode_the_notebook_is_looked_for_in_the_shared_home_root(tmp_path, user):
    root = tmp_path / "homes"
    root.mkdir()
    swarm = JobFiles(HomeSettings(volume=TEMPLATE, root=str(root), volumes_here=False), None)
    assert "not in your home folder" in refusal(swarm, user, "a.ipynb")  # no folder yet
    own = root / f"{user}_u{account_tag(CREATED)}"
    own.mkdir()
    (own / "a.ipynb").write_text("{}")
    assert refusal(swarm, user, "a.ipynb") is None
    assert "not in your home folder" in refusal(swarm, user, "b.ipynb")
    # A root not mounted on this host: the spawner refuses to start anything; nothing seen here.
    unmounted = JobFiles(HomeSettings(root=str(tmp_path / "not-mounted"), volumes_here=False), None)
    assert refusal(unmounted, user, "a.ipynb") is None


def test_a_notebook_in_a_mounted_storage_folder_is_looked_for_there(tmp_path, on_one_host, user):
    source = tmp_path / "folders" / ("f" * 32)
    (source / "course").mkdir(parents=True)
    (source / "course" / "lab.ipynb").write_text("{}")
    mounts = [{"name": "runs", "path": "folders/runs", "source": str(source)}]
    assert refusal(on_one_host, user, "folders/runs/course/lab.ipynb", mounts) is None
    assert refusal(on_one_host, user, "folders/runs/lab.ipynb", mounts) == (
        "notebook folders/runs/lab.ipynb is not in storage folder runs (~/folders/runs)."
    )
    # An automount folder appears at ~/<name>.
    automount = [{"name": ".cache", "path": ".cache", "source": str(source)}]
    assert refusal(on_one_host, user, ".cache/course/lab.ipynb", automount) is None
    assert "storage folder .cache" in refusal(on_one_host, user, ".cache/x.ipynb", automount)


def test_a_leading_dot_user_name_is_never_a_hidden_folder_of_the_shared_root(tmp_path):
    """`.snapshot`, say, is the storage's own folder, not the home of a user named so."""
    root = tmp_path / "homes"
    (root / ".snapshot").mkdir(parents=True)
    (root / ".snapshot" / "a.ipynb").write_text("{}")
    (tmp_path / "a.ipynb").write_text("{}")  # beside the root: never a user's home either
    swarm = JobFiles(HomeSettings(volume=TEMPLATE, root=str(root), volumes_here=False), None)
    assert "not in your home folder" in refusal(swarm, ".snapshot", "a.ipynb")
    assert "not in your home folder" in refusal(swarm, "..", "a.ipynb")
    (root / "_2Esnapshot").mkdir()
    (root / "_2Esnapshot" / "a.ipynb").write_text("{}")  # the escaped name is the user's own
    assert refusal(swarm, ".snapshot", "a.ipynb") is None
