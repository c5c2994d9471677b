"""The web page at `/`: a chat and a live monitor, as static files from slotserver/server/webui/.

GET /              index.html
GET /webui/NAME    the page's scripts and style sheet: one route per file in that folder when the
                   app is built (no path parameter, so nothing outside the folder can be asked for;
                   a file's content is read on each request, so an edit shows on reload)

The page holds no data and no secrets, so it is public even with --api-key (auth.py lists these
paths); everything it shows comes from the API, with the key the user types into the page.
`--no-webui` leaves these routes out (404 at /), as in llama-server.

Every answer carries a strict Content-Security-Policy: scripts and styles only from this origin,
no inline code, no framing, no plugins. The page renders model text with textContent only
(webui/render.js), and the policy is the second line of defence should that ever slip.
"""

from __future__ import annotations

from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

WEBUI_DIR = Path(__file__).resolve().parent.parent / "webui"
ASSET_PREFIX = "/webui/"

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'")

# served types by suffix; a file of any other suffix in the folder is not served
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}

SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # the files change when the package changes (or while someone edits them): always revalidate
    "Cache-Control": "no-cache",
}


def is_webui_path(path: str) -> bool:
    """The page and its files: public (auth.py) and served while the model loads (app.py)."""
    return path == "/" or path.startswith(ASSET_PREFIX)


def asset_names() -> dict[str, Path]:
    """Servable files by name (a handful of entries)."""
    if not WEBUI_DIR.is_dir():
        return {}
    return {p.name: p for p in WEBUI_DIR.iterdir() if p.is_file() and p.suffix in CONTENT_TYPES}


def _file_response(path: Path) -> Response:
    return Response(path.read_bytes(), media_type=CONTENT_TYPES[path.suffix], headers=SECURITY_HEADERS)


async def index(request: Request) -> Response:
    page = asset_names().get("index.html")
    if page is None:
        raise HTTPException(404, "the web UI files are missing from this installation")
    return _file_response(page)


def _asset(path: Path):
    async def asset(request: Request) -> Response:
        if not path.is_file():
            raise HTTPException(404, f"the web UI file {path.name} is missing")
        return _file_response(path)
    return asset


def routes() -> list[Route]:
    """/ and one route per servable file, from the folder as it is now."""
    files = asset_names()
    out = [Route("/", index, methods=["GET", "HEAD"])]
    out += [Route(ASSET_PREFIX + name, _asset(path), methods=["GET", "HEAD"])
            for name, path in sorted(files.items()) if name != "index.html"]
    return out
