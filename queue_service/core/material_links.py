"""A course's material by one link (contract 8): which repository, branch, file and app it names,
checked, and the two URLs it becomes. Pure, no I/O.

An instructor asks `GET api/courses/{name}/link?repo=URL&branch=B&path=P&app=lab|notebook` and
hands out the link it answers. That link is a service page,
`/services/queue/courses/{name}/open?repo=...` (handlers/material_links.py), not JupyterHub's
`/hub/user-redirect/git-pull?...`, by choice:

- the hub's redirect starts a missing server with the spawner's defaults, through the spawn form,
  so a student would start a session without the course's preset, and a full cluster would show
  them a spawn that fails instead of a place in the queue;
- the service page starts the session through the queue, as the Sessions page does (same
  quota, admission and images), with the course's preset when the course's group has presets;
  while the request is PENDING it shows why and looks again; once the session is granted it
  redirects to that session's nbgitpuller, `/user/<name>/<server>/git-pull?...` (`pull_query`),
  which clones the repository into the home, or merges it into the clone already there by
  nbgitpuller's rules (a student's edits win a conflict, a file they deleted comes back), and
  opens the file in the app asked for.

Following a link is a GET that may start a session, as nbgitpuller's own links (and JupyterHub's
`user-redirect`) are. What keeps that safe: the page only ever acts for the person who clicks,
on their own session, within their quota (the queue's checks); only members of the course are
served (anyone else gets 404 as for every course endpoint); and it only pulls a repository an
instructor of that course (or an admin) named: the link carries a signature (`sign`, keyed with
the service's secret) over the course, repository, branch, file and app, and a link someone
else made up or changed is refused. Each part is checked as well (`parse_link`), so that no link
can name a local path (`file://`, `ext::`), a path outside the clone, or git options.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from .errors import Refusal

#: The schemes a repository may be fetched over: no `file://` (the session's own disk) and no
#: `ext::` (a command), which git would otherwise take.
REPO_SCHEMES = ("http", "https", "git")
REPO_MAX = 500
BRANCH_MAX = 200
PATH_MAX = 1000
APPS = ("lab", "notebook")
#: A branch name git takes (`git check-ref-format --branch`), narrowed to plain characters.
_BRANCH_CHARS = re.compile(r"[A-Za-z0-9._/-]+")
#: Characters a repository's URL may not carry: controls and whitespace (they would end the URL,
#: or hide what it names from the person reading it). A file's path may hold spaces.
_UNPRINTABLE = re.compile(r"[\x00-\x20\x7f]")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f]")
#: Signs a file's path may not hold: nbgitpuller opens it by appending it to the session's URL.
_URL_SIGNS = re.compile(r"[\\?#%]")


@dataclass(frozen=True)
class MaterialLink:
    """What a material link names: `repo` (its URL), `branch` ("" for the repository's default),
    `path` (a file or folder in it, "" for the repository's top) and `app` (lab or notebook)."""

    repo: str
    branch: str
    path: str
    app: str

    @property
    def folder(self) -> str:
        """The folder of the home the repository is pulled into: its name, as nbgitpuller names
        it (the URL's last part), without `.git`."""
        name = urlsplit(self.repo).path.rstrip("/").rsplit("/", 1)[-1]
        return name.removesuffix(".git") or "material"

    def arguments(self) -> dict[str, str]:
        """The link's own query arguments (`api/courses/{name}/link`'s, `courses/{name}/open`'s)."""
        args = {"repo": self.repo, "branch": self.branch, "path": self.path, "app": self.app}
        return {key: value for key, value in args.items() if value}


def parse_link(args: dict[str, str]) -> MaterialLink:
    """The query arguments `repo`, `branch`, `path` and `app` → a MaterialLink, or a Refusal
    saying what is wrong with which."""
    link = MaterialLink(
        repo=_repo(args.get("repo", "")),
        branch=_branch(args.get("branch", "")),
        path=_path(args.get("path", "")),
        app=_app(args.get("app", "") or "lab"),
    )
    if link.folder in (".", ".."):
        raise Refusal("repo must end in the repository's name, e.g. https://host/course.git.")
    return link


def _repo(repo: str) -> str:
    if not repo:
        raise Refusal("repo is missing: give the repository's URL, e.g. https://host/course.git.")
    if len(repo) > REPO_MAX:
        raise Refusal(f"repo is longer than {REPO_MAX} characters.")
    if _UNPRINTABLE.search(repo):
        raise Refusal("repo may not contain spaces or control characters.")
    parts = urlsplit(repo)
    if parts.scheme.lower() not in REPO_SCHEMES or not parts.hostname:
        schemes = ", ".join(f"{s}://" for s in REPO_SCHEMES)
        raise Refusal(f"repo must be a URL starting with {schemes} and naming a host.")
    if parts.username or parts.password:
        # Every student would see it in the link.
        raise Refusal("repo may not carry a user name or password: use a public repository.")
    return repo


def _branch(branch: str) -> str:
    if not branch:
        return ""
    if len(branch) > BRANCH_MAX or not _BRANCH_CHARS.fullmatch(branch):
        raise Refusal(
            f"branch must be a branch name of letters, digits and ._/- (at most {BRANCH_MAX})."
        )
    if (
        branch.startswith(("-", "/", "."))
        or branch.endswith(("/", ".", ".lock"))
        or ".." in branch
        or "//" in branch
        or "/." in branch
    ):
        raise Refusal(f"branch {branch!r} is not a name git allows for a branch.")
    return branch


def _path(path: str) -> str:
    if not path:
        return ""
    if len(path) > PATH_MAX:
        raise Refusal(f"path is longer than {PATH_MAX} characters.")
    if _CONTROLS.search(path) or _URL_SIGNS.search(path):
        raise Refusal("path may not contain control characters, backslashes or any of ?#%.")
    if path.startswith("/"):
        raise Refusal("path must be relative to the repository's top, not start with /.")
    if ".." in path.split("/"):
        raise Refusal("path may not contain .. : it names a file inside the repository.")
    return posixpath.normpath(path)


def _app(app: str) -> str:
    if app not in APPS:
        raise Refusal(f"app must be one of {', '.join(APPS)}, not {app[:40]!r}.")
    return app


def sign(key: bytes, course: str, link: MaterialLink) -> str:
    """The link's signature: only who holds the service's key (the service, for a course's
    instructors and admins) can make one for this course and these arguments."""
    text = json.dumps([course, link.repo, link.branch, link.path, link.app])
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:32]


def signed_by_service(key: bytes, course: str, link: MaterialLink, signature: str) -> bool:
    return hmac.compare_digest(sign(key, course, link), signature)


def open_path(course_page: str, link: MaterialLink, signature: str) -> str:
    """The link students follow: the service's page `course_page` (…/courses/{name}/open)
    with the link's arguments and signature."""
    return f"{course_page}?{urlencode({**link.arguments(), 'sig': signature})}"


def pull_query(link: MaterialLink) -> str:
    """nbgitpuller's `git-pull` query: pull into the home's `folder`, then open `path` there in
    the app asked for (`urlpath`, under the session's own URL)."""
    target = link.folder if not link.path else f"{link.folder}/{link.path}"
    if link.app == "lab":
        opened = "lab/tree/" + target
    elif link.path.endswith(".ipynb"):
        opened = "notebooks/" + target
    else:
        opened = "tree/" + target
    args = {"repo": link.repo, "targetpath": link.folder, "urlpath": opened}
    if link.branch:
        args["branch"] = link.branch
    return urlencode(args)
