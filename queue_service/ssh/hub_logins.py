"""Who logs in over SSH: the password is a hub API token, checked with the hub at each login; or
a public key the account keeps (`check_key`).

The hub answers `GET /hub/api/user` with the token's owner and the token's scopes, or refuses a
token that is unknown, expired or revoked; no token the hub took is cached, so a revoked token
opens nothing from the moment it is revoked. A token it refused is refused again without asking
it for a while (login_throttle.py: such a token never becomes valid). The login name must be the owner's (core/ssh_logins.py: the
owner's name, or `<owner>-<server>`), and the token must reach that server. Who the owner is
beyond that (their groups, their account's creation time, which tells a re-created user's files
from an earlier one's) is read with the service's own token, as for any request
(`HubClient.user`), since a token narrowed to `access:servers` cannot read it.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from queue_service.core.ssh_logins import reaches_server, server_of_login
from queue_service.hub_client import HubClient, HubError
from queue_service.store.accounts import Account
from queue_service.store.folders import Reader
from queue_service.store.ssh_keys import SSHKeyStore

from .login_throttle import RefusedTokens

#: What a hub API token looks like; anything else is refused before the hub is asked (a password
#: goes into an HTTP header).
TOKEN_RE = re.compile(r"[A-Za-z0-9_.\-]{8,256}")
#: The hub's answers for a token it does not take (unknown, expired, revoked).
TOKEN_REFUSED = (401, 403)


class HubUnanswered(Exception):
    """The hub did not answer about a login (down, restarting): the client is not at fault."""


@dataclass(frozen=True)
class Login:
    """A checked login: the hub user, the server it reaches ("" for the default one), and the
    reader their files are reached as (never with admin powers: SFTP is one's own files)."""

    user: str
    server: str
    reader: Reader


class TokenLogins:
    """Checks an SSH login name and its password (a hub API token) with the hub, or its public
    key against the keys the account keeps (store/ssh_keys.py)."""

    def __init__(self, hub: HubClient, keys: SSHKeyStore, log):
        self.hub = hub
        self.keys = keys
        self.log = log
        self.refused_tokens = RefusedTokens()

    async def check_key(self, name: str, key) -> Login | None:
        """The login of the account that keeps `key` and whose name the login name starts with
        (hub users' names may hold `-`: the key's owners settle it); None for a key no such
        account keeps, or whose account the hub no longer has (a later account of the same name
        does not inherit it). A key reaches every server of its owner."""
        for account in await asyncio.to_thread(self.keys.owners_of, key):
            server = server_of_login(name, account.name)
            if server is None:
                continue
            try:
                person = await self.hub.user_now(account.name)
            except (HubError, OSError) as e:
                self.log.info("SSH key login %r refused: %s", name, e)
                continue
            if Account.of(person) != account:
                continue
            groups = frozenset(person.get("groups") or ())
            return Login(account.name, server, Reader(account, groups))
        return None

    async def check(self, name: str, token: str) -> Login | None:
        """The login, or None: an unknown, expired or revoked token, another user's, or one that
        cannot reach the server the name says. HubUnanswered when the hub does not say."""
        if not TOKEN_RE.fullmatch(token) or token in self.refused_tokens:
            return None
        try:
            owner = await self.hub.token_owner(token)
        except (HubError, OSError) as e:
            if getattr(e, "status", None) not in TOKEN_REFUSED:
                self.log.warning("SSH login %r: the hub does not answer: %s", name, e)
                raise HubUnanswered(name) from e
            self.log.info("SSH login %r refused by the hub: %s", name, e)
            self.refused_tokens.add(token)
            return None
        user = owner.get("name") if owner.get("kind", "user") == "user" else None
        server = server_of_login(name, user) if user else None
        if server is None:
            self.log.info("SSH login %r refused: the token is not that user's", name)
            return None
        try:
            person = await self.hub.user(user)
        except (HubError, OSError) as e:
            self.log.warning("SSH login %r: the hub does not say who %s is: %s", name, user, e)
            raise HubUnanswered(name) from e
        groups = frozenset(person.get("groups") or ())
        if not reaches_server(owner.get("scopes") or (), user, server, groups):
            self.log.info("SSH login %r refused: the token cannot reach that server", name)
            return None
        return Login(user, server, Reader(Account.of(person), groups))


def extra_info_name(username: str) -> str:
    """Where a connection keeps the login checked for `username`: per name, so that what a
    channel reads is the login of the name the connection authenticated, whatever other names
    its client tried first."""
    return f"fgpu_login:{username}"


def channel_login(channel) -> Login:
    """The checked login of the connection a channel (or process) runs on."""
    return channel.get_extra_info(extra_info_name(channel.get_extra_info("username")))
