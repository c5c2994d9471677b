"""The server's LoRA adapter scales, and what each request runs with (llama-server's semantics).

- `--lora FILE` loads an adapter at scale 1, `--lora-scaled FILE:SCALE` at SCALE,
  `--lora-init-without-apply` every adapter at 0. Ids are the order on the command line.
- `POST /lora-adapters [{"id": 0, "scale": 0.5}, ...]` sets the server's scales: listed ids take
  theirs, every other adapter 0 (llama-server's `construct_lora_list`). `GET /lora-adapters` lists
  them (id, path, scale, task_name, prompt_prefix).
- A request's `lora` (same form) overrides them for that request alone, unlisted adapters at 0;
  without it (or with `[]`) the request takes the server's scales as they are when it is submitted.
- An id that names no adapter is a 400 (llama-server ignores it: a typo would silently run the base model).

A sequence's scales also name the KV it computes (`cache_ns`): a slot's cache, the RAM and disk
prompt caches and slot files only give a prompt KV computed under the same adapters and scales
(llama-server clears a slot's cache when its adapters change). "" is the base model's.
"""

from __future__ import annotations

import hashlib
import math

from slotserver.errors import RequestError

# what GET /lora-adapters lists beside id and scale: describes an adapter, sets nothing. Accepted in
# an entry (a client may POST back what it read, as llama-server accepts it); any other key is a 400.
DESCRIPTIVE = ("path", "task_name", "prompt_prefix", "alora_invocation_string", "alora_invocation_tokens")

Pairs = tuple[tuple[int, float], ...]   # (adapter id, scale)


def parse_entries(entries: object, field: str = "lora") -> Pairs:
    """[{"id": int, "scale": number}, ...] -> (id, scale) pairs: the form only (the ids are checked
    against the loaded adapters by `LoraScales`); RequestError naming the entry."""
    if not isinstance(entries, list):
        raise RequestError(f"'{field}' must be an array of objects with 'id' and 'scale' fields")
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or set(e) - {"id", "scale", *DESCRIPTIVE} or type(e.get("id")) is not int:
            raise RequestError(f"'{field}[{i}]' must be an object with an integer 'id' and a 'scale'")
        scale = e.get("scale", 0.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise RequestError(f"'{field}[{i}].scale' must be a finite number, got {scale!r}")
        out.append((e["id"], float(scale)))
    return tuple(out)


class LoraScales:
    def __init__(self, adapters: list, scales: list[float]) -> None:
        """adapters: model/lora.py's LoraAdapter list (path, identity, task_name, prompt_prefix).
        `_scales` is replaced whole by `set` (one assignment: a reader sees the old or the new)."""
        assert len(adapters) == len(scales)
        self.adapters = adapters
        self._scales = tuple(float(s) for s in scales)

    def set(self, pairs: Pairs, field: str = "body") -> None:
        """POST /lora-adapters: listed adapters take their scale, the others 0."""
        self._scales = self._listed(pairs, field)

    def resolve(self, pairs: Pairs | None) -> tuple[float, ...]:
        """A request's scales: its own `lora` (unlisted at 0), or the server's when it has none."""
        return self._listed(pairs, "lora") if pairs else self._scales

    def _listed(self, pairs: Pairs, field: str) -> tuple[float, ...]:
        """Each adapter's scale in `pairs` (the last one listed), 0 where unlisted; RequestError for
        an id that names no adapter."""
        n = len(self.adapters)
        for i, (aid, _) in enumerate(pairs):
            if not 0 <= aid < n:
                raise RequestError(f"'{field}[{i}].id' is {aid!r}: no such LoRA adapter ({n} loaded, ids 0..{n - 1})"
                                   if n else f"'{field}': no LoRA adapter is loaded (--lora)")
        config = dict(pairs)
        return tuple(config.get(i, 0.0) for i in range(n))

    def cache_ns(self, scales: tuple[float, ...]) -> str:
        """The name of KV computed under these scales: "" with none active, else a hash of each
        active adapter's file identity and scale (stable across restarts: the disk cache keeps it)."""
        active = [(self.adapters[i].identity, s) for i, s in enumerate(scales) if s != 0.0]
        if not active:
            return ""
        return hashlib.sha256(repr(active).encode()).hexdigest()[:16]

    def describe(self) -> list[dict]:
        """GET /lora-adapters."""
        return [{"id": i, "path": str(a.path), "scale": s, "task_name": a.task_name, "prompt_prefix": a.prompt_prefix}
                for i, (a, s) in enumerate(zip(self.adapters, self._scales))]
