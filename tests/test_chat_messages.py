"""Messages reshaped for a template as llama-server does (chat_messages.py), and the template
capabilities probed as llama.cpp probes them (template_caps.py); no model needed.
tests/test_tokenizer_templates.py checks the same against llama-server's own prompts."""

from __future__ import annotations

import pytest

from slotserver.model.text.chat_messages import fit_messages, join_parts
from slotserver.model.text.chat_template import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError
from slotserver.model.text.template_caps import TemplateCaps

STRING_ONLY, BOTH, TYPED_ONLY = TemplateCaps(), TemplateCaps(supports_typed_content=True), \
    TemplateCaps(supports_string_content=False, supports_typed_content=True)
NO_SYSTEM = TemplateCaps(supports_system_role=False)


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


def test_parts_are_joined_like_llama_cpp_a_newline_only_after_some_text():
    assert join_parts([_text("a"), _text("b")]) == "a\nb"
    assert join_parts([_text(""), _text("x"), _text("")]) == "x\n"
    assert join_parts([]) == ""


@pytest.mark.parametrize("role", ["system", "user", "assistant", "tool"])
def test_content_parts_on_every_role_take_the_templates_form(role):
    message = {"role": role, "content": [_text("one"), {"type": "text", "text": "two", "extra": 1}]}
    assert fit_messages([message], STRING_ONLY, "")[0]["content"] == "one\ntwo"
    assert fit_messages([message], BOTH, "")[0]["content"] == [_text("one"), _text("two")]
    assert fit_messages([{"role": role, "content": "s"}], TYPED_ONLY, "")[0]["content"] == [_text("s")]


@pytest.mark.parametrize(("part", "named"), [
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}, "image input .*'image_url'"),
    ({"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}, "audio input .*'input_audio'"),
    ({"type": "video_url", "video_url": {"url": "x"}}, "video input .*'video_url'"),
    ({"type": "file", "file": {}}, "unsupported content part type 'file'"),
    ({"text": "no type"}, "must be an object with a 'type'"),
    ({"type": "text", "text": 3}, r"content\[1\]\.text must be a string"),
])
@pytest.mark.parametrize("role", ["system", "user", "assistant", "tool"])
def test_non_text_parts_are_refused_by_name(role, part, named):
    message = {"role": role, "content": [_text("look:"), part]}
    with pytest.raises(ChatTemplateError, match=r"messages\[1\]\.content\[1\]"):
        fit_messages([{"role": "user", "content": "hi"}, message], STRING_ONLY, "")
    with pytest.raises(ChatTemplateError, match=named):
        fit_messages([{"role": "user", "content": "hi"}, message], STRING_ONLY, "")


def test_null_content_is_an_empty_string_and_tool_calls_need_no_content():
    calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    fitted = fit_messages([{"role": "user", "content": None}, {"role": "assistant", "tool_calls": calls}],
                          STRING_ONLY, "")
    assert [m["content"] for m in fitted] == ["", ""] and fitted[1]["tool_calls"] == calls
    with pytest.raises(ChatTemplateError, match="has no content"):
        fit_messages([{"role": "user"}], STRING_ONLY, "")


def test_developer_is_system_except_for_gpt_oss_templates():
    messages = [{"role": "developer", "content": "d"}, {"role": "user", "content": "u"}]
    assert fit_messages(messages, STRING_ONLY, "")[0]["role"] == "system"
    assert fit_messages(messages, STRING_ONLY, "<|channel|>")[0]["role"] == "developer"


def test_system_merges_into_the_next_message_without_a_system_role():
    messages = [{"role": "system", "content": [_text("s1"), _text("s2")]}, {"role": "user", "content": "u"},
                {"role": "system", "content": "later"}]
    assert fit_messages(messages, NO_SYSTEM, "") == [{"role": "user", "content": "s1\ns2\nu"},
                                                     {"role": "system", "content": "later"}]
    assert fit_messages(messages[:1], NO_SYSTEM, "") == []
    assert fit_messages(messages, STRING_ONLY, "")[0]["role"] == "system"


@pytest.mark.parametrize(("source", "caps"), [
    (CHATML_TEMPLATE, STRING_ONLY),
    ("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
     "{% for m in messages %}{{ m.content }}{% endfor %}", TemplateCaps(supports_system_role=False)),
    ("{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}",
     TemplateCaps(supports_system_role=False)),
    ("{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
     "{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}{% endfor %}", BOTH),
    ("{% for m in messages %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endfor %}", TYPED_ONLY),
    ("{% for m in messages %}{{ m.content[0].text }}{% endfor %}", TYPED_ONLY),
])
def test_capabilities_are_probed_by_what_the_template_reads(source, caps):
    assert ChatTemplate(source).caps == caps


def test_a_typed_only_template_renders_string_content_as_one_part():
    template = ChatTemplate("{% for m in messages %}{% for p in m.content %}<{{ p.text }}>{% endfor %}{% endfor %}")
    assert template.render([{"role": "user", "content": "hi"}], add_generation_prompt=False) == "<hi>"
