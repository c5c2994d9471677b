"""A stand-in for the Hugging Face hub's HTTP API, enough for huggingface_hub's `list_repo_files`
and `hf_hub_download` (and so for `-hf`): the file tree of a revision, and each file's resolve URL
(HEAD with the commit, ETag and size headers the client reads; GET with ranges). Repositories are
{"user/repo": {"path": bytes}}; "gated" and "private" ones answer as the hub answers those.
Every request is recorded in `seen`. A file named in `slow` is sent 4 KiB at a time, that many
seconds apart (a download long enough to be cancelled); `slow_tree` delays every file listing by
that many seconds (a POST /models still checking its reference).
"""

from __future__ import annotations

import asyncio
import hashlib

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubStub:
    def __init__(self, repos: dict[str, dict[str, bytes]], gated: tuple[str, ...] = (),
                 slow: dict[str, float] | None = None) -> None:
        self.repos, self.gated, self.seen, self.slow = repos, gated, [], slow or {}
        self.slow_tree = 0.0
        self.app = Starlette(routes=[
            Route("/api/models/{user}/{repo}/tree/{rev:path}", self.tree, methods=["GET"]),
            Route("/{user}/{repo}/resolve/{rev}/{file:path}", self.resolve, methods=["GET", "HEAD"]),
        ])

    def _repo(self, request: Request) -> tuple[str, dict[str, bytes] | Response]:
        name = f"{request.path_params['user']}/{request.path_params['repo']}"
        self.seen.append(f"{request.method} {request.url.path}")
        if name in self.gated:
            return name, Response("gated", 403, headers={"X-Error-Code": "GatedRepo",
                                                          "X-Error-Message": "Access to model is restricted"})
        if name not in self.repos:
            return name, Response("not found", 404, headers={"X-Error-Code": "RepoNotFound",
                                                              "X-Error-Message": "Repository not found"})
        return name, self.repos[name]

    async def tree(self, request: Request) -> Response:
        _, files = self._repo(request)   # (recorded in `seen` before the delay)
        await asyncio.sleep(self.slow_tree)
        if isinstance(files, Response):
            return files
        return JSONResponse([{"type": "file", "path": p, "oid": _sha(b)[:40], "size": len(b),
                              "lfs": {"oid": _sha(b), "size": len(b), "pointerSize": 130}} for p, b in files.items()])

    async def resolve(self, request: Request) -> Response:
        _, files = self._repo(request)
        if isinstance(files, Response):
            return files
        data = files.get(request.path_params["file"])
        if data is None:
            return Response("no such file", 404, headers={"X-Error-Code": "EntryNotFound"})
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{_sha(data)}"', "Accept-Ranges": "bytes"}
        start = 0
        if (rng := request.headers.get("range", "")).startswith("bytes="):
            start = int(rng[6:].split("-")[0] or 0)
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = b"" if request.method == "HEAD" else data[start:]
        headers["Content-Length"] = str(len(data) - start)
        if body and (pause := self.slow.get(request.path_params["file"])):
            return StreamingResponse(_trickle(body, pause), 206 if start else 200, headers=headers)
        return Response(body, 206 if start else 200, headers=headers)


async def _trickle(body: bytes, pause: float):
    for i in range(0, len(body), 4096):
        yield body[i:i + 4096]
        await asyncio.sleep(pause)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
