"""What a hybrid model (recurrent layers beside attention: Qwen3.5) changes in the engine.

A recurrent layer's state summarizes every token a sequence has seen and cannot be cut back to a
prefix (runtime/recurrent_state.py). So every engine feature that reuses, moves or drops part of
a stream's KV either keeps to whole states or is off:

- a slot's own prompt cache serves when the new prompt continues *all* of it (a multi-turn chat:
  the previous prompt and answer, then the next turn); a prompt sharing less, or all of it (the
  last prompt token must be computed again for its logits), resumes at the latest state checkpoint
  within the shared part (`--ctx-checkpoints`: one 4 tokens before each prompt's end, as
  llama-server's last), else from its start (engine/scheduler.py);
- n > 1 choices each compute their prompt (the parent's state stands past the copied prefix);
- the RAM prompt cache and prefix sharing between slots are off (they copy KV prefixes, not
  states), said once in the log; --cache-disk, --spec-type, --context-shift and --cache-reuse are
  refused at start, one line each; /slots save and restore answer 400;
- --async-steps is off: an overlapped step rolled back would leave a state past its tokens;
- LoRA adapters (model/lora.py) and a hybrid draft model are refused.

Defragmentation (states and checkpoints move with their streams), preemption (a stream cleared, its
state with it), chunked prefill, continuous batching, lab layout swaps (the states do not depend on
the KV layout) and a lab kernel rollback (the step rerun from a backup of its states; engine.py)
work as for any model.
"""

from __future__ import annotations

import logging

from slotserver.engine.config import EngineConfig
from slotserver.errors import ConfigError
from slotserver.engine.request import RequestError

log = logging.getLogger("slotserver.engine")

WHY = "the model has recurrent layers (one state per sequence, which cannot be cut back to a prefix)"


def is_recurrent(model) -> bool:
    return getattr(getattr(model, "spec", None), "recurrent", None) is not None


def check_config(config: EngineConfig, model) -> None:
    """At start: one line naming the first flag a hybrid model cannot serve with."""
    if not is_recurrent(model):
        return
    flags = (("--cache-disk", config.cache_disk is not None), ("--spec-type", config.spec.enabled),
             ("--context-shift", config.context_shift), ("--cache-reuse", bool(config.cache_reuse)),
             ("--async-steps on", config.async_steps == "on"))
    for flag, on in flags:
        if on:
            raise ConfigError(f"{flag} cannot run: {WHY}")
    if config.cache_ram_mib:
        log.info("prompt cache in RAM and prefix sharing between slots are off: %s", WHY)


def refuse_draft(model) -> None:
    """--model-draft: a draft's rejected tokens are rolled back by rewriting its KV, which a state cannot follow."""
    if is_recurrent(model):
        raise ConfigError(f"the draft model cannot be a hybrid model: {WHY}")


def refuse_slot_files(model) -> None:
    """/slots save and restore: their files hold KV only (a hybrid model's state would be missing)."""
    if is_recurrent(model):
        raise RequestError(f"slot save and restore are not supported: {WHY}")
