"""Immutable snapshots of the engine's state for HTTP, the TUI and benchmarks.

The engine builds a new snapshot after every step and swaps one reference; readers on other
threads never see a half-updated value and never touch slots or tensors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class SlotStats:
    id: int
    stream: int
    state: str                 # "idle" | "processing"
    id_task: int               # request id, -1 when idle
    n_ctx: int                 # cells of the slot
    cells_used: int            # valid KV cells (cached or computed)
    n_prompt: int
    n_cached: int
    n_generated: int
    tokens_per_second: float
    elapsed_s: float = 0.0     # since the request took the slot
    prompt_cached: int = 0     # prompt tokens this slot's requests took from a cache (its own KV or RAM), all so far
    prompt_computed: int = 0   # prompt tokens they computed
    speculative: bool = False  # drafts are verified for this slot's requests (--spec-type)


@dataclass(frozen=True)
class StepTimings:
    """Mean milliseconds per step of each phase, over the steps so far."""

    schedule: float = 0.0
    moves: float = 0.0
    draft: float = 0.0         # speculative decoding's drafters
    forward: float = 0.0
    sample: float = 0.0
    postprocess: float = 0.0
    last_step_ms: float = 0.0
    last_step_tokens: int = 0


@dataclass(frozen=True)
class EngineStats:
    slots: tuple[SlotStats, ...] = ()
    queue_len: int = 0
    n_active: int = 0
    steps: int = 0
    prompt_tokens: int = 0          # prompt tokens computed (prefilled) so far
    prompt_tokens_cached: int = 0   # prompt tokens taken from a cache (a slot's KV or the RAM cache) so far
    ram_cache_entries: int = 0      # --cache-ram: prompts held in host memory
    ram_cache_bytes: int = 0
    ram_cache_hits: int = 0         # requests that restored a prefix from it
    predicted_tokens: int = 0       # tokens sampled so far
    spec_draft_tokens: int = 0      # speculative decoding: draft tokens proposed
    spec_accepted_tokens: int = 0   # of which the target kept
    spec_drafts: int = 0            # drafts verified
    requests_done: int = 0
    defrag: str = "on"
    defrag_moves: int = 0
    defrag_bytes: int = 0
    layout: str = ""
    kv_bytes: int = 0
    timings: StepTimings = field(default_factory=StepTimings)
    tokens_per_second: float = 0.0  # generated tokens per second over the last few seconds
    uptime_s: float = 0.0
    threads: int = 0                # the last CPU forward's thread count (engine/thread_tuner.py; 0: not tuned)
    thread_switches: int = 0        # times the tuner changed it

    def to_dict(self) -> dict:
        return asdict(self)
