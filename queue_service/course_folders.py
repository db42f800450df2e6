"""A course's storage folder: made with the course, read-only for its members, read-write for its
instructors, and mounted in its members' sessions when its instructors choose so.

- **Owner.** The folder belongs to the course itself, an account no person holds
  (`course:<name>`, account key `course`), so it outlives any instructor: instructors come
  and go through read-write shares, and an admin may still hand the folder over. Its bytes
  count against that owner's storage quota, the site's per-user one.
- **Shares.** One read-only share with the course's group: a member sees it, and someone
  dropped from the roster leaves the group and with it the folder (their own home and folders
  are untouched). One read-write share per instructor, kept in step with the roster.
- **Automount.** The group property `fgpu_course_folder` holds `{"id": ..., "automount":
  bool}`. With `automount` on, every session of a member mounts the folder at
  `~/folders/<name>` without choosing it (never over a file of their own home).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fgpu_shared import group_properties
from queue_service.core.folder_names import MAX_NAME
from queue_service.store.accounts import Account
from queue_service.store.folders import Reader

from .folders import Folders
from .hub_client import HubClient

if TYPE_CHECKING:  # courses.py reads a course's folder setting from here
    from .courses import Course

FOLDER_PROPERTY = "fgpu_course_folder"
#: The account key of a course's own account: never a hub account's (a creation time).
COURSE_ACCOUNT_KEY = "course"


def course_owner(course: str) -> Reader:
    return Reader(Account(f"course:{course}", COURSE_ACCOUNT_KEY))


def folder_name_of(course: str) -> str:
    """The folder's name: the course's, with the `@` a folder's name may not hold as `-`."""
    return course.replace("@", "-")[:MAX_NAME]


def folder_setting(group: dict) -> dict | None:
    """`{"id", "automount"}` from a group model (properties decoded), or None."""
    setting = (group.get("properties") or {}).get(FOLDER_PROPERTY)
    if not isinstance(setting, dict) or not isinstance(setting.get("id"), str):
        return None
    return {"id": setting["id"], "automount": setting.get("automount") is True}


async def provide(hub: HubClient, folders: Folders, course: Course) -> dict:
    """Make the course's folder if it has none, share it read-only with the course's group and
    read-write with exactly its instructors, and record it in the group; its setting."""
    instructors = {}
    for name in course.instructors:
        if name in course.members:  # as Course.role_of: a named non-member runs nothing
            created = await hub.account_created(name)
            if created is not None:
                instructors[name] = Account.of({"name": name, "created": created}).key
    folder = await asyncio.to_thread(_folder_with_shares, folders, course.name, instructors)
    group = await hub.group_now(course.name)
    setting = folder_setting({"properties": group_properties.decoded(group.get("properties"))})
    if setting is None or setting["id"] != folder["id"]:
        setting = {"id": folder["id"], "automount": bool(setting and setting["automount"])}
        await hub.set_group_properties(
            course.name, {**(group.get("properties") or {}), FOLDER_PROPERTY: setting}
        )
    return setting


def _folder_with_shares(folders: Folders, course: str, instructors: dict[str, str]) -> dict:
    owner, name = course_owner(course), folder_name_of(course)
    found = [f for f in folders.store.visible(owner) if f["own"] and f["name"] == name]
    folder = found[0] if found else folders.create(owner, name)
    folders.share(owner, folder["id"], {"group": course}, "ro")
    for share in folders.store.get(folder["id"], owner)["shares"]:
        if share["user"] is not None and share["user"] not in instructors:
            folders.unshare(owner, folder["id"], share["id"])
    for user, account in instructors.items():
        folders.share(owner, folder["id"], {"user": user, "account": account}, "rw")
    return folder


async def automounted(hub: HubClient, groups) -> list[str]:
    """The ids of the course folders to mount in every session of a member of `groups`."""
    ids = []
    for group in groups:
        model = await hub.group(group)
        setting = folder_setting(model)
        if setting and setting["automount"]:
            ids.append(setting["id"])
    return ids
