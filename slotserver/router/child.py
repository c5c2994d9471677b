"""A model's child server: `slotserver serve -m FILE --port P ...` started, watched and stopped.

Why a process per model (as llama-server's router): a model's slots, lab, metrics and memory stay
its own; unloading ends the process, so the OS gets every byte back (torch's caching allocators
and glibc's heap would keep much of it in-process); a crash takes down one model, not the router;
and the child is the ordinary server, unchanged. The cost is a second start (import torch, read
the GGUF: ~2-3 s for a small model) and one loopback hop per request.

Each child requires an API key only the router knows (a random one, handed over in a 0600 file,
not on the command line where `ps` shows it): the children listen on loopback, and without it
any local user could reach a model past the router's own --api-key check.

The child dies with the router: Linux's PR_SET_PDEATHSIG sends it SIGTERM when the router exits,
however it exits (a SIGKILLed router leaves no orphan holding memory and a port).
Its output goes to the router's stderr, each line prefixed with `[model] `.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import secrets
import signal
import socket
import sys
import tempfile

import httpx

log = logging.getLogger("slotserver.router")
PR_SET_PDEATHSIG = 1
HEALTH_POLL_S = 0.1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:   # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass   # not Linux: the router stops its children itself at shutdown


class Child:
    def __init__(self, name: str, argv: list[str], port: int, env: dict[str, str] | None = None):
        key = secrets.token_urlsafe(32)
        fd, self.key_file = tempfile.mkstemp(prefix="slotserver-child-", suffix=".key")   # mode 0600
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        self.auth = {"Authorization": f"Bearer {key}"}
        self.name, self.argv, self.port, self.env = name, [*argv, "--api-key-file", self.key_file], port, env
        self.proc: asyncio.subprocess.Process | None = None
        self._pipe: asyncio.Task | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env=self.env, preexec_fn=_die_with_parent)
        except OSError:
            self._remove_key()
            raise
        self._pipe = asyncio.create_task(self._forward_output())

    def _remove_key(self) -> None:
        try:
            os.unlink(self.key_file)
        except FileNotFoundError:
            pass

    async def _forward_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            sys.stderr.write(f"[{self.name}] {line.decode('utf-8', 'replace')}")
        sys.stderr.flush()

    async def wait_healthy(self, client: httpx.AsyncClient) -> bool:
        """True once GET /health answers 200; False if the process exits first."""
        assert self.proc is not None
        while self.proc.returncode is None:
            try:
                if (await client.get(self.url + "/health", timeout=2.0)).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            try:
                await asyncio.wait_for(asyncio.shield(self.proc.wait()), HEALTH_POLL_S)
            except asyncio.TimeoutError:
                pass
        return False

    async def info(self, client: httpx.AsyncClient) -> dict:
        """The child's own /v1/models entry (its meta: vocabulary, context, size...), or {}."""
        try:
            answer = await client.get(self.url + "/v1/models", headers=self.auth, timeout=5.0)
            data = answer.json().get("data") or [{}]
            return data[0] if isinstance(data[0], dict) else {}
        except (httpx.HTTPError, ValueError, AttributeError):
            return {}

    async def wait(self) -> int:
        assert self.proc is not None
        code = await self.proc.wait()
        self._remove_key()
        if self._pipe is not None:
            await asyncio.gather(self._pipe, return_exceptions=True)
        return code

    async def stop(self, timeout: float) -> None:
        """SIGTERM (the server drains and exits), SIGKILL after `timeout` seconds."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), timeout)
        except asyncio.TimeoutError:
            log.warning("router: %s did not exit within %.0f s, killing it", self.name, timeout)
            self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
