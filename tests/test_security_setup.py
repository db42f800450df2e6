"""The machine setup (scripts/lib/) makes the tests' PostgreSQL role (`fgpu`, password `fgpu`,
CREATEDB) for scripts/test alone: scripts/up is also how a site installs the hub, and its server
must never hold a role whose password everyone knows.

Read through bash itself: the libraries are sourced and every function reachable from a script's
entry point (`declare -f`) is searched for the role's creation. Nothing is run."""

from __future__ import annotations

import re
import subprocess

from .harness import ROOT

LIBRARIES = ("scripts/lib/setup.sh", "scripts/lib/test_postgres.sh")
CREATES_ROLE = re.compile(r"CREATE\s+ROLE|createuser", re.IGNORECASE)


def function_bodies() -> dict[str, str]:
    """Every function the setup libraries define, by name, as bash prints it."""
    sources = " && ".join(f". {lib}" for lib in LIBRARIES if (ROOT / lib).exists())
    listing = subprocess.run(
        ["bash", "-c", f"{sources} && declare -f"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    bodies, name = {}, None
    for line in listing.splitlines():
        header = re.fullmatch(r"(\S+) \(\) ", line)
        if header:
            name = header.group(1)
            bodies[name] = ""
        elif name is not None:
            bodies[name] += line + "\n"
    return bodies


def reachable_from(entry_text: str, bodies: dict[str, str]) -> set[str]:
    """The functions `entry_text` calls, and the ones they call, and so on."""
    seen: set[str] = set()
    todo = [entry_text]
    while todo:
        text = todo.pop()
        for name, body in bodies.items():
            if name not in seen and re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text):
                seen.add(name)
                todo.append(body)
    return seen


def test_scripts_up_never_creates_a_postgres_role():
    bodies = function_bodies()
    up = (ROOT / "scripts/up").read_text()
    assert "setup_all" in reachable_from(up, bodies)
    creating = {name for name in reachable_from(up, bodies) if CREATES_ROLE.search(bodies[name])}
    assert creating == set(), f"scripts/up makes a PostgreSQL role through {creating}"
    assert not CREATES_ROLE.search(up)


def test_scripts_test_still_creates_the_tests_role_and_database():
    bodies = function_bodies()
    reached = reachable_from((ROOT / "scripts/test").read_text(), bodies)
    creating = [bodies[name] for name in reached if CREATES_ROLE.search(bodies[name])]
    assert creating, "scripts/test no longer makes the tests' PostgreSQL role"
    assert any("CREATEDB" in body and "CREATE DATABASE" in body for body in creating)
