"""Errors of the Anthropic Messages routes in Anthropic's shape.

Anthropic's clients read `{"type": "error", "error": {"type": ..., "message": ...}}` with the
error types of Anthropic's API reference (the SDK picks its exception class from the status, and
shows the message). Everything the server refuses on /v1/messages and /v1/messages/count_tokens
takes this shape: bad bodies and fields (400), a missing or wrong API key (401, auth.py), a full
queue (503), an error during generation (500; mid-stream it is an `error` event). Other routes keep
llama-server's shape (errors.py).
"""

from __future__ import annotations

from slotserver.server.errors import ApiError
from slotserver.server.jsonio import JSONResp

PREFIX = "/v1/messages"
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def error_type(status: int) -> str:
    return TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def error_response(err: ApiError) -> JSONResp:
    """An ApiError raised by the shared code, answered in Anthropic's shape (same status, headers)."""
    return JSONResp(error_body(err.status, err.message), status_code=err.status, headers=err.headers)
