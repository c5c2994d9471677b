"""HTTP side of the monitor: poll `/health`, `/lab`, `/props`; send the lab's verbs.

Contract: nothing here raises on the network or on a bad answer. `poll()` always returns a `Poll`;
when `/lab` could not be read as JSON its `error` says why in one line (refused connection,
timeout, 401, non-JSON body...), which the monitor shows as "reconnecting" while it keeps the
last good frame. `/props` describes the model, so it is read once per connection, not every poll.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from slotserver.top.parse import clean

POLL_TIMEOUT_S = 2.0
ACTION_TIMEOUT_S = 60.0   # a layout switch validates in a child process, then waits for a step


@dataclass
class Poll:
    at: float                  # monotonic seconds
    lab: Any = None            # the decoded /lab JSON, any shape; None when unusable
    props: Any = None          # the decoded /props JSON (cached per connection) or None
    health: str = "?"          # "ok" | "loading" | "error <status>" | "down"
    error: str | None = None   # why `lab` is None


def _error_text(r: httpx.Response) -> str:
    """The server's own error message when it sent llama-server's JSON error, else the status."""
    try:
        msg = r.json()["error"]["message"]
        if isinstance(msg, str) and msg:
            return f"{r.status_code}: {clean(msg, 300)}"
    except (ValueError, KeyError, TypeError):
        pass
    hint = " (check --api-key)" if r.status_code == 401 else ""
    return f"HTTP {r.status_code}{hint}"


def _describe(e: Exception) -> str:
    if isinstance(e, httpx.TimeoutException):
        return "timed out"
    if isinstance(e, httpx.ConnectError):
        return "cannot connect"
    return clean(f"{type(e).__name__}: {e}", 200)


class TopClient:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = POLL_TIMEOUT_S,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)
        # a second client for the verbs: they run on a worker thread and may take seconds
        self.actions = httpx.Client(base_url=self.url, headers=headers, timeout=ACTION_TIMEOUT_S,
                                    transport=transport)
        self.props: Any = None

    def close(self) -> None:
        self.http.close()
        self.actions.close()

    def poll(self) -> Poll:
        now = time.monotonic()
        try:
            health = self._health()
            lab, error = self._lab()
            if lab is not None and self.props is None:
                self.props = self._props()
        except httpx.HTTPError as e:
            self.props = None          # a server that comes back may serve another model
            return Poll(now, health="down", error=_describe(e))
        return Poll(now, lab=lab, props=self.props, health=health, error=error)

    def _health(self) -> str:
        r = self.http.get("/health")
        if r.status_code == 200:
            return "ok"
        return "loading" if r.status_code == 503 else f"error {r.status_code}"

    def _lab(self) -> tuple[Any, str | None]:
        r = self.http.get("/lab")
        if r.status_code != 200:
            return None, f"/lab: {_error_text(r)}"
        try:
            return r.json(), None
        except (ValueError, UnicodeDecodeError):
            return None, f"/lab: not JSON ({r.text[:40]!r})"

    def _props(self) -> Any:
        try:
            r = self.http.get("/props")
            return r.json() if r.status_code == 200 else None
        except (ValueError, UnicodeDecodeError):
            return None

    # -- the lab's verbs (worker thread); each returns one line for the footer --------------------
    def switch_layout(self, name: str) -> str:
        return self._post("/lab/layout", {"layout": name}, f"layout {name}")

    def reload(self) -> str:
        return self._post("/lab/reload", {}, "reload")

    def _post(self, path: str, body: dict, what: str) -> str:
        try:
            r = self.actions.post(path, json=body)
        except httpx.HTTPError as e:
            return f"{what}: {_describe(e)}"
        if r.status_code != 200:
            return f"{what}: {_error_text(r)}"
        try:
            answer = r.json()
        except (ValueError, UnicodeDecodeError):
            return f"{what}: done (answer not JSON)"
        return f"{what}: {summarize(answer)}"


def summarize(answer: Any) -> str:
    """One line from a lab answer: an event, or `{"reloaded": [events]}`."""
    if isinstance(answer, dict) and isinstance(answer.get("reloaded"), list):
        events = [e for e in answer["reloaded"] if isinstance(e, dict)]
        if not events:
            return "nothing changed on disk"
        return clean(", ".join(f"{e.get('name', '?')} {e.get('result', '?')}" for e in events), 300)
    if isinstance(answer, dict):
        latency = answer.get("latency_ms")
        took = f" in {latency:.0f} ms" if isinstance(latency, (int, float)) else ""
        return clean(f"{answer.get('result', 'done')}{took}", 300)
    return json.dumps(answer)[:60]
