"""The collectives of a tensor-parallel step, over one torch.distributed process group.

A forward makes two all-reduces a layer (after the attention output and the down projection, the
row-parallel matmuls) and one gather of the vocabulary-parallel logits to rank 0. Rank 0 also sends
each step's plan (`send`: a pickled message, torch.distributed's object broadcast) and gathers
what the other ranks export (`gather`: slot files, the prompt cache).

A lab swap is all or nothing (`all_or_none`): every rank prepares it (loads the kernel or layout
from the bytes rank 0 sent, builds and fills its new cache), rank 0 gathers who failed and sends the
verdict, and only then does any rank serve it. A rank that cannot (a module that fails to import on
that node, no memory for the new cache) leaves every rank on what served before.

Why sums in float32: gloo reduces bf16 where it can, but the residual the sum lands in is float32,
and a bf16 sum of N partial outputs would round N times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

import torch
import torch.distributed as dist

from slotserver.errors import ModuleLoadError

T = TypeVar("T")


@dataclass(frozen=True)
class Comm:
    """rank of world ranks; `group` None: the default process group (launch.py made it)."""

    rank: int
    world: int
    group: object = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} outside a world of {self.world}")

    @property
    def leads(self) -> bool:
        """Rank 0: HTTP, the scheduler and sampling run there."""
        return self.rank == 0

    def all_reduce(self, y: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of each rank's partial `y` (same shape everywhere), in y's dtype."""
        if y.dtype == torch.float32 and y.is_contiguous():
            dist.all_reduce(y, group=self.group)
            return y
        s = y.float().contiguous()
        dist.all_reduce(s, group=self.group)
        return s.to(y.dtype)

    def gather_columns(self, y: torch.Tensor, widths: list[int]) -> torch.Tensor:
        """[rows, widths[rank]] on each rank -> [rows, sum(widths)] on rank 0, in rank order (the
        sampler's logits; the other ranks get their own columns back, which nothing reads). Uneven
        widths travel padded to the widest (gloo's gather wants equal shapes)."""
        wide = max(widths)
        y = y.float()
        if y.shape[1] < wide:
            y = torch.nn.functional.pad(y, (0, wide - y.shape[1]))
        y = y.contiguous()
        parts = [torch.empty_like(y) for _ in range(self.world)] if self.leads else None
        dist.gather(y, parts, dst=0, group=self.group)
        if not self.leads:
            return y[:, : widths[self.rank]]
        return torch.cat([p[:, :w] for p, w in zip(parts, widths)], dim=1)

    def send(self, message: object = None) -> object:
        """Rank 0 sends `message` to every rank; -> the message (on every rank)."""
        box = [message]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather(self, obj: object) -> list | None:
        """Every rank's `obj` on rank 0, in rank order (None elsewhere)."""
        out = [None] * self.world if self.leads else None
        dist.gather_object(obj, out, dst=0, group=self.group)
        return out

    def all_or_none(self, prepare: Callable[[], T]) -> T:
        """Every rank runs `prepare()` (after the message that asks for it); -> its result once every
        rank's succeeded. Else ModuleLoadError on every rank, naming each failed rank's reason in
        one line, and no rank uses what it prepared."""
        try:
            got, error = prepare(), None
        except Exception as e:  # noqa: BLE001 - reported to rank 0, which refuses the swap everywhere
            got, error = None, f"rank {self.rank}: {e if isinstance(e, ModuleLoadError) else repr(e)}"
        errors = self.gather(error)
        verdict = self.send([e.replace("\n", " ") for e in errors if e] if self.leads else None)
        if verdict:
            raise ModuleLoadError("; ".join(verdict))
        return got
