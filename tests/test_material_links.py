"""A course's material link, pure (queue_service/core/material_links.py): what a link may name,
the nbgitpuller query it becomes, and its signature."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from queue_service.core.errors import Refusal
from queue_service.core.material_links import (
    MaterialLink,
    open_path,
    parse_link,
    pull_query,
    sign,
    signed_by_service,
)

REPO = "https://git.example.edu/cs101/course.git"


def link(**args) -> MaterialLink:
    return parse_link({"repo": REPO, **args})


def test_a_link_names_repository_branch_file_and_app():
    made = link(branch="week-1", path="notebooks/intro.ipynb", app="notebook")
    assert made == MaterialLink(REPO, "week-1", "notebooks/intro.ipynb", "notebook")
    assert made.folder == "course"
    # The defaults: the repository's own branch, its top folder, JupyterLab.
    assert link() == MaterialLink(REPO, "", "", "lab")
    assert link(path="./a//b.ipynb").path == "a/b.ipynb"


@pytest.mark.parametrize(
    "repo",
    ["git://git.example.edu/course", "http://10.0.0.1:8080/course/", "https://h/c.git"],
)
def test_a_repository_is_fetched_over_http_https_or_git(repo):
    assert parse_link({"repo": repo}).repo == repo


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"repo": ""}, "repo is missing"),
        ({"repo": "file:///home/jovyan/.ssh"}, "http://, https://, git://"),
        ({"repo": "ext::sh -c touch% /tmp/x"}, "spaces or control characters"),
        ({"repo": "ssh://git@host/course.git"}, "http://, https://, git://"),
        ({"repo": "https:///course.git"}, "naming a host"),
        ({"repo": "https://me:secret@host/course.git"}, "user name or password"),
        ({"repo": "https://host/" + "c" * 500}, "longer than 500"),
        ({"repo": "https://host/c\n.git"}, "control characters"),
        ({"repo": "https://host/.."}, "repository's name"),
        ({"branch": "--upload-pack=touch"}, "branch must be"),
        ({"branch": "-x"}, "not a name git allows"),
        ({"branch": "a..b"}, "not a name git allows"),
        ({"branch": "a/"}, "not a name git allows"),
        ({"branch": "x" * 201}, "at most 200"),
        ({"path": "../.bashrc"}, "may not contain .."),
        ({"path": "week1/../../.bashrc"}, "may not contain .."),
        ({"path": "/etc/passwd"}, "relative"),
        ({"path": "a\\b"}, "backslashes"),
        ({"path": "a?b"}, "?#%"),
        ({"path": "a\x00b"}, "control characters"),
        ({"path": "p" * 1001}, "longer than 1000"),
        ({"app": "vscode"}, "app must be one of lab, notebook"),
    ],
)
def test_a_bad_part_is_refused_saying_which(args, says):
    with pytest.raises(Refusal) as refused:
        parse_link({"repo": REPO, **args})
    assert says in refused.value.message
    assert refused.value.cause == "invalid"


def pulled(made: MaterialLink) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(pull_query(made)).items()}


def test_the_pull_opens_the_file_in_the_app_asked_for():
    assert pulled(link(path="week1/intro.ipynb", branch="main")) == {
        "repo": REPO,
        "branch": "main",
        "targetpath": "course",
        "urlpath": "lab/tree/course/week1/intro.ipynb",
    }
    assert pulled(link(path="week1/intro.ipynb", app="notebook"))["urlpath"] == (
        "notebooks/course/week1/intro.ipynb"
    )
    assert pulled(link(path="data", app="notebook"))["urlpath"] == "tree/course/data"
    assert pulled(link())["urlpath"] == "lab/tree/course"
    assert "branch" not in pulled(link())


def test_a_link_is_signed_for_its_course_and_every_argument():
    key = b"k" * 32
    made = link(path="intro.ipynb")
    signature = sign(key, "cs101", made)
    assert signed_by_service(key, "cs101", made, signature)
    assert not signed_by_service(key, "cs102", made, signature)
    assert not signed_by_service(b"x" * 32, "cs101", made, signature)
    for changed in (
        link(path="other.ipynb"),
        link(path="intro.ipynb", branch="evil"),
        link(path="intro.ipynb", app="notebook"),
        parse_link({"repo": "https://evil.example/course.git", "path": "intro.ipynb"}),
    ):
        assert not signed_by_service(key, "cs101", changed, signature)
    assert not signed_by_service(key, "cs101", made, "")
    url = urlsplit(open_path("/services/queue/courses/cs101/open", made, signature))
    assert url.path == "/services/queue/courses/cs101/open"
    args = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert parse_link(args) == made and args["sig"] == signature
