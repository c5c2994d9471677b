"""Chat templates render the model's prompt format and fail with clear, single-line errors."""

from __future__ import annotations

import pytest

from slotserver.model.text.chat_template import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError
from slotserver.model.text.tokenizer import Tokenizer

_SMOL_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n"
)


@pytest.fixture(scope="module")
def smol_template(smollm_metadata) -> ChatTemplate:
    return ChatTemplate.from_metadata(smollm_metadata, Tokenizer.from_metadata(smollm_metadata))


def test_default_model_template_with_generation_prompt(smol_template):
    prompt = smol_template.render([{"role": "user", "content": "What is 2+2?"}])
    assert prompt == (
        _SMOL_SYSTEM + "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_default_model_template_without_generation_prompt(smol_template):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    assert smol_template.render(messages, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n")


def test_default_model_bos_and_eos_texts(smol_template):
    assert smol_template.from_model and not smol_template.add_bos
    assert smol_template.bos_token == "<|im_start|>"
    assert smol_template.eos_token == "<|im_end|>"


def test_content_parts_are_joined(smol_template):
    content = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    prompt = smol_template.render([{"role": "user", "content": content}])
    assert "<|im_start|>user\nfirst\nsecond<|im_end|>\n" in prompt


def test_model_without_template_falls_back_to_chatml(smollm_metadata):
    md = {k: v for k, v in smollm_metadata.items() if k != "tokenizer.chat_template"}
    template = ChatTemplate.from_metadata(md, Tokenizer.from_metadata(smollm_metadata))
    assert template.source == CHATML_TEMPLATE and not template.from_model
    assert template.render([{"role": "user", "content": "Hi"}]) == \
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_another_source_keeps_the_models_tokens_and_bos_rule():
    model = ChatTemplate("{{ bos_token }}x", bos_token="<s>", eos_token="</s>", add_bos=True, from_model=False)
    other = model.with_source("{{ bos_token }}y{{ eos_token }}")
    assert (other.bos_token, other.eos_token, other.add_bos, other.from_model) == ("<s>", "</s>", True, True)
    assert other.render([{"role": "user", "content": "hi"}]) == "y</s>"   # leading BOS cut: encode adds it


def test_bos_eos_extra_variables_and_tojson_are_available():
    template = ChatTemplate(
        "{{ bos_token }}{{ messages[0]['content'] | tojson }}{{ tools | length }}{{ eos_token }}",
        bos_token="<s>", eos_token="</s>")
    rendered = template.render([{"role": "user", "content": "<b> & 'é'"}], tools=[1, 2])
    assert rendered == "<s>\"<b> & 'é'\"2</s>"  # no HTML escaping, no ASCII escaping


def test_syntax_error_is_reported_at_construction_with_its_line():
    with pytest.raises(ChatTemplateError, match="syntax error at line 2"):
        ChatTemplate("{{ messages }}\n{% for m in messages %}{{ m }")


def test_template_raise_exception_surfaces_its_message():
    template = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}\n"
        "{{ raise_exception('Conversations must start with a user message') }}\n"
        "{% endif %}")
    with pytest.raises(ChatTemplateError, match="must start with a user message") as info:
        template.render([{"role": "assistant", "content": "hi"}])
    assert "line 2" in str(info.value)


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__mro__ }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ messages.append({'role': 'x'}) }}",  # the sandbox is immutable
])
def test_sandbox_escapes_are_refused(source):
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])


def test_runtime_errors_become_single_line_template_errors():
    template = ChatTemplate("ok\n{{ messages[0]['content'] + 5 }}")
    with pytest.raises(ChatTemplateError, match="at line 2") as info:
        template.render([{"role": "user", "content": "hi"}])
    assert "\n" not in str(info.value)


def test_undefined_values_chain_as_in_llama_cpps_jinja():
    """`x.missing.deeper` and `messages[5].role` are undefined (""), not errors, as llama.cpp's
    runtime has them (gemma 2's template reads messages[0] of a conversation left empty)."""
    template = ChatTemplate("[{{ messages[0]['content'].missing.deeper }}|{{ messages[5].role }}]")
    assert template.render([{"role": "user", "content": "hi"}]) == "[|]"


@pytest.mark.parametrize(("messages", "complaint"), [
    ("hello", "must be a list"),
    (["hello"], r"messages\[0\] must be an object"),
    ([{"content": "hi"}], r"messages\[0\].role"),
    ([{"role": 3, "content": "hi"}], r"messages\[0\].role"),
    ([{"role": "user"}], "has no content"),
    ([{"role": "user", "content": 42}], "string or a list of text parts"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "image_url"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}], r"text must be a string"),
])
def test_bad_messages_are_rejected(smol_template, messages, complaint):
    with pytest.raises(ChatTemplateError, match=complaint):
        smol_template.render(messages)


def test_render_does_not_modify_the_callers_messages(smol_template):
    content = [{"type": "text", "text": "hi"}]
    messages = [{"role": "user", "content": content}]
    smol_template.render(messages)
    assert messages == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
