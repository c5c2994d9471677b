"""Chat templates of the supported families through the Jinja sandbox, against llama-server.

tests/fixtures/tokenizers/templates.json holds llama-server's `/apply-template` output (the real
gemma-3-270m model, `--jinja`, a tokenizer that adds BOS) for Gemma 3, Gemma 2, Qwen 3, Qwen 2.5,
Phi-3.5, Phi-3-medium, Granite 3.3, Llama 3.2, Llama 2, Mistral v0.1, Mistral Nemo and Mistral
Small 3.2 templates and for the file's own (absent, so ChatML), with its `/props`
chat_template_caps; see playground/make_template_fixtures.py. Every prompt must match to the
byte, which takes llama.cpp's chat layer as well as the Jinja: the leading BOS text cut, system
messages merged for templates without a system role, content parts joined or kept by the
template's probed capabilities, `developer` read as `system`, null content as "".
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from slotserver.model.text import chat_template
from slotserver.model.text.chat_template import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError
from tokenizer_fixtures import FOLDER, NAMES, tokenizer

_DATA = json.loads((FOLDER / "templates.json").read_text())
_CASES = [(case, i) for case in _DATA["cases"] for i in range(len(case["conversations"]))]


@pytest.fixture(autouse=True)
def _fixture_day(monkeypatch):
    """Templates print today's date (Granite, Mistral Small): the day llama-server rendered them."""
    monkeypatch.setattr(chat_template, "_clock", lambda: datetime.fromisoformat(_DATA["date"]))


def _template(case: dict, add_bos: bool = True) -> ChatTemplate:
    return ChatTemplate(case["source"] or CHATML_TEMPLATE, bos_token=_DATA["bos_token"],
                        eos_token=_DATA["eos_token"], add_bos=add_bos)


@pytest.mark.parametrize(("case", "i"), [pytest.param(c, i, id=f"{c['name']}-{i}") for c, i in _CASES])
def test_render_matches_llama_server_apply_template(case, i):
    conversation = case["conversations"][i]
    render = _template(case).render
    if "prompt" not in conversation:   # the template raised: llama-server answered 400 too
        assert conversation["status"] == 400
        with pytest.raises(ChatTemplateError, match="raised an error"):
            render(conversation["messages"], add_generation_prompt=True, **case["kwargs"])
        return
    assert render(conversation["messages"], add_generation_prompt=True, **case["kwargs"]) == conversation["prompt"]


@pytest.mark.parametrize("case", [pytest.param(c, id=c["name"]) for c in _DATA["cases"]])
def test_probed_capabilities_match_llama_cpps(case):
    caps = _template(case).caps.to_map()
    assert caps == {name: case["caps"][name] for name in caps}


def test_families_without_a_system_role_are_the_ones_llama_cpp_found():
    no_system = {c["name"] for c in _DATA["cases"] if not c["caps"]["supports_system_role"]}
    assert no_system == {"gemma2", "mistral-v0.1", "phi3-medium"}
    typed = {c["name"] for c in _DATA["cases"] if c["caps"]["supports_typed_content"]}
    assert typed == {"gemma3", "mistral-small3.2"}


def test_the_leading_bos_stays_when_the_tokenizer_does_not_add_one():
    case = next(c for c in _DATA["cases"] if c["name"] == "gemma3")
    messages = case["conversations"][0]["messages"]
    kept = _template(case, add_bos=False).render(messages)
    assert kept == _DATA["bos_token"] + _template(case).render(messages)
    assert tokenizer("gemma3").drop_added_specials(kept) == _template(case).render(messages)


@pytest.mark.parametrize("vocab", NAMES)
def test_no_family_prompt_starts_with_two_bos_tokens(vocab):
    """Every template through the production path (the model's tokenizer gives the BOS/EOS texts
    and whether encode adds BOS), tokenized as a chat prompt is: one BOS at the start at most."""
    tok = tokenizer(vocab)
    for case in _DATA["cases"]:
        template = ChatTemplate.from_metadata({"tokenizer.chat_template": case["source"]}, tok)
        text = template.render(case["conversations"][1]["messages"], **case["kwargs"])
        ids = tok.encode(text, add_special=True, parse_special=True)
        assert ids[:2] != [tok.bos_id] * 2, (vocab, case["name"])
        assert ids[0] == tok.bos_id or not tok.add_bos, (vocab, case["name"])


def test_drop_added_specials_only_drops_what_encode_adds():
    gemma, qwen = tokenizer("gemma3"), tokenizer("qwen2")
    assert gemma.drop_added_specials("<bos>x<eos>") == "x<eos>"  # adds BOS, not EOS
    assert gemma.drop_added_specials("x<bos>") == "x<bos>"
    assert qwen.drop_added_specials("<|endoftext|>x") == "<|endoftext|>x"  # adds nothing


def test_gemma3_prompt_tokenizes_to_one_bos_and_its_turn_markers():
    """What gemma sees: the template's prompt for the real gemma3 tokenizer (its BOS/EOS texts and
    add_bos), tokenized with the model's BOS and special tokens parsed."""
    case = next(c for c in _DATA["cases"] if c["name"] == "gemma3")
    tok = tokenizer("gemma3")
    template = ChatTemplate(case["source"], "<bos>", "<eos>", add_bos=tok.add_bos)
    text = template.render(case["conversations"][1]["messages"])
    ids = tok.encode(text, add_special=True, parse_special=True)
    turn = tok.token_to_id("<start_of_turn>")
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert ids[1] == turn and ids.count(turn) == 4
    assert ids.count(tok.token_to_id("<end_of_turn>")) == 3
