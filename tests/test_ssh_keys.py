"""The SSH keys an account keeps (store/ssh_keys.py), on SQLite and PostgreSQL: a key is checked
before it is kept, belongs to one account (not to a later account of the same name), and is
found by its fingerprint at a login; and the service's host key, made once."""

from __future__ import annotations

import asyncssh
import pytest

from queue_service.core.errors import Refusal
from queue_service.ssh.host_key import host_key
from queue_service.store.accounts import Account
from queue_service.store.db import open_database
from queue_service.store.ssh_keys import MAX_KEYS, SSHKeyStore

ANN = Account("ann", "20261101T000000000000Z")
ANN_AGAIN = Account("ann", "20261120T000000000000Z")  # deleted and made again
BOB = Account("bob", "20261101T000000000000Z")


def public(comment: str = "") -> tuple[asyncssh.SSHKey, str]:
    key = asyncssh.generate_private_key("ssh-ed25519", comment=comment or None)
    return key.convert_to_public(), key.export_public_key().decode()


@pytest.fixture
def keys(db_url) -> SSHKeyStore:
    return SSHKeyStore(open_database(db_url))


def test_a_key_belongs_to_the_account_that_added_it(keys):
    key, line = public("ann@laptop")
    added = keys.add(ANN, line)
    assert (added["title"], added["fingerprint"]) == ("ann@laptop", key.get_fingerprint("sha256"))
    assert keys.owners_of(key) == [ANN]
    assert keys.of(ANN_AGAIN) == [] and keys.of(BOB) == []
    with pytest.raises(Refusal, match="No such key"):
        keys.remove(BOB, added["id"])
    with pytest.raises(Refusal, match="yours already"):
        keys.add(ANN, line)
    keys.add(BOB, line)  # another account may keep the same key: the login name tells them apart
    assert sorted(a.name for a in keys.owners_of(key)) == ["ann", "bob"]
    keys.remove(ANN, added["id"])
    assert keys.owners_of(key) == [BOB]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "Paste a public key"),
        (None, "Paste a public key"),
        ("ssh-ed25519 AAAA-not-base64", "not an OpenSSH public key"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n", "private key"),
    ],
)
def test_what_is_not_a_public_key_is_refused_and_kept_nowhere(keys, text, reason):
    with pytest.raises(Refusal, match=reason):
        keys.add(ANN, text)
    assert keys.of(ANN) == []


def test_an_account_keeps_a_bounded_number_of_keys(keys):
    for _ in range(MAX_KEYS):
        keys.add(ANN, public()[1])
    with pytest.raises(Refusal, match=f"at most {MAX_KEYS}"):
        keys.add(ANN, public()[1])


def test_the_host_key_is_made_once_private_and_read_again(tmp_path):
    path = tmp_path / "fgpu_ssh_host_key"
    made = host_key(str(path))
    assert path.stat().st_mode & 0o777 == 0o600
    again = host_key(str(path))
    assert again.export_public_key() == made.export_public_key()
