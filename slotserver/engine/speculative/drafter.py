"""What every drafter provides: drafts for a step's decoding sequences, and what it learns back.

A drafter proposes, for each `DraftRequest`, up to `n_max` tokens it guesses follow `tokens` (the
sequence so far; its last token was sampled and is not yet computed). The target model then
verifies all of them in one batched forward (speculator.py). Drafters see every request of a step
at once, so a draft model runs one batched forward per drafted position, not one per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class DraftRequest:
    seq_id: int          # the request's id: per-sequence state of a drafter
    slot_id: int         # its slot: a draft model's KV stream
    tokens: list[int]    # prompt + generated so far (the last one sampled, not yet computed)
    n_max: int           # at most this many draft tokens (context room, n_predict, the adaptive cap)
    n_min: int | None = None     # the request's speculative.n_min / p_min (draft-simple; None: the server's)
    p_min: float | None = None
    prompt_end: int = 0  # tokens[:prompt_end] are the prompt (a draft model computes them as prompt rows)


class Drafter(Protocol):
    name: str

    def propose(self, requests: list[DraftRequest]) -> list[list[int]]:
        """One draft per request (possibly empty), in order."""

    def accepted(self, seq_id: int, n_drafted: int, n_accepted: int) -> None:
        """The target kept `n_accepted` of the `n_drafted` tokens this drafter proposed last."""

    def forget(self, seq_id: int) -> None:
        """The sequence ended: drop what the drafter kept for it."""
