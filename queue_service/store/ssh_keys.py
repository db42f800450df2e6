"""The public keys that log an account in over SSH (queue_service/ssh/), kept per hub account in
the service's database, never in an image or a home folder a session could change.

A key is read and checked here before it is kept (an OpenSSH public key line: `ssh-ed25519 AAAA…
comment`), and kept as its canonical line with its SHA256 fingerprint, which is how a login finds
it. One account holds a key once; a key another account holds too logs in as neither on its own:
the login's name says which of them it is (`owners_of`, hub_logins.py).
"""

from __future__ import annotations

import asyncssh
from sqlalchemy import and_, delete, select
from sqlalchemy.orm import sessionmaker

from queue_service.core.errors import Refusal
from queue_service.store.accounts import Account
from queue_service.store.models import SSHKey, as_utc

#: The most keys one account keeps (a laptop, a desktop, VS Code's...).
MAX_KEYS = 20
MAX_TITLE = 255


def read_key(text) -> asyncssh.SSHKey:
    """The public key `text` holds, or a refusal that says what is wrong with it."""
    if not isinstance(text, str) or not text.strip():
        raise Refusal('Paste a public key: {"key": "ssh-ed25519 AAAA... you@laptop"}.', "invalid")
    if "PRIVATE KEY" in text:
        raise Refusal("That is a private key: paste the public one (the .pub file).", "invalid")
    try:
        return asyncssh.import_public_key(text.strip())
    except (asyncssh.KeyImportError, ValueError):
        raise Refusal(
            "That is not an OpenSSH public key (the .pub file's line).", "invalid"
        ) from None


def fingerprint(key: asyncssh.SSHKey) -> str:
    return key.get_fingerprint("sha256")


class SSHKeyStore:
    def __init__(self, db: sessionmaker):
        self.db = db

    def of(self, account: Account) -> list[dict]:
        with self.db() as db:
            rows = db.scalars(select(SSHKey).where(_of(account)).order_by(SSHKey.id)).all()
        return [_view(row) for row in rows]

    def add(self, account: Account, text, title="") -> dict:
        key = read_key(text)
        if not isinstance(title, str) or len(title) > MAX_TITLE:
            raise Refusal(f"A key's title is text of at most {MAX_TITLE} characters.", "invalid")
        found = fingerprint(key)
        with self.db.begin() as db:
            held = db.scalars(select(SSHKey.fingerprint).where(_of(account))).all()
            if found in held:
                raise Refusal(f"This key ({found}) is yours already.", "conflict")
            if len(held) >= MAX_KEYS:
                raise Refusal(f"An account keeps at most {MAX_KEYS} keys; remove one.", "invalid")
            line = key.export_public_key().decode().strip()
            row = SSHKey(
                owner=account.name,
                account=account.key,
                fingerprint=found,
                key=line,
                title=title or key.get_comment() or "",
            )
            db.add(row)
            db.flush()
            return _view(row)

    def remove(self, account: Account, key_id: int) -> None:
        with self.db.begin() as db:
            gone = db.execute(delete(SSHKey).where(_of(account), SSHKey.id == key_id)).rowcount
        if not gone:
            raise Refusal("No such key of yours.", "not_found")

    def owners_of(self, key: asyncssh.SSHKey) -> list[Account]:
        """The accounts that hold `key`."""
        query = select(SSHKey.owner, SSHKey.account).where(SSHKey.fingerprint == fingerprint(key))
        with self.db() as db:
            return [Account(owner, account) for owner, account in db.execute(query)]


def _of(account: Account):
    return and_(SSHKey.owner == account.name, SSHKey.account == account.key)


def _view(row: SSHKey) -> dict:
    return {
        "id": row.id,
        "title": row.title,
        "fingerprint": row.fingerprint,
        "key": row.key,
        "created": as_utc(row.created).isoformat() if row.created else None,
    }
