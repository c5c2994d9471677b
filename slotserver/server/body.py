"""Reading a JSON request body safely: size limit while reading, content type, UTF-8, JSON object.

Content type: like llama-server, the body is parsed as JSON whatever the Content-Type says, so
`curl -d '{...}'` (which sends application/x-www-form-urlencoded) works. Routes that change what
code runs (the lab's verbs) pass `require_json_type=True`: they take only `application/json`
(415 otherwise). That is what keeps a web page out of them: a browser sends a cross-origin POST
without asking first (no CORS preflight) only with a form, text/plain or no content type, and
the preflight that application/json needs is never granted for those routes (see `cors.py`).

Every string in the parsed body must be valid Unicode (see `surrogates.py`).

The limit is enforced on the bytes as they arrive (a `Content-Length` above it is refused before
reading anything), so an enormous or endless body costs at most `limit` bytes of memory. A body
that is slow to arrive is cut off after the server's read timeout (`--timeout`).
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from starlette.requests import ClientDisconnect, Request

from slotserver.server.errors import ApiError, bad_request
from slotserver.server.surrogates import check_unicode

DEFAULT_BODY_LIMIT = 8 * 1024 * 1024


def require_json_content_type(request: Request) -> None:
    """415 unless the Content-Type is exactly application/json (parameters such as charset allowed).

    Strict on purpose: a missing header, `text/plain`, a form type or a list such as
    `application/json, text/plain` (which a browser reads as text/plain) are all refused, since a
    browser may send any of those cross-origin without a preflight.
    """
    raw = request.headers.get("content-type")
    ctype = (raw or "").split(";")[0].strip().lower()
    if ctype != "application/json":
        got = "no Content-Type" if raw is None else f"Content-Type {raw[:80]!r}"
        raise ApiError(415, f"this endpoint takes only Content-Type: application/json, got {got} "
                            "(curl: add -H 'Content-Type: application/json')")


def _check_length_header(request: Request, limit: int) -> None:
    declared = request.headers.get("content-length")
    if declared is None:
        return
    if not declared.strip().isdigit():
        raise bad_request("invalid Content-Length header")
    if int(declared) > limit:
        raise ApiError(413, f"request body is larger than the limit of {limit} bytes")


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The raw body, at most `limit` bytes (413 past it), within `timeout` seconds (408)."""
    _check_length_header(request, limit)
    chunks, size = [], 0
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"request body is larger than the limit of {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, f"request body not received within {timeout:g} s") from None
    except ClientDisconnect:
        raise bad_request("client disconnected while sending the body") from None
    return b"".join(chunks)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes, allow_empty: bool = False) -> dict:
    """Strict JSON (no NaN/Infinity) whose top level is an object; every failure is a 400."""
    if allow_empty and not raw.strip():
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not valid UTF-8 (byte {e.start})") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise bad_request(f"request body is not valid JSON: {detail[:200]}") from None
    if not isinstance(value, dict):
        raise bad_request(f"request body must be a JSON object, got {type(value).__name__}")
    check_unicode(text, value)
    return value


async def read_json(request: Request, limit: int = DEFAULT_BODY_LIMIT, timeout: float = 600.0,
                    allow_empty: bool = False, require_json_type: bool = False) -> dict:
    """The request's JSON object, checked in the order a client would fix things.

    The Content-Type is ignored (as llama-server) unless `require_json_type` (see the module doc).
    """
    if require_json_type:
        require_json_content_type(request)
    return parse_json_object(await read_body(request, limit, timeout), allow_empty)
