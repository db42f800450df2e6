"""Who an SSH login is, and which server it reaches. Pure.

The SSH user name (docs/source/explanation/contracts.md, contract 9) is the hub user for their default server, or
`user-server` for a named one. Hub user names and server names may both hold `-`, so the name
alone is ambiguous (`ann-s-1` is user `ann-s-1`, or `ann`'s server `s-1`, or `ann-s`'s server
`1`); the password settles it: a hub API token says whose it is, and the login must be that user's
name, or that name, `-` and a server name.

The token must also hold the right to reach that server, as JupyterHub's scopes say:
`access:servers` unfiltered, or filtered to the user (`!user=ann`), to the server
(`!server=ann/name`; `ann/` for the default one) or to a group the user is in (`!group=x`). A
token narrowed to something else (`read:users` alone, say, or another server) opens nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

ACCESS = "access:servers"


def server_of_login(login: str, user: str) -> str | None:
    """The server name `login` names for the token's `user` ("" for the default server), or None
    when the login is not one of that user's."""
    if login == user:
        return ""
    prefix = f"{user}-"
    if login.startswith(prefix) and len(login) > len(prefix):
        return login[len(prefix) :]
    return None


def reaches_server(
    scopes: Iterable[str], user: str, server: str, groups: Iterable[str] = ()
) -> bool:
    """Whether a token holding `scopes` may reach `user`'s server `server`."""
    enough = {
        ACCESS,
        f"{ACCESS}!user={user}",
        f"{ACCESS}!server={user}/{server}",
        *(f"{ACCESS}!group={group}" for group in groups),
    }
    return not enough.isdisjoint(scopes)


def login_of(user: str, server: str) -> str:
    """The SSH user name that reaches `user`'s `server` (what the pages and the guide show)."""
    return f"{user}-{server}" if server else user
