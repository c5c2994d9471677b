"""Router errors in llama-server's JSON shape: `{"error": {"code", "message", "type"}}`.

The router imports nothing of slotserver.server (that package loads torch, which a router process
never needs), so it has its own small error class with the same shape and types.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         500: "server_error", 501: "not_supported_error", 502: "server_error", 503: "unavailable_error"}


class RouterError(Exception):
    def __init__(self, status: int, message: str, type: str | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra or {}
        self.type = type or TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")

    def response(self) -> JSONResponse:
        body = {"error": {"code": self.status, "message": self.message, "type": self.type, **self.extra}}
        return JSONResponse(body, status_code=self.status)
