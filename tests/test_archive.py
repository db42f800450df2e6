"""The backup archive's rules (fgpu_admin/archive.py): names, retention, manifest, checks."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest

from fgpu_admin import archive
from fgpu_admin.archive import ArchiveError, Digest
from fgpu_admin.cli import AdminError

NOW = datetime(2026, 11, 26, 4, 18, 0, tzinfo=UTC)


def digest_of(data: bytes) -> Digest:
    digest = Digest()
    digest.update(data[:3])
    digest.update(data[3:])
    return digest


def a_manifest(**changes) -> dict:
    members = {
        "db/hub.sqlite": digest_of(b"hub database"),
        "db/queue.sqlite": digest_of(b"queue database"),
        "state/jupyterhub_cookie_secret": digest_of(b"secret"),
    }
    fields = {
        "created": NOW,
        "host": "hub-1",
        "state_dir": "/srv/hub",
        "versions": {"fgpu-hub": "0.1.0", "jupyterhub": "6.1.1"},
        "databases": {
            "hub": {"kind": "sqlite", "member": "db/hub.sqlite", "revision": "f460b0348206"},
            "queue": {"kind": "sqlite", "member": "db/queue.sqlite", "revision": "0007"},
        },
        "members": members,
        "modes": {"state/jupyterhub_cookie_secret": 0o600},
        "files": [{"member": "state/jupyterhub_cookie_secret", "kind": "state"}],
        "images": [
            {
                "name": "fgpu-private/alice:v1",
                "size": 3 * 1024**3,
                "member": None,
                "save_command": "docker save -o alice-v1.tar fgpu-private/alice:v1",
            }
        ],
    }
    fields.update(changes)
    return archive.build_manifest(**fields)


def seen_of(manifest: dict) -> dict[str, tuple[str, int]]:
    return {name: (m["sha256"], m["size"]) for name, m in manifest["members"].items()}


def test_a_digest_is_the_sha256_and_size_of_all_its_chunks():
    digest = digest_of(b"hub database")
    assert digest.size == 12
    assert digest.sha256 == hashlib.sha256(b"hub database").hexdigest()


def test_archive_names_sort_by_time_and_tell_their_age():
    name = archive.archive_name(NOW)
    assert name == "fgpu-hub-backup-20261126T041800Z.tar.gz"
    assert archive.archived_at(name) == NOW
    assert archive.archived_at("notes.txt") is None
    assert archive.archived_at("fgpu-hub-backup-2026.tar.gz") is None


def test_retention_deletes_only_archives_older_than_the_days_kept():
    names = [
        "fgpu-hub-backup-20261101T000000Z.tar.gz",  # 25 days old
        "fgpu-hub-backup-20261119T041759Z.tar.gz",  # just over 7 days
        "fgpu-hub-backup-20261119T041800Z.tar.gz",  # exactly 7 days: kept
        "fgpu-hub-backup-20261125T000000Z.tar.gz",
        "site-notes.tar.gz",
        "fgpu-hub-backup-20261101T000000Z.tar.gz.partial",
    ]
    assert archive.expired(names, NOW, 7) == [
        "fgpu-hub-backup-20261101T000000Z.tar.gz",
        "fgpu-hub-backup-20261119T041759Z.tar.gz",
    ]
    assert archive.expired(names, NOW, 30) == []
    assert len(archive.expired(names, NOW, 0)) == 4


def test_the_manifest_lists_versions_revisions_and_every_member_with_its_checksum():
    manifest = archive.parse_manifest(archive.manifest_bytes(a_manifest()))
    assert manifest["format"] == archive.FORMAT
    assert manifest["format_version"] == archive.FORMAT_VERSION
    assert manifest["created"] == "2026-11-26T04:18:00+00:00"
    assert manifest["databases"]["queue"]["revision"] == "0007"
    secret = manifest["members"]["state/jupyterhub_cookie_secret"]
    assert secret["mode"] == 0o600 and secret["size"] == 6
    assert manifest["members"]["db/hub.sqlite"]["mode"] == 0o600  # private unless told
    archive.verify(manifest, seen_of(manifest))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.pop("db/queue.sqlite"), "lacks 1 member"),
        (lambda s: s.update({"homes/x.tar": ("0" * 64, 1)}), "does not list: homes/x.tar"),
        (lambda s: s.update({"db/hub.sqlite": ("0" * 64, 12)}), "db/hub.sqlite fails its checksum"),
        (lambda s: s.update({"db/hub.sqlite": (s["db/hub.sqlite"][0], 11)}), "fails its checksum"),
    ],
)
def test_a_missing_extra_or_changed_member_is_refused(change, message):
    manifest = a_manifest()
    seen = seen_of(manifest)
    change(seen)
    with pytest.raises(ArchiveError, match=message):
        archive.verify(manifest, seen)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00not json", "not JSON"),
        (b'{"format": "other"}', "not an fgpu-hub backup"),
        (b'{"format": "fgpu-hub-backup", "format_version": 99}', "format 99, newer"),
        (b'{"format": "fgpu-hub-backup", "format_version": 1}', "no valid 'members'"),
    ],
)
def test_a_bad_manifest_is_refused_in_one_line(data, message):
    with pytest.raises(ArchiveError, match=message) as raised:
        archive.parse_manifest(data)
    assert "\n" not in str(raised.value)
    assert isinstance(raised.value, AdminError)  # printed as one line, exit code 1


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "db/../../x", "state/./x", "other/file", "db/", "db\\x"]
)
def test_a_member_that_would_land_outside_its_folder_is_refused(name):
    manifest = a_manifest()
    manifest["members"][name] = {"sha256": "0" * 64, "size": 0}
    with pytest.raises(ArchiveError, match="unsafe name"):
        archive.parse_manifest(archive.manifest_bytes(manifest))


def test_revisions_this_install_does_not_know_are_refused():
    manifest = a_manifest()
    known = {"hub": {"f460b0348206", "older"}, "queue": {"0006", "0007"}}
    archive.check_revisions(manifest, known)
    manifest["databases"]["queue"]["revision"] = "0042"
    with pytest.raises(ArchiveError, match="queue database is at schema revision '0042'"):
        archive.check_revisions(manifest, known)
    manifest["databases"]["queue"]["revision"] = "0007"
    manifest["databases"]["hub"]["revision"] = None
    with pytest.raises(ArchiveError, match="hub database"):
        archive.check_revisions(manifest, known)


def test_what_the_archive_does_not_hold_is_listed_with_its_size_and_command():
    manifest = a_manifest(
        homes=[
            {"name": "fgpu-home-bob", "size": 5 * 1024**2, "member": "homes/fgpu-home-bob.tar"},
            {"name": "fgpu-home-al", "size": 2048, "member": None, "save_command": "tar czf …"},
        ]
    )
    assert archive.not_saved(manifest) == [
        "not in the archive: fgpu-private/alice:v1 (3 GiB); save it with:"
        " docker save -o alice-v1.tar fgpu-private/alice:v1",
        "not in the archive: fgpu-home-al (2 KiB); save it with: tar czf …",
    ]
    images, homes = archive.engine_parts(manifest)
    assert images == [] and [h["name"] for h in homes] == ["fgpu-home-bob"]


def test_sizes_are_written_as_on_the_pages():
    assert archive.format_size(512) == "512 B"
    assert archive.format_size(1536) == "1.5 KiB"
    assert archive.format_size(5 * 1024**4) == "5 TiB"


def test_a_migration_script_declares_its_revision():
    assert archive.revision_of('"""Doc."""\nrevision = "0007"\ndown_revision = "0006"\n') == "0007"
    assert archive.revision_of("revision: str = 'f460b0348206'\n") == "f460b0348206"
    assert archive.revision_of("down_revision = '0006'\n") is None
