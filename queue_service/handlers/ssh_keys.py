"""`api/ssh-keys`: the public keys that log you in over SSH and SFTP (queue_service/ssh/,
docs/source/howto/ssh.md), kept per hub account by the service (store/ssh_keys.py).

- `GET api/ssh-keys`: your keys `{id, title, fingerprint, key, created}`;
- `POST api/ssh-keys {key, title?}`: add one (an OpenSSH public key line; 201);
- `DELETE api/ssh-keys/{id}`: remove one (204): its logins end with it.

Admins act for a user with `?user=NAME` (putting a student's key in for them). A key logs in as
its owner on any of their servers, as a token with the owner's own rights would; keys are users':
a service's token is refused.
"""

from __future__ import annotations

import asyncio

from tornado import web

from queue_service.store.accounts import Account

from .base import BaseHandler


def routes(prefix: str) -> list:
    api = prefix + r"api/ssh-keys"
    return [(api, SSHKeysHandler), (api + r"/([0-9]+)", SSHKeyHandler)]


class SSHKeyAPIHandler(BaseHandler):
    query_arguments = {"user": "text"}

    async def account(self) -> Account:
        """The caller's account, or (admins) the account of `?user=NAME` as the hub has it now."""
        person = await self.person()
        name = self.get_argument("user", "") or person["name"]
        if name != person["name"]:
            self.require_admin("Another user's SSH keys")
            return await self.account_of(name)
        return Account.of(person)


class SSHKeysHandler(SSHKeyAPIHandler):
    @web.authenticated
    async def get(self):
        account = await self.account()
        self.write_json({"keys": await asyncio.to_thread(self.ssh_keys.of, account)})

    @web.authenticated
    async def post(self):
        account = await self.account()
        body = self.body()
        added = await asyncio.to_thread(
            self.ssh_keys.add, account, body.get("key"), body.get("title", "")
        )
        self.write_json(added, 201)


class SSHKeyHandler(SSHKeyAPIHandler):
    @web.authenticated
    async def delete(self, key_id):
        account = await self.account()
        await asyncio.to_thread(self.ssh_keys.remove, account, int(key_id))
        self.set_status(204)
        self.finish()
