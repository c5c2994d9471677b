"""slotserver: a llama.cpp-style LLM slot server with live-reloadable KV layouts and kernels."""

__version__ = "0.1.0"
