"""Which home folder is an account's: the names the spawner gives homes, and the queue service
reads them by (a batch job's notebook is looked for there before the job is queued). Pure.

- **One host.** Each user's home is a named volume, `fgpu-home-{username}` (the spawner's
  `home_volume`). A volume belongs to one hub account, not to a name: it is labelled with its
  owner's creation time (`fgpu.account`), and a new account of a deleted user's name gets a volume
  of its own, named with its creation time (`fgpu-home-alice_u20261123T211411123456Z`).
  `pick_home_volume` decides from what the engine says about both names.
- **A Swarm with a shared home root.** Each account's home is a folder of `<home_root>`, named
  the same way; `pick_home_account` decides which (fgpu_spawner/service_spec.py binds it).
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from datetime import UTC, datetime

from escapism import escape

#: The owner account's creation time (`account_tag`) on a home volume.
LABEL_ACCOUNT = "fgpu.account"
#: Starts the account part of a volume name: escaped names never hold '_' before a lower-case
#: letter (escapism writes '_' + two upper-case hex digits), so no user's plain name ends so.
ACCOUNT_MARK = "_u"
# Docker volume names allow [a-zA-Z0-9][a-zA-Z0-9_.-]*; '_' escapes everything else, itself included.
_VOLUME_SAFE = set(string.ascii_letters + string.digits + "-.")


def volume_safe(name: str) -> str:
    """`name` as a Docker volume name component: distinct names stay distinct."""
    return escape(name, safe=_VOLUME_SAFE, escape_char="_")


def home_volume_name(template: str, username: str, account: str = "") -> str:
    """The volume for `username`; with an `account` tag, that account's own one."""
    suffix = f"{ACCOUNT_MARK}{account}" if account else ""
    return template.format(username=volume_safe(username) + suffix)


def account_tag(created: datetime | None) -> str:
    """A hub account's creation time as a volume name part and label (UTC, microseconds); empty
    when unknown. A re-created user has another, even where the database reuses the user id."""
    if created is None:
        return ""
    return utc(created).strftime("%Y%m%dT%H%M%S%fZ")


def belongs_to_account(volume: Mapping, created: datetime | None) -> bool:
    """Whether an existing volume (the engine's inspect answer) is this account's home.

    Labelled volumes say whose they are. Older ones, made before the label, belong to the account
    if they were made after it (the engine's CreatedAt has whole seconds); one made before the
    account, or of unknown age, belongs to an earlier account of the same name.
    """
    tag = account_tag(created)
    labelled = (volume.get("Labels") or {}).get(LABEL_ACCOUNT)
    if not tag:
        return True  # nothing to tell accounts apart with: the name decides, as before
    if labelled:
        return labelled == tag
    try:
        made = datetime.fromisoformat(volume["CreatedAt"])
    except (KeyError, TypeError, ValueError):
        return False
    return utc(made) >= utc(created).replace(microsecond=0)


def utc(moment: datetime) -> datetime:
    """Naive times (the hub's database, some engines) are UTC."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def pick_home_volume(
    template: str, username: str, created: datetime | None, volumes: Mapping[str, Mapping | None]
) -> str:
    """The home volume of this account: its own tagged one if it has one; else the plain name,
    unless that belongs to an earlier account, which then keeps it and this account gets its
    own. `volumes` maps both names to the engine's inspect answer, or None where missing."""
    plain = home_volume_name(template, username)
    own = home_volume_name(template, username, account_tag(created))
    if own != plain and volumes.get(own) is not None:
        return own
    existing = volumes.get(plain)
    if existing is None or belongs_to_account(existing, created):
        return plain
    return own


def pick_home_account(
    account: str, created: datetime | None, own_exists: bool, plain_modified: datetime | None
) -> str:
    """Which home folder under a shared home root an account uses (its `home_account`): its own
    (`<user>_u<account>`) if it has one; the plain `<user>` if that was written since the account
    was made (an older account's folder was last written before it was deleted, so before this
    account was made); else its own, new one."""
    if not account or own_exists:
        return account
    if plain_modified is not None and created is not None:
        made = utc(created).replace(microsecond=0)
        if utc(plain_modified) >= made:
            return ""
    return account


def home_folder_name(user: str, account: str = "") -> str:
    """The name of a user's (with `account`, that account's) folder under a shared home root:
    escaped as home volumes are, so that no user name can climb out of the root, and no name is
    another name's account folder. A leading '.' is escaped too (`.x` is `_2Ex`, `..` is
    `_2E.`): no user's home is a hidden folder of the root, nor the root or its parent. Names
    not starting with '.' keep the folder they always had."""
    name = home_volume_name("{username}", user, account)
    if name.startswith("."):
        name = escape(".", safe=set(), escape_char="_") + name[1:]
    return name
