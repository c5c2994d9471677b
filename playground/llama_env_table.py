"""Prints slotserver/cli/llama_env.py's TABLE from a llama.cpp source tree's common/arg.cpp.

    python playground/llama_env_table.py ~/.cache/slotserver-suite/llama_cpp_python-0.3.36/vendor/llama.cpp

Every option with an environment variable of llama.cpp's own (`.set_env("LLAMA_...")`; not
HF_TOKEN and the like, which other programs read too) that llama-server takes
(no `.set_examples`, or one naming LLAMA_EXAMPLE_SERVER or LLAMA_EXAMPLE_COMMON): its variable,
its spellings and its negative spellings. Paste the output over TABLE.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

NAMES = r'\{\s*("(?:[^"\\]|\\.)*"(?:\s*,\s*"(?:[^"\\]|\\.)*")*)\s*\}'


def options(source: str) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    rows = []
    for block in source.split("add_opt(common_arg(")[1:]:
        block = block.split("add_opt(", 1)[0]
        env = re.search(r'\.set_env\("([A-Z0-9_]+)"\)', block)
        examples = re.search(r"\.set_examples\(\{([^}]*)\}\)", block)
        lists = [re.findall(r'"([^"]*)"', m) for m in re.findall(NAMES, block[:600])]
        if not env or not lists or (examples and not re.search(r"LLAMA_EXAMPLE_(SERVER|COMMON)\b", examples[1])):
            continue
        negative = lists[1] if len(lists) > 1 and all(n.startswith("-") for n in lists[1]) else []
        rows.append((env[1], tuple(lists[0]), tuple(negative)))
    return rows


def main() -> None:
    source = (Path(sys.argv[1]) / "common" / "arg.cpp").read_text()
    seen = set()
    print("TABLE: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (")
    for env, names, negative in options(source):
        if env not in seen and env.startswith("LLAMA_"):   # not HF_TOKEN & co.: other tools read them too
            seen.add(env)
            line = f"    ({env!r}, {names!r}, {negative!r}),"
            print(line if len(line) <= 116 else f"    ({env!r},\n     {names!r}, {negative!r}),")
    print(")")


if __name__ == "__main__":
    main()
