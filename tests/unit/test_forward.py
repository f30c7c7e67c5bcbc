"""app.views.forward_get: a key's request forwarded to the worker that owns it (a real HTTP server here)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from app.localhost import free_port
from app.views import forward_get


@pytest.fixture
async def owner() -> AsyncIterator[tuple[URL, list[dict[str, str]]]]:
    """A worker-like server that records the headers of every request it gets."""
    seen: list[dict[str, str]] = []

    async def features(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        if request.query.get("slow"):
            await asyncio.sleep(2)
        if request.query.get("moved"):
            raise web.HTTPFound("http://elsewhere.example/")
        return web.json_response({"path": request.path_qs})

    server = web.Application()
    server.router.add_get("/features/{key}/", features)
    runner = web.AppRunner(server)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield URL(f"http://127.0.0.1:{port}/some/base/"), seen
    finally:
        await runner.cleanup()


async def test_only_the_path_goes_to_the_owner_never_the_callers_headers(
        owner: tuple[URL, list[dict[str, str]]]) -> None:
    url, seen = owner
    async with aiohttp.ClientSession() as client:
        status, body, content_type = await forward_get(client, url, "/features/c1/?x=1")
    assert (status, content_type) == (200, "application/json") and b'"/features/c1/?x=1"' in body
    assert set(seen[0]) <= {"Host", "Accept", "Accept-Encoding", "User-Agent"}, seen[0]


async def test_a_slow_owner_is_a_504_within_the_timeout_and_a_redirect_is_not_followed(
        owner: tuple[URL, list[dict[str, str]]]) -> None:
    url, _ = owner
    async with aiohttp.ClientSession() as client:
        # The owner answers 200 only after 2 s: a 504 is the timeout's, however slow this machine is.
        status, _, _ = await forward_get(client, url, "/features/c1/?slow=1", timeout_s=0.2)
        assert status == 504
        status, _, _ = await forward_get(client, url, "/features/c1/?moved=1")
        assert status == 302
        status, body, _ = await forward_get(client, URL(f"http://127.0.0.1:{free_port()}/"), "/features/c1/")
        assert status == 502 and b"could not be reached" in body
