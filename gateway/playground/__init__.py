"""The logprob playground: one static page that streams through this gateway's own /v1/responses.

On only with `playground: true` (the demo turns it on). No build step and nothing from the network:
the page, its script and its styles are package data, read once when the app is built and served
from memory under a Content-Security-Policy that lets the page talk to this origin alone.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

PAGE_PATH = "/playground"
ASSET_PREFIX = "/playground/static/"

# name -> content type; nothing else under static/ is served.
_ASSETS = {
    "playground.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
}

_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return (resources.files(__package__) / "static" / name).read_bytes()


def add_playground(app: web.Application) -> None:
    """Serve the page at GET /playground and its two assets under /playground/static/.

    The page uses relative URLs (`v1/models`, `v1/responses`, `playground/static/...`), so it also
    works behind a proxy that mounts the gateway under a path prefix.
    """
    page = _read("index.html")
    assets = {name: (_read(name), content_type) for name, content_type in _ASSETS.items()}

    async def serve_page(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8", headers=_HEADERS)

    async def serve_asset(request: web.Request) -> web.Response:
        found = assets.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound(reason="no such playground file")
        body, content_type = found
        return web.Response(body=body, headers={**_HEADERS, "Content-Type": content_type})

    async def drop_slash(request: web.Request) -> web.Response:
        raise web.HTTPFound("../playground")

    app.router.add_get(PAGE_PATH, serve_page)
    app.router.add_get(PAGE_PATH + "/", drop_slash)
    app.router.add_get(ASSET_PREFIX + "{name}", serve_asset)
