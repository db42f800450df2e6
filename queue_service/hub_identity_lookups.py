"""Who a token belongs to, asked of the hub once per token at a time.

HubOAuth caches the hub's answer for a token, but asks again for every request that arrives
before the first answer is back. When a class starts at once, thousands of the spawner's grant
requests arrive with the same token while the hub's event loop is busy with their spawns: each
then sent its own `GET /hub/api/user`, every one of them waited behind the others, and hundreds
failed after 20 s (the service answered 502 "the hub answered 599"). Here the requests that
arrive while a token's question is out wait for that one answer (or its error).
"""

from __future__ import annotations

import asyncio

from jupyterhub.services.auth import HubOAuth


class SharedLookupHubOAuth(HubOAuth):
    """HubOAuth whose uncached token lookups are shared by the requests that need them at once."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._asking: dict[str, asyncio.Future] = {}

    async def _check_hub_authorization(self, url, api_token, cache_key=None, use_cache=True):
        if not use_cache or cache_key is None:
            return await super()._check_hub_authorization(url, api_token, cache_key, use_cache)
        try:
            return self.cache[cache_key]
        except KeyError:
            pass
        asked = self._asking.get(cache_key)
        if asked is None:
            lookup = super()._check_hub_authorization(url, api_token, cache_key, use_cache)
            asked = self._asking[cache_key] = asyncio.ensure_future(lookup)
            asked.add_done_callback(lambda _done: self._asking.pop(cache_key, None))
        # Shielded: one request that goes away does not end the lookup the others wait for.
        return await asyncio.shield(asked)
