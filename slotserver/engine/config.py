"""Validated configuration of the slot engine (llama-server's flags for slots and batching)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from slotserver.engine.speculative.config import SpecConfig
from slotserver.errors import ConfigError

DEFRAG_MODES = ("on", "off")
ASYNC_STEPS_MODES = ("auto", "on", "off")   # --async-steps: auto = on where the model runs on CUDA
ADAPTIVE_THREADS_MODES = ("auto", "off")    # --adaptive-threads: auto = on where the model runs on the CPU with -t > 1
CACHE_TYPES = ("auto", "f32", "f16", "bf16")   # llama-server's -ctk/-ctv names that a float cache can hold
MIN_SHIFT_CELLS = 4   # a context shift keeps at most n_cells - 4 tokens (llama-server's rule)


@dataclass(frozen=True)
class EngineConfig:
    """`--parallel N` slots share `--ctx-size` cells: each slot gets ctx_size // n_parallel cells.

    One step runs at most `min(batch_size, ubatch_size)` tokens in one forward: every decoding
    sequence's next token first, then prefill chunks, oldest request first.

    `queue_limit` (--max-queue) requests may wait for a slot beyond the `n_parallel` running; the
    next one is refused (HTTP 503). 0 is allowed: nothing waits, a request gets a slot or a 503.
    """

    n_parallel: int = 4
    ctx_size: int = 4096
    batch_size: int = 2048
    ubatch_size: int = 512
    defrag: str = "on"
    slot_prompt_similarity: float = 0.1
    cache_prompt: bool = True
    queue_limit: int = 256           # --max-queue: waiting requests beyond the slots; past it: busy
    n_predict: int = -1              # server default when a request gives none (-1: no limit)
    slot_save_path: Path | None = None
    kv_pool_cells: int | None = None  # --kv-pool-cells: a paged pool's most cells, all slots (None: every stream full)
    # -ctk/-ctv: the K/V element type. auto: f16 under the CLI's `--dtype auto` (llama.cpp's default
    # cache type: half the bytes decode attention reads), else the model's dtype (float32 reference)
    cache_type: str = "auto"
    sleep_idle_s: float = -1.0       # --sleep-idle-seconds: idle this long -> weights and KV released (-1: never)
    cache_ram_mib: int = 0           # --cache-ram: host-memory prompt cache (engine/prompt_cache.py); 0 off, -1 no limit
    cache_idle_slots: bool = True    # with a RAM cache: idle slots saved to it when a request starts
    kv_unified: bool = False         # --kv-unified: one paged pool; idle slots saved to the RAM cache are also cleared
    cache_disk: Path | None = None   # --cache-disk: prompt-cache entries on disk, across restarts (engine/disk_cache.py)
    cache_disk_mib: int = 10240      # --cache-disk-mib: the folder's size cap for this model (-1: no limit)
    spec: SpecConfig = field(default_factory=SpecConfig)   # --spec-*: speculative decoding (off by default)
    context_shift: bool = False      # --context-shift: a full slot drops tokens and goes on (engine/context_shift.py)
    cache_reuse: int = 0             # --cache-reuse N: reuse cached chunks of >= N tokens by KV shifting (0: off)
    # --ctx-checkpoints N: a hybrid model's state copies a slot keeps (runtime/recurrent_state.py), one
    # taken 4 tokens before each prompt's end; 0: none. llama-server's default is 32; 8 here: each is
    # a whole state (Qwen3.5-9B: ~50 MB), and a slot's last few turns are what a next prompt shares
    ctx_checkpoints: int = 8
    # --async-steps: overlapped decode steps (engine/overlap.py): the next decode step is launched
    # before this one's tokens reach the host. auto: on where the model runs on CUDA (on the CPU the
    # forward blocks, so there is nothing to overlap); on/off force it (on: also on the CPU, for tests)
    async_steps: str = "auto"
    # --adaptive-threads: on the CPU, each forward runs with -t threads or one, whichever the engine
    # measured faster lately (engine/thread_tuner.py: cores shared with other busy work); off keeps -t
    adaptive_threads: str = "auto"

    def __post_init__(self) -> None:
        _positive("--parallel", self.n_parallel)
        _positive("--ctx-size", self.ctx_size)
        _positive("--batch-size", self.batch_size)
        _positive("--ubatch-size", self.ubatch_size)
        if self.ctx_size < self.n_parallel:
            raise ConfigError(f"--ctx-size {self.ctx_size} is smaller than --parallel {self.n_parallel}")
        if self.n_parallel > self.step_tokens:
            raise ConfigError(f"--parallel {self.n_parallel} exceeds the per-step token budget {self.step_tokens}")
        if self.defrag not in DEFRAG_MODES:
            raise ConfigError(f"--defrag must be one of {', '.join(DEFRAG_MODES)}, got {self.defrag!r}")
        if not 0.0 <= self.slot_prompt_similarity <= 1.0:
            raise ConfigError(f"--slot-prompt-similarity must be in [0, 1], got {self.slot_prompt_similarity}")
        if isinstance(self.queue_limit, bool) or not isinstance(self.queue_limit, int) or self.queue_limit < 0:
            raise ConfigError(f"--max-queue must be an integer >= 0, got {self.queue_limit!r}")
        if self.n_predict < -1:
            raise ConfigError(f"--n-predict must be >= -1, got {self.n_predict}")
        if self.kv_pool_cells is not None and (type(self.kv_pool_cells) is not int or self.kv_pool_cells < 1):
            raise ConfigError(f"--kv-pool-cells must be an integer >= 1, got {self.kv_pool_cells!r}")
        if self.cache_type not in CACHE_TYPES:
            raise ConfigError(f"--cache-type-k/-v must be one of {', '.join(CACHE_TYPES[1:])}, got {self.cache_type!r} "
                              "(int8 K/V: --layout q8)")
        if isinstance(self.cache_ram_mib, bool) or not isinstance(self.cache_ram_mib, int) or self.cache_ram_mib < -1:
            raise ConfigError(f"--cache-ram must be -1 (no limit), 0 (off) or a number of MiB, got {self.cache_ram_mib!r}")
        if not (self.sleep_idle_s == -1 or self.sleep_idle_s > 0):
            raise ConfigError(f"--sleep-idle-seconds must be -1 (never) or > 0, got {self.sleep_idle_s}")
        if isinstance(self.cache_disk_mib, bool) or not isinstance(self.cache_disk_mib, int) or self.cache_disk_mib < -1 \
                or self.cache_disk_mib == 0:
            raise ConfigError(f"--cache-disk-mib must be -1 (no limit) or a number of MiB, got {self.cache_disk_mib!r}")
        if self.cache_disk is not None and Path(self.cache_disk).exists() and not Path(self.cache_disk).is_dir():
            raise ConfigError(f"--cache-disk {self.cache_disk} is not a folder")
        n_cp = self.ctx_checkpoints
        if isinstance(n_cp, bool) or not isinstance(n_cp, int) or n_cp < 0:
            raise ConfigError(f"--ctx-checkpoints must be an integer >= 0, got {self.ctx_checkpoints!r}")
        if isinstance(self.cache_reuse, bool) or not isinstance(self.cache_reuse, int) or self.cache_reuse < 0:
            raise ConfigError(f"--cache-reuse must be an integer >= 0, got {self.cache_reuse!r}")
        if self.context_shift and self.n_cells <= MIN_SHIFT_CELLS:
            raise ConfigError(f"--context-shift needs slots of more than {MIN_SHIFT_CELLS} cells, got {self.n_cells}")
        if self.async_steps not in ASYNC_STEPS_MODES:
            raise ConfigError(f"--async-steps must be one of {', '.join(ASYNC_STEPS_MODES)}, got {self.async_steps!r}")
        if self.adaptive_threads not in ADAPTIVE_THREADS_MODES:
            raise ConfigError(f"--adaptive-threads must be one of {', '.join(ADAPTIVE_THREADS_MODES)}, "
                              f"got {self.adaptive_threads!r}")
        if self.slot_save_path is not None and not Path(self.slot_save_path).is_dir():
            raise ConfigError(f"--slot-save-path {self.slot_save_path} is not a folder")

    def overlaps(self, device: str) -> bool:
        """Whether decode steps overlap on `device` ("cpu" or "cuda"): --async-steps resolved."""
        return self.async_steps == "on" or (self.async_steps == "auto" and device == "cuda")

    @property
    def n_cells(self) -> int:
        """KV cells (positions) of one slot."""
        return self.ctx_size // self.n_parallel

    @property
    def step_tokens(self) -> int:
        return min(self.batch_size, self.ubatch_size)

    @property
    def n_streams(self) -> int:
        """One stream per slot, plus one spare with defrag on (so a move never overwrites a cache)."""
        return self.n_parallel + (1 if self.defrag == "on" else 0)


def _positive(flag: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{flag} must be a positive integer, got {value!r}")
