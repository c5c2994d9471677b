"""Strings in a request must be valid Unicode: a lone surrogate is a 400 that names the field.

JSON may spell a UTF-16 surrogate on its own (`"\\ud800"`); Python's json turns it into a str that
cannot be encoded as UTF-8, and deep inside the tokenizer, the chat template or a file name that
fails with a message that means nothing to the client ("TextInputSequence must be str"). A body is
checked once, right after parsing, and the answer names the field by its JSON path
(`messages[0].content`), as a client would look for it.

Only strings that came from a `\\uD8xx`..`\\uDFxx` escape can hold a surrogate (the UTF-8 decoder
refuses encoded ones), so a body without such an escape is not walked at all.
"""

from __future__ import annotations

import re
from typing import Any

from slotserver.server.errors import bad_request

_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _key_path(parent: str, key: str) -> str:
    """`parent.key`, or `parent["odd key"]` when the key is not a plain name."""
    if _IDENTIFIER.match(key):
        return f"{parent}.{key}" if parent else key
    escaped = key.encode("ascii", "backslashreplace").decode("ascii").replace('"', '\\"')
    return f'{parent}["{escaped}"]'


def find_lone_surrogate(value: Any) -> tuple[str, int, bool] | None:
    """(JSON path, index in the string, is_key) of the first lone surrogate, in document order.

    For a key, the path is that of the object holding it. Iterative (an explicit stack), so any
    nesting json.loads accepted is walked without recursion.
    """
    stack: list[tuple[str, Any, bool]] = [("", value, False)]
    while stack:
        path, item, is_key = stack.pop()
        if isinstance(item, str):
            bad = _SURROGATE.search(item)
            if bad:
                return path, bad.start(), is_key
        elif isinstance(item, dict):
            children = []
            for key, child in item.items():
                children.append((path, key, True))
                if not _SURROGATE.search(key):   # a bad key is reported before its value is named
                    children.append((_key_path(path, key), child, False))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend(reversed([(f"{path}[{i}]", child, False) for i, child in enumerate(item)]))
    return None


def check_unicode(text: str, value: Any) -> None:
    """400 naming the first field (in document order) whose string holds a lone surrogate.

    `text` is the JSON source of `value`: without a surrogate escape in it there is nothing to find.
    """
    if not _ESCAPE.search(text):
        return
    found = find_lone_surrogate(value)
    if found is None:
        return
    path, index, is_key = found
    if is_key:
        where = f"a key of '{path}'" if path else "a top-level key"
        raise bad_request(f"{where} is not valid Unicode (lone surrogate at index {index})")
    raise bad_request(f"'{path or 'body'}' is not valid Unicode (lone surrogate at index {index})")
