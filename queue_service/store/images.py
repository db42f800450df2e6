"""The image catalog as the service keeps it: `ImageStore`, over the `images` table.

catalog.yaml seeds it at every start; from then on instructors own it (api/images and the Images
page). Seeding is a three-way merge against what was seeded last time (`image_seeds`): a field
changes only where nobody edited it since, and an image an instructor deleted stays deleted.

Reads come from memory: the catalog is small and read on every spawn form and spawn, so the event
loop never waits for the DB to answer one. Writes are rare (an instructor's edit) and take the DB;
the handlers run them off the event loop (`asyncio.to_thread`), and each write reloads the copy in
memory under one lock, so a read sees the catalog before a write or after it, never between.

`admit` is the one place that decides whether a user may start an image at a given size; the spawn
path (api/grants) and `POST api/sessions` both ask it.

A private image belongs to its owner's hub account, told apart by the account's creation time
(`owner_created`): a user deleted and created again under the same name is a new account, and the
old account's images are not offered to it. Admins still see them and can hand them over (PATCH
`owner`) or delete them.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from fgpu_shared.units import parse_size
from image_catalog import Catalog, CatalogError, CatalogImage, parse_image
from queue_service.core.errors import Refusal
from queue_service.store.models import ImageRecord, ImageSeed, as_utc, utcnow

#: Entry fields kept in columns of the same name.
_PLAIN_FIELDS = ("display_name", "image", "framework", "version", "description", "gpu", "hidden")


class ImageError(Refusal):
    """A catalog request that cannot be done: the message says why, `cause` what kind of refusal."""


@dataclass(frozen=True)
class CheckResult:
    """Whether the image is on the engine and starts jupyterhub-singleuser; `message` says what
    was seen (its version, or why not)."""

    ok: bool
    message: str
    checked_at: datetime


def account_time(value: datetime | str | None) -> datetime | None:
    """A hub account's creation time, from the hub's user model (ISO text) or the store."""
    if not value:
        return None
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    return as_utc(moment)


def refusal(
    entry: dict,
    user: str,
    groups: tuple[str, ...],
    admin: bool,
    created: datetime | str | None = None,
) -> str | None:
    """Why `user` (the account made at `created`) may not start this image, or None. Pure;
    `entry` is a store view."""
    name = entry["name"]
    if entry["hidden"]:
        return f"Image {name!r} is hidden by the instructors."
    if entry["owner"] and entry["owner"] != user:
        return f"Image {name!r} is private to another user."
    owner_created = account_time(entry.get("owner_created"))
    if owner_created and owner_created != account_time(created):
        return (
            f"Image {name!r} belongs to an earlier account named {user}; an admin can hand it "
            "over to you."
        )
    if entry["groups"] and not admin and not set(entry["groups"]) & set(groups):
        return f"Image {name!r} is only for the group(s) {', '.join(entry['groups'])}."
    return None


def missing_from_engine(entry: dict) -> str | None:
    """Why the image cannot start here yet, when the engine was seen without it; else None. Pure.

    A heavy image is in the catalog before it is built (the service builds it behind the hub):
    the launcher offers it once the engine holds it."""
    if entry.get("on_engine", True):
        return None
    return (
        f"Image {entry['name']!r} ({entry['image']}) is not on this host's Docker engine yet. "
        "Its build may be under way (the Images page shows it); an admin can also build it with "
        f"`python -m image_catalog build {entry['name']}`."
    )


def entry_of(view: dict) -> CatalogImage:
    """A store view back into a validated catalog entry (the spawner does the same)."""
    return parse_image({key: view[key] for key in view if key in _ENTRY_KEYS})


_ENTRY_KEYS = {*_PLAIN_FIELDS, "name", "groups", "resources", "owner"}


class ImageStore:
    def __init__(self, db: sessionmaker):
        self.db = db
        self._writing = threading.Lock()
        self._views: dict[str, dict] = {}
        # References the engine was last seen without; empty until it is looked at (and in Swarm
        # mode, where the images are on the nodes), so that nothing is withheld on a guess.
        self._absent: frozenset[str] = frozenset()
        self._reload()

    # -- reads (from memory) ---------------------------------------------------------------------

    def all(self) -> list[dict]:
        return [self._copy(view) for view in self._views.values()]

    def get(self, name: str) -> dict:
        view = self._views.get(name)
        if view is None:
            raise ImageError(f"No image named {name!r} in the catalog.", "not_found")
        return self._copy(view)

    def _copy(self, view: dict) -> dict:
        return {**copy.deepcopy(view), "on_engine": view["image"] not in self._absent}

    def note_engine_images(self, present: set[str]) -> None:
        """What the engine holds now (its image references): entries whose reference it lacks are
        not offered until it has them."""
        self._absent = frozenset(v["image"] for v in self._views.values()) - present

    def pin_digests(self, found: dict[str, str]) -> list[str]:
        """Pin each entry not pinned yet to the registry digest its reference has now (`found`:
        reference → digest); the references whose tag has moved since they were pinned, which
        keep their pin (registry_images.py)."""
        unpinned = [v for v in self._views.values() if not v["digest"] and v["image"] in found]
        if unpinned:
            with self._writing, self._reloading(), self.db.begin() as db:
                for view in unpinned:
                    self._load(db, view["name"]).digest = found[view["image"]]
        return sorted(
            v["image"]
            for v in self._views.values()
            if v["digest"] and v["image"] in found and found[v["image"]] != v["digest"]
        )

    def find(self, name: str) -> dict | None:
        """The entry named `name`, or None."""
        try:
            return self.get(name)
        except ImageError:
            return None

    def visible_to(
        self,
        user: str,
        groups: tuple[str, ...],
        admin: bool = False,
        created: datetime | str | None = None,
    ) -> list[dict]:
        """The images this user (the account made at `created`) may start, as the spawn form
        offers them."""
        return [
            e
            for e in self.all()
            if refusal(e, user, groups, admin, created) is None and not missing_from_engine(e)
        ]

    def manageable_by(self, user: str, admin: bool) -> list[dict]:
        """What the Images page lists for a manager: everything but others' private images,
        which only admins see."""
        return [e for e in self.all() if admin or not e["owner"] or e["owner"] == user]

    def admit(
        self,
        name: str,
        user: str,
        groups: tuple[str, ...],
        admin: bool = False,
        size: tuple[float, int, float] | None = None,
        created: datetime | str | None = None,
    ) -> dict:
        """The image `user` (the account made at `created`) asks for, if they may start it at
        `size` (cpu, mem, fgpu).

        Unknown images and sizes outside the image's bounds are 400s; images the user may not
        use are 403s.
        """
        try:
            entry = self.get(name)
        except ImageError:
            raise ImageError(f"Unknown image {name!r}.", "invalid") from None
        reason = refusal(entry, user, groups, admin, created)
        if reason:
            raise ImageError(reason, "forbidden")
        missing = missing_from_engine(entry)
        if missing:
            raise ImageError(missing, "conflict")
        if size is not None:
            shortfall = entry_of(entry).resources.shortfall(*size)
            if shortfall:
                raise ImageError(f"Image {name!r} {shortfall}.", "invalid")
        return entry

    def admit_options(self, person: dict, options: dict) -> dict | None:
        """`admit` for a hub user model and spawn options (contract 3's keys).

        Sizes are checked where they can be read (the grant request's numbers; a form's strings
        reach the grant later). No image named: the spawner's default applies, checked at grant.
        """
        name = options.get("image")
        if not name:
            return None
        return self.admit(
            str(name),
            person["name"],
            tuple(person.get("groups", [])),
            admin=bool(person.get("admin")),
            size=_size_of(options),
            created=person.get("created"),
        )

    # -- changes ---------------------------------------------------------------------------------

    def add(
        self,
        image: CatalogImage,
        source: str = "api",
        check: CheckResult | None = None,
        owner_created: datetime | str | None = None,
    ):
        """Add an entry; a private one belongs to the owner's account made at `owner_created`
        (None: to whoever has the owner's name)."""
        record = ImageRecord(name=image.name, source=source, created=utcnow())
        _fill(record, image)
        _set_owner_account(record, image, account_time(owner_created))
        _record_check(record, check)
        try:
            with self._writing, self._reloading(), self.db.begin() as db:
                db.add(record)
        except IntegrityError:
            raise ImageError(
                f"An image named {image.name!r} is already in the catalog.", "conflict"
            ) from None
        return self.get(image.name)

    def update(
        self,
        image: CatalogImage,
        check: CheckResult | None = None,
        owner_created: datetime | str | None = None,
    ) -> dict:
        """Change an entry. `owner_created` hands a private image to that account of its owner;
        without it, the owner's account stays as it was unless the owner changes."""
        with self._writing, self._reloading(), self.db.begin() as db:
            record = self._load(db, image.name)
            owner_before = record.owner
            _fill(record, image)
            if image.owner != owner_before or owner_created is not None:
                _set_owner_account(record, image, account_time(owner_created))
            if check is not None:
                _record_check(record, check)
        return self.get(image.name)

    def record_check(self, name: str, check: CheckResult) -> dict:
        with self._writing, self._reloading(), self.db.begin() as db:
            _record_check(self._load(db, name), check)
        return self.get(name)

    def delete(self, name: str) -> dict:
        with self._writing, self._reloading(), self.db.begin() as db:
            record = self._load(db, name)
            view = _view(record)
            db.delete(record)
        return view

    def seed(self, catalog: Catalog) -> dict[str, list[str]]:
        """Bring catalog.yaml's entries in without undoing an instructor's edit or deletion."""
        done: dict[str, list[str]] = {"added": [], "updated": []}
        with self._writing, self._reloading(), self.db.begin() as db:
            for image in catalog.images:
                new = image.to_dict()
                seed = db.get(ImageSeed, image.name)
                record = db.scalar(select(ImageRecord).where(ImageRecord.name == image.name))
                if seed is None:
                    if record is None:
                        record = ImageRecord(name=image.name, source="seed", created=utcnow())
                        _fill(record, image)
                        db.add(record)
                        done["added"].append(image.name)
                    db.add(ImageSeed(name=image.name, entry_json=json.dumps(new)))
                    continue
                old = json.loads(seed.entry_json)
                if old == new:
                    continue
                if record is not None and _merge_seed(record, old, new):
                    done["updated"].append(image.name)
                seed.entry_json = json.dumps(new)
        return done

    @contextlib.contextmanager
    def _reloading(self):
        """Reload the copy in memory after the write inside commits (or fails: nothing changed
        then, and reloading is harmless)."""
        try:
            yield
        finally:
            self._reload()

    def _reload(self) -> None:
        with self.db() as db:
            records = db.scalars(select(ImageRecord).order_by(ImageRecord.id))
            self._views = {record.name: _view(record) for record in records}

    def _load(self, db, name: str) -> ImageRecord:
        record = db.scalar(select(ImageRecord).where(ImageRecord.name == name))
        if record is None:
            raise ImageError(f"No image named {name!r} in the catalog.", "not_found")
        return record


def _size_of(options: dict) -> tuple[float, int, float] | None:
    try:
        return float(options["cpu"]), parse_size(options["mem"]), float(options.get("fgpu") or 0)
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def _merge_seed(record: ImageRecord, old: dict, new: dict) -> bool:
    """Apply the file's change to each field still as the file had it; True if any changed."""
    current = _entry_dict(record)
    merged = {
        key: new[key] if current.get(key) == old.get(key) else current[key]
        for key in current
        if key != "name"
    }
    if merged == {k: v for k, v in current.items() if k != "name"}:
        return False
    try:
        image = parse_image({"name": record.name, **merged})
    except CatalogError:
        # The file's change contradicts an instructor's edit (say, min above their max): the
        # instructor's version stands.
        return False
    _fill(record, image)
    return True


def _fill(record: ImageRecord, image: CatalogImage) -> None:
    if record.image != image.image:
        record.digest = None  # another image: pinned again when the registry is next asked
    for key in _PLAIN_FIELDS:
        setattr(record, key, getattr(image, key))
    record.owner = image.owner
    record.groups_json = json.dumps(list(image.groups))
    record.resources_json = json.dumps(image.resources.to_dict())
    record.updated = utcnow()


def _set_owner_account(record: ImageRecord, image: CatalogImage, created: datetime | None) -> None:
    record.owner_created = created if image.owner else None


def _record_check(record: ImageRecord, check: CheckResult | None) -> None:
    if check is not None:
        record.check_ok, record.check_message = check.ok, check.message
        record.checked_at = check.checked_at
        # An admin looked at the image as it is now: pin it again to what its tag holds.
        record.digest = None


def _entry_dict(record: ImageRecord) -> dict:
    return {
        "name": record.name,
        **{key: getattr(record, key) for key in _PLAIN_FIELDS},
        "groups": json.loads(record.groups_json),
        "resources": json.loads(record.resources_json),
        "owner": record.owner,
    }


def _view(record: ImageRecord) -> dict:
    return {
        **_entry_dict(record),
        "source": record.source,
        "check": {
            "ok": record.check_ok,
            "message": record.check_message,
            "checked_at": _iso(record.checked_at),
        },
        "owner_created": _iso(record.owner_created),
        "digest": record.digest,
        "created": _iso(record.created),
        "updated": _iso(record.updated),
    }


def _iso(moment: datetime | None) -> str | None:
    return as_utc(moment).isoformat() if moment else None
