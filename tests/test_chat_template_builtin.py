"""llama-server's built-in chat template names (`--chat-template gemma`) give its exact prompts.

The expected texts are llama.cpp's own: those of tests/test-chat-template.cpp (llama-cpp-python
0.3.36's vendored llama.cpp, the peer) where it has the name, else derived from
`llm_chat_apply_template` in src/llama-chat.cpp by hand (and checked against that C++ compiled
alone, on thousands of random conversations, when this was written). The conversation is the one
those llama.cpp tests use: a system message, and an assistant answer padded with spaces, which
shows which formats trim.
"""

from __future__ import annotations

import pytest
import torch
from starlette.testclient import TestClient

from slotserver.cli import main as cli
from slotserver.model.config import ConfigError
from slotserver.model.text.builtin_templates import BUILTIN_NAMES, apply_builtin
from slotserver.model.text.chat_template import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError
from slotserver.server import ServerConfig, ServerState, create_app
from slotserver.server.launch import load
from slotserver.server.config_from_args import chat_template_source, plan_from_args
from tiny_gguf import write_tiny_gguf

# LLM_CHAT_TEMPLATES in src/llama-chat.cpp, in its std::map's (byte) order.
LLAMA_CPP_NAMES = (
    "bailing", "bailing-think", "bailing2", "chatglm3", "chatglm4", "chatml", "command-r", "deepseek",
    "deepseek-ocr", "deepseek2", "deepseek3", "exaone-moe", "exaone3", "exaone4", "falcon3", "gemma",
    "gigachat", "glmedge", "gpt-oss", "granite", "granite-4.0", "granite-4.1", "grok-2", "hunyuan-dense",
    "hunyuan-moe", "hunyuan-vl", "kimi-k2", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip",
    "llama3", "llama4", "megrez", "minicpm", "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7",
    "mistral-v7-tekken", "monarch", "openchat", "orion", "pangu-embedded", "phi3", "phi4", "rwkv-world",
    "seed_oss", "smolvlm", "solar-open", "vicuna", "vicuna-orca", "yandex", "zephyr",
)

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
    {"role": "assistant", "content": "   I am an assistant   "},
    {"role": "user", "content": "Another question"},
]

EXPECTED = {   # with the generation prompt (add_ass = true)
    "gemma": "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there"
             "<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant"
             "<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n",
    "llama2": "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an "
              "assistant   </s>[INST] Another question [/INST]",
    "llama2-sys": "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] "
                  "Who are you "
                  "[/INST]   I am an assistant   </s>[INST] Another question [/INST]",
    "mistral-v3": "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an "
                  "assistant</s>[INST] Another question[/INST]",
    "mistral-v7": "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>"
                  "[INST] Who "
                  "are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]",
    "phi3": "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n"
            "<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question"
            "<|end|>\n<|assistant|>\n",
    "phi4": "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|>"
            "<|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|>"
            "<|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another "
            "question<|im_end|><|im_start|>assistant<|im_sep|>",
    "zephyr": "<|system|>\nYou are a helpful assistant<|endoftext|>\n<|user|>\nHello<|endoftext|>\n<|assistant|>\nHi "
              "there<|endoftext|>\n<|user|>\nWho are you<|endoftext|>\n<|assistant|>\n   I am an assistant   "
              "<|endoftext|>\n<|user|>\nAnother question<|endoftext|>\n<|assistant|>\n",
    "deepseek3": "You are a helpful assistant\n\n<｜User｜>Hello<｜Assistant｜>Hi there<｜end▁of▁sentence｜><｜User｜>Who are "
                 "you<｜Assistant｜>   I am an assistant   <｜end▁of▁sentence｜><｜User｜>Another question<｜Assistant｜>",
    "command-r": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
                 "Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
                 "<|USER_TOKEN|>Another question<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    "vicuna": "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    I "
              "am an assistant   </s>\nUSER: Another question\nASSISTANT:",
    "granite": "<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n<|start_of_role|>user"
               "<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there<|end_of_text|>\n"
               "<|start_of_role|>user<|end_of_role|>Who are you<|end_of_text|>\n<|start_of_role|>assistant"
               "<|end_of_role|>   I am an assistant   <|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another "
               "question<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
    "gpt-oss": "<|start|>system<|message|>You are a helpful assistant<|end|><|start|>user<|message|>Hello<|end|>"
               "<|start|>"
               "assistant<|message|>Hi there<|return|><|start|>user<|message|>Who are you<|end|><|start|>assistant"
               "<|message|>   I am an assistant   <|return|><|start|>user<|message|>Another question<|end|><|start|>"
               "assistant",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
              "<|start_header_id|>user"
              "<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant"
              "<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother "
              "question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "rwkv-world": "System: You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there\n\nUser: Who are you\n\n"
                  "Assistant: I am an assistant\n\nUser: Another question\n\nAssistant:",
    "kimi-k2": "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|><|im_user|>user<|im_middle|>Hello"
               "<|im_end|><|im_assistant|>assistant<|im_middle|>Hi there<|im_end|><|im_user|>user<|im_middle|>Who are "
               "you<|im_end|><|im_assistant|>assistant<|im_middle|>   I am an assistant   <|im_end|><|im_user|>user"
               "<|im_middle|>Another question<|im_end|><|im_assistant|>assistant<|im_middle|>",
}


def test_the_names_are_llama_cpps_in_its_order():
    """--help lists them, and an unknown name's error too: the same set and order as the peer's."""
    assert BUILTIN_NAMES == LLAMA_CPP_NAMES


