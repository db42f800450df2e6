"""`api/images`: the catalog's REST API (docs/source/explanation/contracts.md, contract 4), and the Images page's rights.

- `GET api/images`: the images the caller may start. Managers add `?all=1` for everything they
  manage; admins and the spawner add `?user=NAME` for what NAME may start (an instructor naming
  someone else is refused: the answer would list that user's private images).
- `GET api/images/NAME[?user=]`: one image, if the caller (or NAME's user) may start it: 403
  when not allowed, 404 when unknown.
- `POST api/images`, `PATCH` / `DELETE api/images/NAME`, `POST api/images/NAME/check`: managers only.
  Showing a hidden image (`PATCH {"hidden": false}`) needs it on the engine: else 409, with why.

With `?all=1`, each entry also carries `build`: the background build of a heavy image
(`image_builds.py`: queued, building with its step, built, failed with the reason), or null;
and `nodes`, in Swarm mode, where the nodes pull the catalog's images ahead
(engine/image_prepull.py): `{present, of, nodes: [{node, state, error?, retry_in_s?}]}`, on how
many of the nodes that can run it the image is, and each one's state (`present`, `pulling`,
`failed` with its error, `missing`, `unknown` for a node whose agent is silent); null for an
image no node pulls ahead (hidden, private, not in the registry) and in single-host mode.

Managers are admins and holders of the `custom:images:manage` scope (the hub's `instructors`
group), and a course's instructors for the images offered only to courses they teach
(course_images.py). Adding an image, or pointing one at a new reference, checks it on the engine first:
nothing is written unless the image is there and starts jupyterhub-singleuser.
"""

from __future__ import annotations

import asyncio

from tornado import web

from image_catalog import CatalogError, parse_image
from image_catalog.labels import LabelError, entry_fields_from_labels
from queue_service.core import query_args
from queue_service.core.scopes import MANAGE_SCOPE
from queue_service.store.images import CheckResult, ImageError, entry_of
from queue_service.store.models import utcnow

from .. import course_images
from ..image_check import check_singleuser, image_labels
from ..private_images import refuse_private_image
from .base import BaseHandler, filtered_grant, scope_holds


def routes(prefix: str) -> list:
    return [
        (prefix + r"api/images", ImagesHandler),
        (prefix + r"api/images/([a-z0-9][a-z0-9._-]*)", ImageHandler),
        (prefix + r"api/images/([a-z0-9][a-z0-9._-]*)/check", ImageCheckHandler),
    ]


def has_manage_scope(identity: dict) -> bool:
    """Whether the caller curates the catalog. Only the scope itself counts: a filtered grant
    (`custom:images:manage!group=x`) is refused with a message (`refuse_filtered_grant`), never
    taken as the whole catalog."""
    return scope_holds(identity.get("scopes", []), MANAGE_SCOPE)


def refuse_filtered_grant(identity: dict) -> None:
    scopes = identity.get("scopes", [])
    partial = filtered_grant(scopes, MANAGE_SCOPE)
    if partial and not scope_holds(scopes, MANAGE_SCOPE):
        raise web.HTTPError(
            403,
            f"This token holds {partial}: catalog rights limited to a group are not supported. "
            f"Ask an admin for the {MANAGE_SCOPE} role itself (the instructors group).",
        )


class ImageAPIHandler(BaseHandler):
    query_arguments = {"user": "text"}  # `subject`: whose images a read is about

    async def caller(self) -> tuple[dict | None, bool]:
        """(the calling person or None for the spawner, whether the caller manages images)."""
        identity = self.identity()
        if identity.get("kind") == "service":
            if identity.get("name") != self.spawner_service:
                raise web.HTTPError(403, "Only users and the hub's spawner read the catalog.")
            return None, True
        refuse_filtered_grant(identity)
        person = await self.person()
        return person, person["admin"] or has_manage_scope(identity)

    async def curator(self, *entries: dict | None) -> dict:
        """The calling person, if they may change these catalog entries (as they are and as
        they would be): the whole catalog's curators (the scope, admins) any, a course's
        instructors those offered only to courses they teach (course_images.py); else 403."""
        person, manages = await self.caller()
        if person is not None and manages:
            return person
        if person is not None:
            taught = await self.from_hub(course_images.courses_taught(self.hub, person))
            refusal = course_images.refusal(taught, [e for e in entries if e is not None])
            if refusal is None:
                return {**person, "courses_taught": taught}
            if taught:
                raise web.HTTPError(403, refusal)
        raise web.HTTPError(
            403, f"Changing the image catalog needs the {MANAGE_SCOPE} scope (instructors)."
        )

    async def refuse_private_changes(self, person: dict, body: dict, current: dict | None = None):
        """Instructors curate the shared catalog; a private image is its owner's, and only admins
        make, change or hand one over (from a session: POST sessions/{id}/image). An image is
        known as private by what the engine resolves its reference to, not by its spelling."""
        if person.get("admin"):
            return
        if current is not None and current.get("owner"):
            raise web.HTTPError(
                403, f"{current['name']} is a private image; only admins change it."
            )
        if body.get("owner"):
            raise web.HTTPError(403, "Only admins give an image an owner.")
        await asyncio.to_thread(refuse_private_image, self.docker, body.get("image"))

    async def owner_account(self, body: dict) -> str | None:
        """The creation time of the account a private image is given to (admins name `owner`):
        naming the owner again hands the image to the account that has that name now."""
        if not body.get("owner"):
            return None
        return await self.from_hub(self.hub.account_created(body["owner"]))

    async def subject(self) -> dict:
        """Whose permissions a read is about: `?user=` (admins, the spawner) or the caller.
        Instructors curate the shared catalog, not people's private images: naming another
        user is theirs no more than a student's."""
        person, _ = await self.caller()
        name = self.get_argument("user", "")
        if not name:
            if person is None:
                raise web.HTTPError(400, "The spawner must name the user: ?user=NAME.")
            return person
        if person is not None and not person["admin"] and name != person["name"]:
            raise web.HTTPError(403, "Only admins may look up the images of another user.")
        # Read now: the spawn form must not offer an earlier account's private images.
        return await self.from_hub(self.hub.user_now(name))

    async def checked(self, reference: str, body: dict) -> tuple:
        """The image's own labels under `body`, validated, and its check: or a 400 that says why."""
        client = self.docker
        labels = await asyncio.to_thread(image_labels, client, reference)
        try:
            image = parse_image({**entry_fields_from_labels(labels), **body})
        except (CatalogError, LabelError) as e:
            raise web.HTTPError(400, str(e)) from None
        check = await asyncio.to_thread(check_singleuser, client, reference)
        if not check.ok:
            raise web.HTTPError(400, f"Image {reference}: {check.message}")
        return image, check

    async def refuse_unbuilt(self, name: str, reference: str) -> None:
        """409 when the engine lacks the image: offering it would only fail every launch."""
        try:
            await asyncio.to_thread(image_labels, self.docker, reference)
        except ImageError as e:
            if e.cause != "invalid":
                raise
            build = self.image_builds.view().get(name)
            under_way = f" Its build is {build['state']}." if build else ""
            raise web.HTTPError(
                409,
                f"{name} cannot be offered: {reference} is not on this host's Docker engine."
                f"{under_way} Build it first (python -m image_catalog build {name}), then Show.",
            ) from None


