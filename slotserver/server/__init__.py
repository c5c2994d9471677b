"""The HTTP server: llama-server-compatible and OpenAI-compatible APIs over the slot engine."""

from slotserver.server.app import create_app
from slotserver.server.config import GenerationDefaults, ServerConfig
from slotserver.server.state import ServerState

__all__ = ["GenerationDefaults", "ServerConfig", "ServerState", "create_app"]