@pytest.mark.parametrize("name", LLAMA_CPP_NAMES)
def test_every_name_renders_a_whole_conversation(name):
    """No format drops a user or assistant turn, or fails on the system + 3 turns conversation."""
    prompt = ChatTemplate(name).render(CONVERSATION)
    for text in ("Hello", "Hi there", "Who are you", "I am an assistant", "Another question"):
        assert text in prompt, (name, text, prompt)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_text_is_llama_cpps(name):
    assert ChatTemplate(name).render(CONVERSATION) == EXPECTED[name]


@pytest.mark.parametrize("name, tail", [("gemma", "<start_of_turn>model\n"), ("phi3", "<|assistant|>\n"),
                                        ("gpt-oss", "<|start|>assistant")])
def test_the_generation_prompt_is_added_only_when_asked(name, tail):
    with_prompt = ChatTemplate(name).render(CONVERSATION, add_generation_prompt=True)
    without = ChatTemplate(name).render(CONVERSATION, add_generation_prompt=False)
    assert with_prompt == without + tail


def test_formats_without_a_generation_prompt_end_the_same_either_way():
    """llama 2 and Mistral v7 have no add_ass branch: the user turn already ends in the cue."""
    for name in ("llama2", "mistral-v7", "orion"):
        assert ChatTemplate(name).render(CONVERSATION, add_generation_prompt=False) == \
            ChatTemplate(name).render(CONVERSATION)


def test_gemma_joins_system_texts_into_the_next_user_turn_only():
    """Two system messages are trimmed and joined without a separator; a model turn in between
    does not take them, the next user turn does."""
    chat = [("system", " A "), ("system", "B\n"), ("assistant", "hi"), ("user", "q")]
    assert apply_builtin("gemma", chat, False) == \
        "<start_of_turn>model\nhi<end_of_turn>\n<start_of_turn>user\nAB\n\nq<end_of_turn>\n"


def test_trimming_is_the_c_locales_ascii_whitespace():
    """llama-chat.cpp's trim uses isspace on bytes: a no-break or ideographic space stays."""
    prompt = apply_builtin("gemma", [("user", "\u00a0hi\u3000\t\r\n")], False)
    assert prompt == "<start_of_turn>user\n\u00a0hi\u3000<end_of_turn>\n"


def test_capitals_are_ascii_only_as_c_toupper():
    """Bailing upper-cases roles and OpenChat the role's first byte, with C's toupper: 'ß' stays."""
    assert apply_builtin("bailing", [("ßtool", "x")], False) == "<role>ßTOOL</role>x"
    assert apply_builtin("openchat", [("ébauche", "x"), ("user", "y")], False) == \
        "GPT4 Correct ébauche: x<|end_of_turn|>GPT4 Correct User: y<|end_of_turn|>"


def test_llama2_variants_differ_where_llama_cpp_says():
    chat = [("user", " a "), ("assistant", "b"), ("user", "c")]
    assert apply_builtin("llama2-sys-bos", chat) == "[INST]  a  [/INST]b</s><s>[INST] c [/INST]"
    assert apply_builtin("llama2-sys-strip", chat) == "[INST] a [/INST]b</s>[INST] c [/INST]"
    assert apply_builtin("mistral-v1", chat) == " [INST]  a  [/INST] b</s> [INST] c [/INST]"


def test_parts_are_joined_and_roles_kept_as_sent():
    """llama-server's legacy route: text parts joined by newlines; `developer` is not mapped to
    `system` (only its Jinja route does that)."""
    messages = [{"role": "developer", "content": "d"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert ChatTemplate("phi3").render(messages) == "<|developer|>\nd<|end|>\n<|user|>\na\nb<|end|>\n<|assistant|>\n"


def test_no_bos_text_is_cut_from_a_builtin_format():
    """The legacy route cuts nothing: GigaChat writes `<s>` even where the tokenizer adds BOS."""
    template = ChatTemplate("gigachat", bos_token="<s>", eos_token="</s>", add_bos=True)
    assert template.render([{"role": "user", "content": "hi"}]).startswith("<s>user<|role_sep|>hi")


@pytest.mark.parametrize("messages", [[], [{"role": "user"}], [{"content": "x"}], "hi"])
def test_bad_messages_are_one_line_template_errors(messages):
    with pytest.raises(ChatTemplateError):
        ChatTemplate("gemma").render(messages)


def test_the_flag_takes_every_name_and_keeps_chatml_as_jinja():
    """chatml stays the Jinja template llama-server compiles for that name; other names stay names."""
    assert chat_template_source("chatml", None) == CHATML_TEMPLATE
    assert [chat_template_source(n, None) for n in ("gemma", "llama3", "gpt-oss")] == ["gemma", "llama3", "gpt-oss"]


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ConfigError) as e:
        chat_template_source("gemma4", None)
    assert "neither a known name" in str(e.value) and all(n in str(e.value) for n in ("gemma", "mistral-v7", "zephyr"))


def test_serve_with_chat_template_gemma_answers_gemmas_prompt(tmp_path):
    """The report: a GGUF without a template (gemma-3-270m's case) served with `--chat-template
    gemma` gets gemma's turns from /apply-template, and /props shows the name, as llama-server."""
    path = write_tiny_gguf(tmp_path / "bare.gguf", **{"tokenizer.chat_template": None})
    args = cli.build_parser().parse_args(["serve", "-m", str(path), "-t", "1", "-c", "64", "-np", "1",
                                          "--no-warmup", "--no-watch", "--chat-template", "gemma"])
    state, threads = ServerState(ServerConfig(model_path=str(path))), torch.get_num_threads()
    try:
        load(state, plan_from_args(args), "http://test")
    finally:
        torch.set_num_threads(threads)
    with TestClient(create_app(state)) as client:
        r = client.post("/apply-template", json={"messages": CONVERSATION})
        assert r.status_code == 200, r.text
        assert r.json()["prompt"] == EXPECTED["gemma"]
        assert client.get("/props").json()["chat_template"] == "gemma"