class ImagesHandler(ImageAPIHandler):
    query_arguments = {"all": "flag", **ImageAPIHandler.query_arguments}

    @web.authenticated
    async def get(self):
        if query_args.flag(self.get_argument("all", ""), "all", False):
            person = await self.curator()
            builds = self.image_builds.view()
            on_nodes = self.engine_backend.images_on_nodes()
            per_image = on_nodes[0] if on_nodes else {}
            images = [
                {
                    **image,
                    "build": builds.get(image["name"]),
                    "nodes": nodes_seen_by(per_image.get(image["name"]), person["admin"]),
                }
                for image in self.images.manageable_by(person["name"], person["admin"])
                if course_images.may_manage(person.get("courses_taught"), image)
            ]
        else:
            user = await self.subject()
            images = self.images.visible_to(
                user["name"],
                tuple(user.get("groups", [])),
                bool(user.get("admin")),
                created=user.get("created"),
            )
        self.write_json({"images": images})

    @web.authenticated
    async def post(self):
        body = self.body()
        person = await self.curator(body)
        await self.refuse_private_changes(person, body)
        try:
            parse_image(body)
        except CatalogError as e:
            raise web.HTTPError(400, str(e)) from None
        if self.images.find(body["name"]) is not None:
            raise web.HTTPError(409, f"An image named {body['name']!r} is already in the catalog.")
        image, check = await self.checked(body["image"], body)
        owner_created = await self.owner_account(body)
        added = await asyncio.to_thread(
            self.images.add, image, check=check, owner_created=owner_created
        )
        self.write_json(added, 201)


class ImageHandler(ImageAPIHandler):
    @web.authenticated
    async def get(self, name):
        user = await self.subject()
        self.write_json(self.images.admit_options(user, {"image": name}))

    @web.authenticated
    async def patch(self, name):
        changes = self.body()
        found = self.images.find(name)  # the catalog's curators learn of a missing one, not others
        person = await self.curator(found, found and {**found, **changes})
        current = self.images.get(name)
        await self.refuse_private_changes(person, changes, current)
        if changes.get("name", name) != name:
            raise web.HTTPError(400, "An image cannot be renamed; add it under the new name.")
        merged = {**entry_of(current).to_dict(), **changes, "name": name}
        try:
            image = parse_image(merged)
        except CatalogError as e:
            raise web.HTTPError(400, str(e)) from None
        check = None
        if image.image != current["image"]:
            _, check = await self.checked(image.image, merged)
        elif current["hidden"] and not image.hidden:
            await self.refuse_unbuilt(name, image.image)
        owner_created = await self.owner_account(changes)
        updated = await asyncio.to_thread(
            self.images.update, image, check=check, owner_created=owner_created
        )
        self.write_json(updated)

    @web.authenticated
    async def delete(self, name):
        person = await self.curator(self.images.find(name))
        current = self.images.get(name)
        await self.refuse_private_changes(person, {}, current)
        self.write_json(await asyncio.to_thread(self.images.delete, name))


class ImageCheckHandler(ImageAPIHandler):
    """POST api/images/NAME/check: check again (after a rebuild, say) and record the result."""

    @web.authenticated
    async def post(self, name):
        await self.curator(self.images.find(name))
        reference = self.images.get(name)["image"]
        client = self.docker
        try:
            await asyncio.to_thread(image_labels, client, reference)
            check = await asyncio.to_thread(check_singleuser, client, reference)
        except ImageError as e:
            check = CheckResult(False, e.message, utcnow())
        # What the engine holds decides what the launcher offers: look again now.
        await asyncio.to_thread(self.look_at_engine_images)
        self.write_json(await asyncio.to_thread(self.images.record_check, name, check))


def nodes_seen_by(view: dict | None, admin: bool) -> dict | None:
    """An image's state on the nodes: an instructor sees how many hold it, an admin also which
    nodes, and why a pull failed (node names and registry errors are the cluster's, not a
    course's)."""
    if view is None or admin:
        return view
    return {key: view[key] for key in ("present", "pulling", "of")}
