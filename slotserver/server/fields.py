"""Typed, range-checked access to the fields of a JSON request body.

Each getter returns the default when the field is absent or null (clients often send null for
"not set"), and raises a 400 naming the field for a wrong type or an out-of-range value. Unknown
fields are simply never read, as in llama-server. Integers are JSON integers (or floats with an
integral value, as some clients send `5.0`); booleans are never accepted as numbers.

`fallback` holds the server's own defaults for some fields, by their request names (llama-server's
sampling flags: `--top-k 20` is a `top_k` of 20 for every request that does not set one;
cli/sampling_args.py). A field absent from the body reads its fallback, checked the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from slotserver.server.errors import bad_request

INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1


class Fields:
    def __init__(self, body: dict[str, Any], fallback: Mapping[str, Any] | None = None) -> None:
        self.body, self.fallback = body, fallback or {}

    def with_fallback(self, fallback: Mapping[str, Any]) -> Fields:
        """The same body over `fallback` (the server's defaults for absent fields)."""
        return Fields(self.body, fallback) if fallback else self

    def _get(self, name: str) -> Any:
        value = self.body.get(name)
        return self.fallback.get(name) if value is None else value

    def sent(self, name: str) -> bool:
        """The body itself sets `name` (not a fallback)."""
        return self.body.get(name) is not None

    def has(self, name: str) -> bool:
        return self._get(name) is not None

    def raw(self, name: str, default: Any = None) -> Any:
        value = self._get(name)
        return default if value is None else value

    def int(self, name: str, default: int, lo: int = -INT32_MAX, hi: int = INT32_MAX) -> int:
        value = self._get(name)
        if value is None:
            return default
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad_request(f"'{name}' must be an integer, got {_kind(value)}")
        if not lo <= value <= hi:
            raise bad_request(f"'{name}' must be in [{lo}, {hi}], got {value}")
        return value

    def float(self, name: str, default: float, lo: float = -math.inf, hi: float = math.inf) -> float:
        value = self._get(name)
        if value is None:
            return default
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise bad_request(f"'{name}' must be a number, got {_kind(value)}")
        value = float(value)
        if not math.isfinite(value) or not lo <= value <= hi:
            raise bad_request(f"'{name}' must be a finite number in [{lo:g}, {hi:g}], got {value!r}")
        return value

    def bool(self, name: str, default: bool) -> bool:
        value = self._get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise bad_request(f"'{name}' must be true or false, got {_kind(value)}")
        return value

    def str(self, name: str, default: str | None = None) -> str | None:
        value = self._get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise bad_request(f"'{name}' must be a string, got {_kind(value)}")
        return value

    def obj(self, name: str) -> dict | None:
        value = self._get(name)
        if value is not None and not isinstance(value, dict):
            raise bad_request(f"'{name}' must be an object, got {_kind(value)}")
        return value

    def str_list(self, name: str, max_items: int = 64, max_len: int = 1024) -> tuple[str, ...]:
        """A string or a list of strings (OpenAI's `stop` accepts both); empty strings are dropped."""
        value = self._get(name)
        if value is None:
            return ()
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise bad_request(f"'{name}' must be a string or a list of strings")
        if len(items) > max_items or any(len(s) > max_len for s in items):
            raise bad_request(f"'{name}' allows at most {max_items} strings of at most {max_len} characters")
        return tuple(s for s in items if s)


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "an integer", float: "a number"}
    return names.get(type(value), type(value).__name__)
