"""The Images page (`/services/queue/images`): instructors curate the catalog, students see theirs.

The page renders once; `static/images.js` does the rest through `api/images` (image_api), so the
page and the API can never disagree about who may change what. Managers (admins and holders of
`custom:images:manage`) get the add/edit/hide/restrict/delete/check controls.
"""

from __future__ import annotations

from tornado import web

from .image_api import has_manage_scope
from .pages import PageHandler


class ImagesPage(PageHandler):
    @web.authenticated
    async def get(self):
        person = await self.person()
        manager = bool(person.get("admin")) or has_manage_scope(self.get_current_user())
        config = {
            "api": self.settings["page_prefix"] + "api/",
            "user": person["name"],
            "manager": manager,
        }
        self.render_page("images.html", person, page_config=config)


def routes(prefix: str) -> list:
    return [(prefix + "images", ImagesPage)]
