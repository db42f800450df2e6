"""Signed archives: an ed25519 signature over the manifest, made with a key the site keeps.

The manifest names every member with its SHA-256, so signing its exact bytes signs the whole
archive. `fgpu-hub backup --sign` adds the member `manifest.sig` after the manifest. A restore
checks it whenever the site has a key (`--key FILE`, `$FGPU_BACKUP_KEY`, or the default file when
it exists): an unsigned archive, or one signed with another key, is then refused. Without a key,
archives restore as before (the checksums still guard against damage, not against a forger).

The key file is a PEM ed25519 private key (`openssl genpkey -algorithm ed25519`); a machine that
only restores can hold the public half (`openssl pkey -pubout`) instead.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from .archive import ArchiveError

SIGNATURE = "manifest.sig"
KEY_ENV = "FGPU_BACKUP_KEY"
DEFAULT_KEY = Path("/etc/fgpu-hub/backup.key")
ALGORITHM = "ed25519"
MAKE_KEY = "openssl genpkey -algorithm ed25519 -out {path} && chmod 600 {path}"


def site_key_path(option: str | None) -> Path | None:
    """The key this site signs and checks with: named on the command line, in the environment,
    or the default file when it exists; None when the site has none."""
    named = option or os.environ.get(KEY_ENV)
    if named:
        return Path(named)
    return DEFAULT_KEY if DEFAULT_KEY.exists() else None


def _read_key(path: Path):
    from cryptography.hazmat.primitives import serialization

    try:
        data = path.read_bytes()
    except OSError as e:
        raise ArchiveError(
            f"cannot read the backup key {path} ({e.strerror}); make one with: "
            + MAKE_KEY.format(path=path)
        ) from None
    for load in (serialization.load_pem_private_key, serialization.load_pem_public_key):
        try:
            return load(data, None) if load is serialization.load_pem_private_key else load(data)
        except (ValueError, TypeError):
            continue
    raise ArchiveError(f"{path} is not a PEM ed25519 key")


def signing_key(path: Path):
    """The private key at `path`, to sign with."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = _read_key(path)
    if not isinstance(key, Ed25519PrivateKey):
        raise ArchiveError(f"{path} is not an ed25519 private key: it cannot sign")
    return key


def verify_key(path: Path):
    """The public key of the key at `path` (private or public), to check with."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    key = _read_key(path)
    if isinstance(key, Ed25519PrivateKey):
        return key.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise ArchiveError(f"{path} is not an ed25519 key")
    return key


def sign(manifest_data: bytes, key) -> bytes:
    """The `manifest.sig` member for these exact manifest bytes."""
    signature = base64.b64encode(key.sign(manifest_data)).decode()
    return (json.dumps({"algorithm": ALGORITHM, "signature": signature}) + "\n").encode()


def check(manifest_data: bytes, signature_data: bytes | None, key, key_path: Path) -> None:
    """Refuse the archive unless `signature_data` is this site's signature of the manifest.
    `key`: the site's public key, or None when the site has none (nothing to check)."""
    from cryptography.exceptions import InvalidSignature

    if key is None:
        return
    if signature_data is None:
        raise ArchiveError(f"it is not signed, and this site checks signatures ({key_path})")
    try:
        signed = json.loads(signature_data)
        if signed["algorithm"] != ALGORITHM:
            raise ValueError(signed["algorithm"])
        key.verify(base64.b64decode(signed["signature"], validate=True), manifest_data)
    except (ValueError, TypeError, KeyError, InvalidSignature):
        raise ArchiveError(
            f"its signature is not one made with this site's key ({key_path}):"
            " it was changed, or signed elsewhere"
        ) from None
