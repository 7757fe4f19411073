"""Where the LiteLLM plugin's router lives: in this process, or in sklocus serve.

Both answer the same three questions: which models the router serves, how it
ranks some of them for a text, and where an outcome goes.
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref

from sklocus.serve._service import RouterService, router_thread

# Seconds a served router's list of models is trusted before it is read again.
MODELS_TTL_S = 30.0


def service_of(router):
    """Return a RouterService of a router, a service or a model file's path."""
    from sklocus._persistence import load
    from sklocus._router import LocusRouter

    if isinstance(router, RouterService):
        return router
    if isinstance(router, str | os.PathLike):
        loaded = load(router)
        if not isinstance(loaded, LocusRouter):
            raise TypeError(
                f"{os.fspath(router)} holds a {type(loaded).__name__}; the plugin "
                "routes with a LocusRouter"
            )
        router = loaded
    if not isinstance(router, LocusRouter):
        raise TypeError(
            f"router is a {type(router).__name__}; give a fitted LocusRouter, a "
            "RouterService, the path of a router's model file or the URL of "
            "sklocus serve"
        )
    return RouterService(router)


class InProcess:
    """Ranks on the process's router thread, which every service shares."""

    def __init__(self, service):
        self.service = service

    async def models(self):
        return self.service.router.classes_.tolist()

    async def feedback(self, outcomes):
        return await asyncio.to_thread(self.service.feedback, outcomes)

    async def rank(self, text, exclude, k, policy):
        turns = self.service.route_in_turns(
            [text], exclude=exclude or None, k=k, **policy
        )
        routes = await router_thread.wait_turns(turns)
        return routes[0]["top"]


class Served:
    """Ranks through ``sklocus serve``'s POST /route."""

    def __init__(self, url, timeout, token):
        self.url = url
        self.timeout = timeout
        self.headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        # A client is bound to the event loop it was made in: one per loop.
        self._clients = weakref.WeakKeyDictionary()
        self._models, self._read_at = None, -float("inf")

    def _http(self):
        import httpx

        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            self._clients[loop] = httpx.AsyncClient(
                base_url=self.url, timeout=self.timeout
            )
        return self._clients[loop]

    async def models(self):
        if time.monotonic() - self._read_at > MODELS_TTL_S:
            response = await self._http().get("/models")
            response.raise_for_status()
            self._models = [model["name"] for model in response.json()["models"]]
            self._read_at = time.monotonic()
        return self._models

    async def rank(self, text, exclude, k, policy):
        body = {"queries": [text], "exclude": exclude, "k": k, **policy}
        response = await self._http().post("/route", json=body)
        if response.status_code == 422:
            # Perhaps a model retired since the list was read: read it again
            # next time, and say what the server refused.
            self._read_at = -float("inf")
            raise ValueError(f"the server refused the request: {_detail(response)}")
        response.raise_for_status()
        return response.json()["routes"][0]["top"]

    async def feedback(self, outcomes):
        response = await self._http().post(
            "/feedback", json={"outcomes": outcomes}, headers=self.headers
        )
        response.raise_for_status()
        return response.json()


def _detail(response):
    """Return the messages of a 4xx answer of sklocus serve, joined."""
    try:
        return "; ".join(fault["msg"] for fault in response.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}"
