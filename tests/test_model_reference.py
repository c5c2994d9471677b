"""The default model computes what llama.cpp computes (tests/fixtures/greedy_f32.json).

Teacher forcing: fed prompt + llama.cpp's generated ids, the top-8 probabilities at every step
match within 1e-3. The fixture was made with `ignore_eos`, so llama.cpp's greedy pick is the argmax
over non-end-of-generation tokens; we compare that way too.
"""

from __future__ import annotations

import pytest
import torch

from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.model.generate import GenRequest, generate
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import create_layout, load_layout

NEAR_TIE = 0.02  # log-probability margin under which llama.cpp and we may legitimately differ


def teacher_forced_logprobs(model, fixture) -> list[torch.Tensor]:
    """One ragged forward over all fixture rows; -> per row `[n_generated, vocab]` log-probs."""
    s = model.spec
    seqs = [r["prompt_ids"] + r["generated_ids"] for r in fixture]
    spec = KVSpec(s.n_layers, len(seqs), max(map(len, seqs)), s.n_kv_heads, s.head_dim, model.dtype)
    cache = create_layout(load_layout("seq_head_dim"), spec)
    logits = model.forward(Batch.build([SeqChunk(i, 0, t, all_logits=True) for i, t in enumerate(seqs)]), cache)
    out, row = [], 0
    for r, t in zip(fixture, seqs):
        n = len(r["prompt_ids"])
        out.append(logits[row + n - 1: row + len(t) - 1].log_softmax(-1))
        row += len(t)
    return out


@pytest.fixture(scope="module")
def f32_logprobs(model_f32, greedy_fixture):
    return teacher_forced_logprobs(model_f32, greedy_fixture)


def _masked_argmax(lp: torch.Tensor, eog: frozenset[int]) -> torch.Tensor:
    lp = lp.clone()
    lp[:, sorted(eog)] = -float("inf")
    return lp.argmax(-1)


def test_top8_probabilities_match_llama_cpp(f32_logprobs, greedy_fixture):
    worst = 0.0
    for lp, r in zip(f32_logprobs, greedy_fixture):
        for i, step in enumerate(r["steps"]):
            ids = torch.tensor([t for t, _ in step["top"]])
            want = torch.tensor([p for _, p in step["top"]]).exp()
            worst = max(worst, float((lp[i, ids].exp() - want).abs().max()))
    assert worst < 1e-3, f"max probability difference {worst}"


def test_greedy_choice_matches_llama_cpp_teacher_forced(f32_logprobs, greedy_fixture, tokenizer):
    for lp, r in zip(f32_logprobs, greedy_fixture):
        ours = _masked_argmax(lp, tokenizer.eog_ids).tolist()
        assert ours == [s["id"] for s in r["steps"]], r["prompt"]


def test_free_running_greedy_reproduces_llama_cpp(model_f32, greedy_fixture, tokenizer):
    """Generate freely (all prompts in one batch) and compare up to the first near-tie."""
    reqs = [GenRequest(r["prompt_ids"], len(r["generated_ids"]), ignore_eos=True) for r in greedy_fixture]
    results = generate(model_f32, reqs, tokenizer.eog_ids)
    for res, r in zip(results, greedy_fixture):
        want = r["generated_ids"]
        for i, (got, exp) in enumerate(zip(res.tokens, want)):
            if got != exp:
                top = r["steps"][i]["top"]
                non_eog = [lp for t, lp in top if t not in tokenizer.eog_ids]
                assert non_eog[0] - non_eog[1] < NEAR_TIE, f"{r['prompt']!r}: diverged at {i} without a near-tie"
                break
        else:
            assert len(res.tokens) == len(want)


def test_bfloat16_agrees_with_float32_on_most_greedy_tokens(f32_logprobs, model_bf16, greedy_fixture, tokenizer):
    bf = teacher_forced_logprobs(model_bf16, greedy_fixture)
    same = total = 0
    for a, b in zip(f32_logprobs, bf):
        x, y = _masked_argmax(a, tokenizer.eog_ids), _masked_argmax(b.float(), tokenizer.eog_ids)
        same += int((x == y).sum())
        total += len(x)
    print(f"bf16/f32 greedy agreement: {same}/{total} = {same / total:.3f}")
    assert same / total >= 0.9


def stepwise_logprobs(model, fixture) -> list[torch.Tensor]:
    """Teacher forcing one token per sequence per step (decode-sized batches, so the small-batch
    weight formats are the ones exercised); -> per row `[n_generated, vocab]` log-probs."""
    s = model.spec
    seqs = [r["prompt_ids"] + r["generated_ids"] for r in fixture]
    cache = create_layout(load_layout("seq_head_dim"),
                          KVSpec(s.n_layers, len(seqs), max(map(len, seqs)), s.n_kv_heads, s.head_dim, model.dtype))
    out = [[] for _ in seqs]
    for pos in range(max(map(len, seqs)) - 1):
        live = [i for i, t in enumerate(seqs) if pos < len(t) - 1]
        logits = model.forward(Batch.build([SeqChunk(i, pos, [seqs[i][pos]]) for i in live]), cache).log_softmax(-1)
        for row, i in enumerate(live):
            if pos >= len(fixture[i]["prompt_ids"]) - 1:
                out[i].append(logits[row])
    return [torch.stack(o) for o in out]


@pytest.mark.parametrize("weights", ["auto", "q"])
def test_default_serving_format_agrees_with_float32(f32_logprobs, smollm_path, greedy_fixture, tokenizer, weights):
    """The CLI default (`--dtype auto --weights auto`, what this CPU resolves it to) and the GGUF
    block kernels (`q`) pick the float32 reference's greedy token at >= 97% of the fixture's steps."""
    from slotserver.model.config import ModelConfig
    from slotserver.model.model import LlamaModel

    cfg = ModelConfig(smollm_path, dtype="auto", weights=weights)
    model = LlamaModel.load(smollm_path, cfg.torch_dtype, max_pos=256, fmt=cfg.weight_format)
    got = stepwise_logprobs(model, greedy_fixture)
    same = total = 0
    for a, b in zip(f32_logprobs, got):
        same += int((_masked_argmax(a, tokenizer.eog_ids) == _masked_argmax(b.float(), tokenizer.eog_ids)).sum())
        total += len(a)
    print(f"{cfg.dtype}:{weights} / f32 greedy agreement: {same}/{total} = {same / total:.3f}")
    assert same / total >= 0.97
