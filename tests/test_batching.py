"""Batching is invisible: sequences decoded together give the tokens each gives alone (float32)."""

from __future__ import annotations

import torch

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.model.generate import GenRequest, generate
from slotserver.model.sampling.sampler import SamplingParams

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "List three colors:",
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "1, 2, 3, 4,",
    "Water boils at",
]


# the rows compared with their prompt alone: the first and the last of the batch, the chat prompt
# and the longest (each alone is 12 single-row float32 steps, ~1.3 s on one core: all 8 took 10 s);
# the other four in a batch of their own, in another order (one 4-row run, not four single ones)
ALONE, REORDERED = (0, 4, 5, 7), (6, 3, 2, 1)


def test_eight_prompts_together_equal_each_alone(model_f32, tokenizer):
    reqs = [GenRequest(tokenizer.encode(p, parse_special=True), 12, ignore_eos=True) for p in PROMPTS]
    together = generate(model_f32, reqs, tokenizer.eog_ids)
    for i in ALONE:
        alone = generate(model_f32, [reqs[i]], tokenizer.eog_ids)[0]
        assert together[i].tokens == alone.tokens, tokenizer.decode(reqs[i].prompt_ids)
    four = generate(model_f32, [reqs[i] for i in REORDERED], tokenizer.eog_ids)
    for i, res in zip(REORDERED, four):
        assert together[i].tokens == res.tokens, tokenizer.decode(reqs[i].prompt_ids)


def test_seeded_sampling_is_reproducible_and_batch_independent(model_f32, tokenizer):
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42)
    ids = tokenizer.encode("Tell me a story", parse_special=True)
    alone = generate(model_f32, [GenRequest(ids, 10, params)], frozenset())[0].tokens
    other = GenRequest(tokenizer.encode("Another prompt entirely"), 10, SamplingParams(seed=7))
    batched = generate(model_f32, [other, GenRequest(ids, 10, params)], frozenset())[1].tokens
    assert alone == batched
    different = generate(model_f32, [GenRequest(ids, 10, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=43))], frozenset())[0].tokens
    assert different != alone


def test_a_decode_batch_has_the_tensors_of_the_general_path():
    """Batch.build's decode shortcut (one int64 tensor, its rows as views) equals the general path."""
    chunks = [SeqChunk(3, 10, [100]), SeqChunk(4, 11, [101]), SeqChunk(7, 0, [102])]
    fast = Batch.build(chunks)
    general = Batch.build(chunks + [SeqChunk(9, 0, [1, 2])])   # a prefill chunk: the general path
    n = len(chunks)
    assert fast.attn.max_q == 1 and general.attn.split is not None
    want = Batch(general.tokens[:n], general.positions[:n], general.token_streams[:n], general.logits_rows[:n],
                 general.attn.split[0])
    for a, b in zip(fast.tensors(), want.tensors(), strict=True):
        assert torch.equal(a, b) and a.dtype == b.dtype
    assert (fast.attn.max_kv, fast.attn.stream_base) == (12, None)
    assert Batch.build(chunks[:2]).attn.stream_base == 3
