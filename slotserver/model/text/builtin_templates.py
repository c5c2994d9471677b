"""llama-server's built-in chat templates by name (`--chat-template gemma`), written as it writes them.

llama.cpp knows ~55 template names (`LLM_CHAT_TEMPLATES` in src/llama-chat.cpp). Given one with
`--chat-template`, llama-server without Jinja formats chats with `llm_chat_apply_template`: C++
that writes each format by hand, not a Jinja template. (With its default `--jinja` the name would
be compiled as Jinja source and every prompt would be the name itself: that is not copied.) So
that `/apply-template` and every chat prompt match the peer's, each name here is that C++
transcribed: the per-role ones as a table (builtin_template_table.py), the ones that carry state
across messages (turns that open and close, system prompts merged into the next user turn) as the
functions below. llama.cpp reference: the llama-cpp-python 0.3.36 vendored copy.

What the C++ does and this keeps: roles are written as sent (no developer -> system mapping, no
merging of unknown roles), only what each branch trims is trimmed, no BOS/EOS text is added or cut
but what the format itself writes (GigaChat's `<s>`), and `add_ass` (the generation prompt) is
ignored by the formats that have none (llama 2, Mistral, Orion, RWKV...).
"""

from __future__ import annotations

from typing import Callable

from slotserver.errors import ChatTemplateError
from slotserver.model.text.builtin_template_table import TURNS, trim

Chat = list[tuple[str, str]]   # (role, content) pairs, as llm_chat_apply_template takes them
Format = Callable[[Chat, bool], str]


def _llama2(system_tags: bool, bos_inside: bool = False, strip: bool = False) -> Format:
    """Llama 2 and variants: one `[INST]` turn until an assistant message closes it with `</s>`;
    a system message goes in `<<SYS>>` tags, or as a plain line for the base variant."""
    def apply(chat: Chat, add_ass: bool) -> str:
        out, inside = ["[INST] "], True
        for role, content in chat:
            content = trim(content) if strip else content
            if not inside:
                out.append("<s>[INST] " if bos_inside else "[INST] ")
                inside = True
            if role == "system":
                out.append(f"<<SYS>>\n{content}\n<</SYS>>\n\n" if system_tags else content + "\n")
            elif role == "user":
                out.append(content + " [/INST]")
            else:
                out.append(content + "</s>")
                inside = False
        return "".join(out)
    return apply


def _mistral(lead: str, trail: str, trim_assistant: bool) -> Format:
    """Mistral v1 / v3 / v3-tekken: `[INST]` opens a turn, system text joins it, an assistant
    message ends it with `</s>`; the spaces around the tags are what tell the versions apart."""
    def apply(chat: Chat, add_ass: bool) -> str:
        out, inside = [], False
        for role, content in chat:
            if not inside:
                out.append(f"{lead}[INST]{trail}")
                inside = True
            if role == "system":
                out.append(content + "\n\n")
            elif role == "user":
                out.append(f"{content}{lead}[/INST]")
            else:
                out.append(trail + (trim(content) if trim_assistant else content) + "</s>")
                inside = False
        return "".join(out)
    return apply


def _gemma(chat: Chat, add_ass: bool) -> str:
    """Gemma has no system turn: system texts (trimmed, joined without separator) open the next
    non-model turn; `assistant` is written `model`."""
    out, system = [], ""
    for role, content in chat:
        if role == "system":
            system += trim(content)
            continue
        role = "model" if role == "assistant" else role
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(trim(content) + "<end_of_turn>\n")
    if add_ass:
        out.append("<start_of_turn>model\n")
    return "".join(out)


def _orion(chat: Chat, add_ass: bool) -> str:
    """Orion: system texts (untrimmed) are put before the next user message; every user turn
    already ends with the assistant's cue, so there is no generation prompt to add."""
    out, system = [], ""
    for role, content in chat:
        if role == "system":
            system += content
        elif role == "user":
            out.append("Human: " + (system + "\n\n" if system else ""))
            system = ""
            out.append(content + "\n\nAssistant: </s>")
        else:
            out.append(content + "</s>")
    return "".join(out)


def _rwkv_world(chat: Chat, add_ass: bool) -> str:
    """RWKV World: the cue `Assistant:` follows a user message only when it is the last one,
    whatever `add_ass` says."""
    out = []
    for i, (role, content) in enumerate(chat):
        if role == "system":
            out.append(f"System: {trim(content)}\n\n")
        elif role == "user":
            out.append(f"User: {trim(content)}\n\n" + ("Assistant:" if i == len(chat) - 1 else ""))
        elif role == "assistant":
            out.append(f"Assistant: {trim(content)}\n\n")
    return "".join(out)


def _monarch(chat: Chat, add_ass: bool) -> str:
    """AlphaMonarch: `<s>` inside the history, before every message but the first."""
    out = [f"{'<s>' if i else ''}{role}\n{content}</s>\n" for i, (role, content) in enumerate(chat)]
    return "".join(out) + ("<s>assistant\n" if add_ass else "")


FUNCTIONS: dict[str, Format] = {
    "llama2": _llama2(system_tags=False),
    "llama2-sys": _llama2(system_tags=True),
    "llama2-sys-bos": _llama2(system_tags=True, bos_inside=True),
    "llama2-sys-strip": _llama2(system_tags=True, strip=True),
    "mistral-v1": _mistral(" ", " ", trim_assistant=False),
    "mistral-v3": _mistral("", " ", trim_assistant=True),
    "mistral-v3-tekken": _mistral("", "", trim_assistant=False),
    "gemma": _gemma,
    "orion": _orion,
    "rwkv-world": _rwkv_world,
    "monarch": _monarch,
}

# In llama.cpp's order (a std::map: sorted by bytes), as its --help lists them.
BUILTIN_NAMES: tuple[str, ...] = tuple(sorted([*TURNS, *FUNCTIONS], key=lambda n: n.encode()))


def is_builtin(name: object) -> bool:
    """`name` is one of llama.cpp's built-in template names (exactly: no case folding, as its map)."""
    return isinstance(name, str) and (name in TURNS or name in FUNCTIONS)


def apply_builtin(name: str, chat: Chat, add_ass: bool = True) -> str:
    """llm_chat_apply_template(name): the prompt for `chat`, a non-empty list of (role, content)."""
    if not chat:   # the Jinja templates render an empty chat (llama-server's permissive /v1/messages); these need one
        raise ChatTemplateError(f"the built-in chat template {name!r} needs at least one message")
    if name in FUNCTIONS:
        return FUNCTIONS[name](chat, add_ass)
    if name in TURNS:
        return TURNS[name].apply(chat, add_ass)
    raise KeyError(f"unknown built-in chat template {name!r}; known: {', '.join(BUILTIN_NAMES)}")
