"""A GGUF file's tensor table that remembers which tensors the loader read.

llama.cpp refuses a file holding tensors its build of the architecture does not create ("wrong
number of tensors"): a tensor nobody reads is a part of the model nobody computes, so the answers
would be another model's. `LlamaModel.from_file` does the same after loading, naming the tensors
(`unread_problem`): a `llama` file with q/k/v or output biases, for instance, is refused rather than
served without them.

A read is an index (`table[name]`) or `get`, the two ways every loader here reaches a tensor's
info (GGUFFile.require and load_tensor go through `get`); `name in table` only asks, and iterating
the values (the GPU loader's size survey) is not a read either.
"""

from __future__ import annotations

from typing import TypeVar

V = TypeVar("V")
SHOWN = 6   # names listed in the refusal


class TensorTable(dict[str, V]):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, name: str) -> V:
        value = super().__getitem__(name)
        self.read.add(name)
        return value

    def get(self, name: str, default=None):
        if name in self:
            self.read.add(name)
        return super().get(name, default)

    def unread(self) -> list[str]:
        """The tensors no loader has read, in file order."""
        return [name for name in self if name not in self.read]


# what the embedder reads of a decoder file: a reranker's head, sentence-transformers' dense projections
EMBEDDER_HEADS = frozenset({"cls.output.weight", "cls.output.bias", "dense_2.weight", "dense_3.weight"})


def unread_problem(table: TensorTable, arch: str, optional: frozenset[str] = EMBEDDER_HEADS) -> str | None:
    """A one-line reason to refuse the file when some of its tensors (other than `optional` ones)
    were not read, else None. A decoder file may carry a classifier head (llama.cpp's qwen3 creates
    `cls_out` as optional) or EmbeddingGemma's dense projections: the model does not read them, the
    embedder does (encoder/embedder.py)."""
    names = [n for n in table.unread() if n not in optional]
    if not names:
        return None
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return (f"{len(names)} tensor{'s' if len(names) > 1 else ''} that this server's {arch} model does not use "
            f"({', '.join(names[:SHOWN])}{more}): serving without them would compute another model")
