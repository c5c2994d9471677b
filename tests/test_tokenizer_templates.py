"""Chat templates of the supported families through the Jinja sandbox, against llama-server.

tests/fixtures/tokenizers/templates.json holds llama-server's `/apply-template` output (the real
gemma-3-270m model, `--jinja`) for Gemma 3, Gemma 2, Qwen 3, Qwen 2.5, Phi-3.5, Granite 3.3 and
Llama 3.2 templates and for the file's own (absent, so ChatML); see
playground/make_template_fixtures.py. The Jinja rendering itself must match everywhere; three
rules of llama.cpp's chat layer (common/chat.cpp) are not applied by `ChatTemplate.render` yet and
are marked strict xfail so that they report when they are:

- the template's leading BOS text is dropped when the tokenizer adds BOS itself (gemma, llama 3);
- a system message is merged into the first user message when the template refuses the role;
- content parts stay a list for templates that iterate them (gemma 3 trims each part).
"""

from __future__ import annotations

import json

import pytest

from slotserver.model.text.chat_template import CHATML_TEMPLATE, ChatTemplate
from tokenizer_fixtures import FOLDER, tokenizer

_DATA = json.loads((FOLDER / "templates.json").read_text())
_CASES = [(case, i) for case in _DATA["cases"] for i in range(len(case["conversations"]))]
_BOS = ("leading BOS text is kept (llama.cpp drops it when the tokenizer adds BOS: "
        "Tokenizer.drop_added_specials)")
_BOS_CASES = {(name, i) for name in ("gemma3", "gemma2", "llama3.2") for i in range(5)}
_OTHER = {("gemma2", 1): "system message not merged into the first user turn",
          ("gemma3", 4): "content parts flattened with newlines before the template sees them"}


def _known(name: str, i: int) -> str | None:
    reasons = [_BOS] if (name, i) in _BOS_CASES else []
    reasons += [_OTHER[(name, i)]] if (name, i) in _OTHER else []
    return "; ".join(reasons) or None


def _render(case: dict, conversation: dict) -> str:
    template = ChatTemplate(case["source"] or CHATML_TEMPLATE, bos_token=_DATA["bos_token"],
                            eos_token=_DATA["eos_token"])
    return template.render(conversation["messages"], add_generation_prompt=True, **case["kwargs"])


def _params():
    for case, i in _CASES:
        reason = _known(case["name"], i)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        yield pytest.param(case, i, id=f"{case['name']}-{i}", marks=marks)


@pytest.mark.parametrize(("case", "i"), list(_params()))
def test_render_matches_llama_server_apply_template(case, i):
    conversation = case["conversations"][i]
    assert _render(case, conversation) == conversation["prompt"]


@pytest.mark.parametrize(("case", "i"), [(c, i) for c, i in _CASES
                                         if _known(c["name"], i) == _BOS])
def test_render_matches_once_the_leading_bos_is_dropped(case, i):
    """The same prompts after llama.cpp's BOS rule (`Tokenizer.drop_added_specials`, gemma3's
    tokenizer adds BOS): the sandbox renders these templates right."""
    rendered = _render(case, case["conversations"][i])
    assert rendered.startswith(_DATA["bos_token"])
    assert tokenizer("gemma3").drop_added_specials(rendered) == case["conversations"][i]["prompt"]


def test_drop_added_specials_only_drops_what_encode_adds():
    gemma, qwen = tokenizer("gemma3"), tokenizer("qwen2")
    assert gemma.drop_added_specials("<bos>x<eos>") == "x<eos>"  # adds BOS, not EOS
    assert gemma.drop_added_specials("x<bos>") == "x<bos>"
    assert qwen.drop_added_specials("<|endoftext|>x") == "<|endoftext|>x"  # adds nothing


def test_gemma3_prompt_tokenizes_to_one_bos_and_its_turn_markers():
    """What gemma sees: the rendered prompt (BOS text dropped, as llama-server does) tokenized with
    the model's BOS and special tokens parsed."""
    case = next(c for c in _DATA["cases"] if c["name"] == "gemma3")
    tok = tokenizer("gemma3")
    ids = tok.encode(case["conversations"][1]["prompt"], add_special=True, parse_special=True)
    turn = tok.token_to_id("<start_of_turn>")
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert ids[1] == turn and ids.count(turn) == 4
    assert ids.count(tok.token_to_id("<end_of_turn>")) == 3
