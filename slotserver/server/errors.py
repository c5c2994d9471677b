"""HTTP errors in llama-server's (and OpenAI's) JSON shape, and the handlers that produce them.

Every error a client can see is `{"error": {"code": N, "message": "...", "type": "..."}}` with the
matching status. Routes raise `ApiError`; starlette's own 404/405 become the same shape; anything
unexpected is logged with its traceback and answered with a 500 of that shape, so a bad request
can never take the server down or leak a traceback.
"""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from slotserver.server.asgi_http import HttpMiddleware, StatusRecorder
from slotserver.server.jsonio import JSONResp, dumps

log = logging.getLogger("slotserver.http")

# llama-server's error types by status (server/utils.hpp format_error_response).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "unavailable_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class ApiError(Exception):
    """An error answer: status, one-line message, and llama-server's error type for the status."""

    def __init__(self, status: int, message: str, type: str | None = None, headers: dict | None = None,
                 extra: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        fallback = "server_error" if status >= 500 else "invalid_request_error"
        self.type = type or ERROR_TYPES.get(status, fallback)
        self.headers = headers
        self.extra = extra or {}   # more fields of the error object (n_prompt_tokens, n_ctx...)

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message, "type": self.type, **self.extra}}

    def response(self) -> JSONResp:
        return JSONResp(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def loading_error() -> ApiError:
    return ApiError(503, "Loading model", "unavailable_error")


def not_supported(message: str) -> ApiError:
    return ApiError(501, message, "not_supported_error")


def model_not_found(model_id: str) -> ApiError:
    """OpenAI's answer to retrieving an unknown model (its `code` is a string there), so an SDK
    sees the same error it would from OpenAI."""
    return ApiError(404, f"The model `{model_id}` does not exist.", "invalid_request_error",
                    extra={"code": "model_not_found", "param": None})


async def api_error_handler(request: Request, exc: Exception) -> JSONResp:
    assert isinstance(exc, ApiError)
    return exc.response()


_HTTP_MESSAGES = {404: "File Not Found", 405: "Method Not Allowed"}


async def http_exception_handler(request: Request, exc: Exception) -> JSONResp:
    """Starlette's routing errors (unknown route, wrong method) in the JSON error shape."""
    assert isinstance(exc, HTTPException)
    message = _HTTP_MESSAGES.get(exc.status_code, exc.detail)
    return ApiError(exc.status_code, message, headers=exc.headers).response()


class CatchAll(HttpMiddleware):
    """ASGI middleware: an unexpected exception becomes a logged 500 JSON error, not a crash.

    If the response has already started (a stream), nothing more can be said to that client; the
    failure is logged and the connection is ended cleanly.
    """

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        recorder = StatusRecorder(send)
        try:
            await self.app(scope, receive, recorder)
        except Exception as e:  # noqa: BLE001 - the one place that turns surprises into a 500
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if recorder.status:   # started: nothing more can be said to this client
                return
            err = ApiError(500, f"internal server error: {type(e).__name__}", "server_error")
            body = dumps(err.body())
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json; charset=utf-8"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
